# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-host summaries of the fleet playbooks."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence


def fleet_rows(hosts: Sequence[str], hostvars: Any) -> List[Dict[str, Any]]:
    rows = []
    for host in hosts:
        try:
            row = hostvars[host].get("warmstart__row")
        except (KeyError, AttributeError):
            row = None
        if isinstance(row, dict) and row:
            rows.append(dict(row, host=host))
        else:
            rows.append({"host": host, "result": "unreachable", "detail": "no result: unreachable or failed earlier"})
    return rows


def _human(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def fleet_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> List[str]:
    """Rows as an aligned text table (a list of lines, for ansible.builtin.debug)."""
    cells = [[str(c) for c in columns]] + [[_human(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"fleet_rows": fleet_rows, "fleet_table": fleet_table}
