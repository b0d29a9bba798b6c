# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """The metrics option of the modules that capture or restore on a node."""

    DOCUMENTATION = r"""
options:
  metrics_dir:
    description:
      - Count this run in Prometheus metrics kept in this node directory - C(warmstart.prom) (text format 0.0.4,
        for node_exporter's textfile collector; point its C(--collector.textfile.directory) here, or set this to
        node_exporter's own directory) beside a small state file, both rewritten atomically under a lock, so
        concurrent runs lose nothing. The usual place is C(/var/lib/warmstart/metrics).
      - Counted are the outcome (success or failure), the seconds of each phase (histograms), the snapshot's bytes
        and, for a restore, the snapshot's age; see C(docs/agent.md) for every metric.
      - Default E(WARMSTART_METRICS_DIR) from the module's environment; neither set - no metrics.
      - Nothing is counted in check mode. A directory that cannot be written gives a warning, never a failure.
    type: path
"""
