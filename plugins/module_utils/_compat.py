# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Node description recorded in snapshots, and the restore compatibility check."""
from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils._criu import criu_version, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils._node import read_cpuinfo, read_os_release
from ansible_collections.warmstart.snapshot.plugins.module_utils._version import compare_versions


def describe_node(criu_path: Optional[str] = None) -> Dict[str, Any]:
    """What a snapshot records about its source node (and what a target offers)."""
    uname = os.uname()
    cpu = read_cpuinfo()
    path = find_criu(criu_path)
    os_info = read_os_release()
    return {
        "hostname": socket.gethostname(),
        "arch": uname.machine,
        "kernel": uname.release,
        "cpu_vendor": cpu.vendor,
        "cpu_model": cpu.model,
        "cpu_flags": list(cpu.flags),
        "cpu_flags_hash": cpu.flags_hash,
        "criu_version": criu_version(path)["version"] if path else None,
        "os_id": os_info.get("id"),
        "os_version_id": os_info.get("version_id"),
    }


def _older(have: Optional[str], need: Optional[str]) -> bool:
    if not have or not need:
        return False
    try:
        return compare_versions(have, need) < 0
    except ValueError:
        return have != need


def incompatibilities(source: Dict[str, Any], target: Dict[str, Any]) -> List[str]:
    """Every reason ``target`` cannot restore a snapshot taken on ``source`` (empty = compatible)."""
    reasons = []
    if source.get("arch") != target.get("arch"):
        reasons.append(f"architecture: snapshot is {source.get('arch')}, this node is {target.get('arch')}")
    if _older(target.get("kernel"), source.get("kernel")):
        reasons.append(f"kernel: this node runs {target.get('kernel')}, older than the source's {source.get('kernel')}")
    if not target.get("criu_version"):
        reasons.append("criu: no CRIU on this node")
    elif _older(target.get("criu_version"), source.get("criu_version")):
        reasons.append(f"criu: this node has {target.get('criu_version')}, older than the source's {source.get('criu_version')}")
    if source.get("cpu_vendor") and source.get("cpu_vendor") != target.get("cpu_vendor"):
        reasons.append(f"cpu vendor: snapshot is {source.get('cpu_vendor')}, this node is {target.get('cpu_vendor')}")
    missing = sorted(set(source.get("cpu_flags") or []) - set(target.get("cpu_flags") or []))
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        reasons.append(f"cpu flags: this node lacks {shown}")
    return reasons
