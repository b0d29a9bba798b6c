# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Version strings as tuples of ints: kernel releases, CRIU and driver versions.

Only the leading dotted numeric part counts: "6.18.44-fc-v1045" -> (6, 18, 44),
"5.12" -> (5, 12), "v4.2.1" -> (4, 2, 1). Missing trailing parts compare as 0,
so "5.12" == "5.12.0".
"""
from __future__ import annotations

import re
from typing import Tuple

_LEADING = re.compile(r"\s*[vV]?(\d+(?:\.\d+)*)")

Version = Tuple[int, ...]


def parse_version(text: str) -> Version:
    """Return the leading numeric components of ``text``.

    Raises ValueError when ``text`` does not start with a number.
    """
    match = _LEADING.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a version string: {text!r} (expected e.g. '5.12' or '6.8.0-45-generic')")
    return tuple(int(part) for part in match.group(1).split("."))


def compare_versions(left: str, right: str) -> int:
    """Return -1, 0 or 1 as ``left`` is older than, equal to or newer than ``right``."""
    a, b = parse_version(left), parse_version(right)
    width = max(len(a), len(b))
    a += (0,) * (width - len(a))
    b += (0,) * (width - len(b))
    return (a > b) - (a < b)


def version_at_least(actual: str, minimum: str) -> bool:
    """True when ``actual`` is ``minimum`` or newer."""
    return compare_versions(actual, minimum) >= 0
