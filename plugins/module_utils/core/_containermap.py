# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The container map: which captured container is restored into which destination container.

One syntax everywhere a map is written - the ``into`` option of ``restore``, the pod contract's
``restore-container-map`` annotation, ``restore_pod``'s ``container_map``:

- ``"src=dst,src2=dst2"``, or a list of ``"src=dst"`` strings, ``[src, dst]`` pairs or
  ``{src: ..., dst: ...}`` dicts, or a mapping ``{src: dst}`` / ``{src: [dst, ...]}``;
- one source may fan out to several destinations; a destination appears once;
- where the snapshot's containers are known (``sources``) a bare ``dst`` means its only container,
  and every source must be one of them.

``read`` returns the pairs in the given order and every problem at once; callers raise their own
error (``ContractError`` for a pod, ``SnapshotError`` for ``into``) with all of them.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

Pair = Tuple[str, str]
# (the text of the entry, as written, for messages; its source; its destination)
_Entry = Tuple[str, Any, Any]


def read(value: Any, sources: Optional[Sequence[str]] = None,
         is_name: Optional[Callable[[Any], bool]] = None, name_rule: str = "a valid container name"
         ) -> Tuple[List[Pair], List[str]]:
    """``(pairs, problems)`` of a container map in any accepted shape (``None`` is the empty map).

    ``sources``: the snapshot's containers (a bare ``dst`` then means the only one, and each source must be
    one of them); ``is_name``: a check every name must pass, described by ``name_rule`` in its problem.
    """
    if value is None:
        return [], []
    problems: List[str] = []
    entries = _entries(value, sources, problems)
    return _pairs(entries, sources, is_name, name_rule, problems), problems


def format_map(pairs: Iterable[Pair]) -> str:
    """The canonical text of a map: ``src=dst`` entries sorted, joined by ','."""
    return ",".join(f"{src}={dst}" for src, dst in sorted(pairs))


def _entries(value: Any, sources: Optional[Sequence[str]], problems: List[str]) -> List[_Entry]:
    """The (text, src, dst) entries of a map in any accepted shape; shape problems go to ``problems``."""
    raw: List[_Entry] = []
    if isinstance(value, str):
        if value.strip():
            for part in value.split(","):
                if not part.strip():
                    problems.append(f"container map {value!r} has an empty entry")
                else:
                    _text_entry(part.strip(), sources, raw, problems)
    elif isinstance(value, dict):
        for src, dsts in value.items():
            for dst in (dsts if isinstance(dsts, list) else [dsts]):
                raw.append((f"{src}={dst}", src, dst))
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, str):
                _text_entry(item.strip(), sources, raw, problems)
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                raw.append((f"{item[0]}={item[1]}", item[0], item[1]))
            elif isinstance(item, dict) and set(item) == {"src", "dst"}:
                raw.append((f"{item['src']}={item['dst']}", item["src"], item["dst"]))
            else:
                problems.append(f"container map entry {item!r} is neither 'src=dst', a [src, dst] pair nor {{src, dst}}")
    else:
        problems.append(f"container map must be a string, list or mapping, not {type(value).__name__}")
    return raw


def _text_entry(text: str, sources: Optional[Sequence[str]], raw: List[_Entry], problems: List[str]) -> None:
    src, sep, dst = text.partition("=")
    if sep:
        raw.append((text, src.strip(), dst.strip()))
    elif sources is not None and len(sources) == 1:
        raw.append((text, sources[0], text))
    elif sources is not None:
        problems.append(f"container map entry {text!r} names no source container, and the snapshot holds "
                        f"{len(sources)} ({', '.join(sources)}): write src=dst")
    else:
        problems.append(f"container map entry {text!r} is not of the form src=dst")


def _pairs(raw: List[_Entry], sources: Optional[Sequence[str]], is_name: Optional[Callable[[Any], bool]],
           name_rule: str, problems: List[str]) -> List[Pair]:
    """The entries whose source and destination are good names (and a known source), each destination once."""
    pairs: List[Pair] = []
    seen: Dict[Any, Any] = {}
    for text, src, dst in raw:
        bad = False
        for role, name in (("source", src), ("destination", dst)):
            if name is None or not str(name).strip():
                problems.append(f"container map entry {text!r} has an empty {role}")
                bad = True
            elif is_name is not None and not is_name(name):
                problems.append(f"container map entry {text!r}: {role} {name!r} is not {name_rule}")
                bad = True
        if not bad and sources is not None and src not in sources:
            problems.append(f"container map entry {text!r}: the snapshot holds no container {src!r} "
                            f"(it holds {', '.join(sources) or 'none'})")
            bad = True
        if bad:
            continue
        if dst in seen:
            problems.append(f"container map entry {text!r}: destination {dst!r} already receives {seen[dst]!r}")
            continue
        seen[dst] = src
        pairs.append((str(src), str(dst)))
    return pairs
