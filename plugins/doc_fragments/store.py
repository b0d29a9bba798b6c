# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """Options shared by the modules that use a snapshot store (and CRIU: the CRIU fragment)."""

    DOCUMENTATION = r"""
options:
  store:
    description:
      - Snapshot store, a directory on this node (local disk or a shared mount such as NFS).
      - Laid out as C(snapshots/<id>/) (published, with C(manifest.json) written last) and C(tmp/) (staging).
    type: path
    default: /var/lib/warmstart/store
"""

    CRIU = r"""
options:
  criu_path:
    description:
      - CRIU binary to use. By default the bundle installed by the P(warmstart.snapshot.node_prep#role) role,
        then C(/usr/local/bin/criu), then C(PATH).
    type: path
"""
