# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The snapshot_import module's runner: a checkpoint archive (podman, the kubelet) into a store.

Keeps the runners' invariants (``_common``); ``changed`` is false when the store already holds the snapshot an
import of the same archive under the same name published.
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archiveimport as ai


def run(p: Params, check_mode: bool) -> Result:
    """Import ``path`` (check mode: read and map it, write nothing)."""
    common.refuse_empty(p, "name", "container_name")
    return ai.import_archive(common.store_from(p), p["path"], name=p["name"], labels=p["labels"],
                             container_name=p["container_name"], criu_path=p["criu_path"], check_mode=check_mode)
