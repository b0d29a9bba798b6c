# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Durations: the one type every module option that is a length of time takes.

Seconds (an int or a float), or a string: ``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``, or a sum such as
``1d12h``. Every duration a module returns is float seconds. ``OPTIONS`` names the module options that are
durations; the runners' adapter turns them into float seconds before any runner sees them.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Union

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*")

Duration = Union[None, int, float, str]

# Every module option that is a duration (the same name is a duration in every module that has it).
OPTIONS = frozenset({
    "timeout", "ready_timeout", "cuda_lock_timeout", "running_timeout", "wait_timeout", "attempt_timeout",
    "lazy_timeout", "stop_timeout", "request_timeout", "max_age", "incomplete_older_than", "last_access_timeout",
})


class DurationError(WarmstartError, ValueError):
    """A duration that cannot be used; the message names the option and says why."""


def parse_duration(value: Duration, what: str = "duration") -> Optional[float]:
    """Seconds from an int/float or a string such as ``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``, ``1d12h``.

    None and the empty string mean "not set" and give None.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise DurationError(f"{what}: {value!r} is a boolean, not a duration (use e.g. 3600, '90s', '30m', '12h', '7d')")
    if isinstance(value, (int, float)):
        if value < 0:
            raise DurationError(f"{what}: {value!r} is negative; a duration is 0 or more seconds")
        return float(value)
    if not isinstance(value, str):
        raise DurationError(f"{what}: {value!r} is a {type(value).__name__}, not a duration "
                            "(use seconds or a string like '90s', '30m', '12h', '7d')")
    text = value.strip().lower()
    if not text:
        return None
    if text.startswith("-"):
        raise DurationError(f"{what}: {value!r} is negative; a duration is 0 or more seconds")
    pos = 0
    total = 0.0
    seen: List[str] = []
    for match in _PART_RE.finditer(text):
        if match.start() != pos:
            break
        number, unit = match.group(1), match.group(2) or "s"
        if unit not in _UNITS:
            raise DurationError(f"{what}: unknown unit {match.group(2)!r} in {value!r} "
                                "(units: s = seconds, m = minutes, h = hours, d = days, w = weeks)")
        if unit in seen:
            raise DurationError(f"{what}: unit {unit!r} appears twice in {value!r}")
        if not match.group(2) and (seen or match.end() != len(text)):
            raise DurationError(f"{what}: {value!r} mixes a number without a unit with other parts "
                                "(write e.g. '1d12h' or plain seconds such as '3600')")
        seen.append(unit)
        total += float(number) * _UNITS[unit]
        pos = match.end()
    if pos != len(text) or not seen:
        raise DurationError(f"{what}: {value!r} is not a duration (use seconds or a number with a unit: "
                            "'90s', '30m', '12h', '7d', '2w', or a sum such as '1d12h')")
    return total


def format_duration(seconds: float) -> str:
    """Short human form: ``8d2h``, ``45m``, ``12s``."""
    rest = int(round(max(seconds, 0)))
    if rest == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts[:2])


def options_in_seconds(params: Mapping[str, Any]) -> Dict[str, Any]:
    """``params`` with each duration option (``OPTIONS``) that is set as float seconds; DurationError naming the
    first one that is no duration."""
    out = dict(params)
    for name in OPTIONS & out.keys():
        if isinstance(out[name], str) and not out[name].strip():
            # "not set" here would override the option's default with None: say what to do instead
            raise DurationError(f"{name}: an empty string is no duration; omit the option for its default, or give "
                                "seconds or a number with a unit ('90s', '30m', '12h', '7d')")
        if out[name] is not None:
            out[name] = parse_duration(out[name], name)
    return out
