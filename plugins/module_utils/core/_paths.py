# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where warmstart keeps its files on a node, for every layer that needs one of them: the one place these paths
are written (modules document the same defaults in their DOCUMENTATION).

``/var/lib/warmstart`` holds what outlives a reboot (store, caches, restore work dirs, workloads, metrics);
``/run/warmstart`` what must not (locks, lazy-restore state, accelerator agents' sockets). Stdlib only.
"""
from __future__ import annotations

import os

STATE_DIR = "/var/lib/warmstart"
STORE_DIR = STATE_DIR + "/store"               # the default file-system store
CACHE_DIR = STATE_DIR + "/cache"               # node copies of remote (S3, encrypted, compressed) snapshots
VERIFIED_DIR = STATE_DIR + "/verified"         # one record per snapshot whose files this node verified
RESTORE_DIR = STATE_DIR + "/restore"           # restore work dirs and page-server logs
WORKLOADS_DIR = STATE_DIR + "/workloads"       # workloads the workload module started
METRICS_DIR = STATE_DIR + "/metrics"           # the usual metrics directory (metrics are off unless asked for)

RUN_DIR = "/run/warmstart"
LOCK_DIR = RUN_DIR + "/locks"                  # one lock per target process and per exclusive restore
LAZY_DIR = RUN_DIR + "/lazy"                   # lazy restores in flight
LAZY_SUPPORT_CACHE = RUN_DIR + "/lazy-support.json"
ASCEND_AGENT_DIR = RUN_DIR + "/ascend"         # the Ascend NPU agents' sockets

# Where a restored workload's control directory may be put back (its path is recorded in the snapshot).
CONTROL_ROOTS = (STATE_DIR, RUN_DIR, "/tmp")

KEYS_DIR = "/etc/warmstart/keys"
KEYS_DIR_ENV = "WARMSTART_KEYS_DIR"       # tests and unusual nodes: another keys directory


def keys_dir() -> str:
    """The node's keys directory (``WARMSTART_KEYS_DIR`` or ``/etc/warmstart/keys``): signing key, trust set,
    key-encryption keys, TLS files."""
    return os.environ.get(KEYS_DIR_ENV) or KEYS_DIR
