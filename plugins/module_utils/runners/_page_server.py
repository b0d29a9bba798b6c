# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The page_server module's runner: serve one snapshot's pages to one lazy restore (check mode: verify only).

Keeps the runners' invariants (``_common``).
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _pageserver as ps
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _common as common
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result


def run(p: Params, check_mode: bool) -> Result:
    """Serve one snapshot's pages to one lazy restore (check mode: verify only)."""
    served = ps.serve(common.store_from(p), p["snapshot"], p["address"], p["port"], p["timeout"], p["log_dir"],
                      criu_path=p["criu_path"], verify=p["verify"], check_mode=check_mode, tls=common.tls_files(p),
                      insecure=bool(p.get("insecure")))
    return dict(changed=True, page_server=served)
