# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node_info module's runner: this node's facts (as ``node``; an _info module sets no host facts).

Keeps the runners' invariants (``_common``); it only reads.
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _node as nd
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError


def run(p: Params, check_mode: bool) -> Result:  # pylint: disable=unused-argument  # reads only
    """This node's facts."""
    try:
        node = nd.collect(snapshot_root=p["snapshot_root"], criu_path=p["criu_path"],
                          kernel_min_version=p["kernel_min_version"], probe_features=p["probe_features"])
    except ValueError as exc:  # an option the engine cannot read (kernel_min_version)
        if isinstance(exc, WarmstartError):
            raise
        raise WarmstartError(str(exc)) from exc
    return dict(changed=False, node=node)
