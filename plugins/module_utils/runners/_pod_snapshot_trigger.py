# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pod_snapshot_trigger module's runner: one pass over a PodSnapshotManualTrigger.

Keeps the runners' invariants (``_common``). Its own file, not pod_snapshot's: the two share no code, and
this one ships without ``_k8s_records``.
"""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_requests as req
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, Params, cluster_from


def run(params: Params, check_mode: bool) -> JSON:
    """One pass over a PodSnapshotManualTrigger: its PodSnapshot request, then its Triggered condition."""
    return req.reconcile_trigger(cluster_from(params), params["namespace"], params["name"], check_mode)
