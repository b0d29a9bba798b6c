# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The snapshot_info module's runner: list, filter, verify, query a store; the same in check mode.

Keeps the runners' invariants (``_common``); it only reads.
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _info as inf
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result


def run(p: Params, check_mode: bool) -> Result:  # pylint: disable=unused-argument  # reads only
    """List, filter, verify, query; the same in check mode."""
    common.refuse_empty(p, "name")
    return inf.snapshot_info(common.store_from(p), name=p["name"], labels=p["labels"], details=p["details"],
                             verify=p["verify"], query=p["query"])
