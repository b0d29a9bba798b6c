# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet_key module's runner: the fleet's signing key at ``path``, made once; its public half returned.

Keeps the runners' invariants (``_common``).
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _fleetkey as fk
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params, Result


def run(p: Params, check_mode: bool) -> Result:
    """The fleet's signing key at ``path``, made once; its public half returned."""
    key = fk.ensure(p["path"], check_mode)
    return dict(changed=key.created, path=key.path, key_id=key.key_id, public_key=key.public_pem)
