# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cleanup module's runner: the retention policy checked first, then applied (check mode: measured only).

Keeps the runners' invariants (``_common``): the policy and the options are refused before anything is removed.
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _cleanup as cln
from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result


def run(p: Params, check_mode: bool) -> Result:
    """The retention policy checked first, then applied (check mode: measured only)."""
    pol = ret.policy(keep_last=p["keep_last"], max_age=p["max_age"],
                     incomplete_older_than=p["incomplete_older_than"], group_by=p["group_by"],
                     name=p["name"], labels=p["labels"], remove_broken=p["remove_broken"])
    common.refuse_empty(p, "name", "snapshot_ids")
    return cln.cleanup(common.store_from(p), pol, snapshot_ids=p.get("snapshot_ids") or [],
                       restore_root=p["restore_root"], prune_node_cache=bool(p.get("prune_node_cache")),
                       check_mode=check_mode)
