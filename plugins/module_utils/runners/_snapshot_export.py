# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The snapshot_export module's runner: a container snapshot as a checkpoint archive podman restores.

Keeps the runners' invariants (``_common``); ``changed`` is false when ``path`` already holds this snapshot's
export (unless ``force``).
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archiveexport as ae


def run(p: Params, check_mode: bool) -> Result:
    """Export the chosen snapshot to ``path`` (check mode: check it, write nothing)."""
    common.refuse_empty(p, "snapshot_id", "name")
    return ae.export_archive(common.store_from(p), p["path"], snapshot_id=p["snapshot_id"], name=p["name"],
                             labels=p["labels"], compression=p["compression"], carrier_command=p["carrier_command"],
                             carrier_volumes=p["carrier_volumes"], force=p["force"], check_mode=check_mode)
