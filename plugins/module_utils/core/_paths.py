# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where warmstart keeps its files on a node, for every layer that needs one of them.

Stdlib only.
"""
from __future__ import annotations

import os

KEYS_DIR = "/etc/warmstart/keys"
KEYS_DIR_ENV = "WARMSTART_KEYS_DIR"       # tests and unusual nodes: another keys directory


def keys_dir() -> str:
    """The node's keys directory (``WARMSTART_KEYS_DIR`` or ``/etc/warmstart/keys``): signing key, trust set,
    key-encryption keys, TLS files."""
    return os.environ.get(KEYS_DIR_ENV) or KEYS_DIR
