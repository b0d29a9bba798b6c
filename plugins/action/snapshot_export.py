# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin of warmstart.snapshot.snapshot_export: runs the module and prints its progress while it works."""
from __future__ import annotations

from ansible_collections.warmstart.snapshot.plugins.plugin_utils._progress_action import ProgressActionBase


class ActionModule(ProgressActionBase):
    """See ProgressActionBase."""
