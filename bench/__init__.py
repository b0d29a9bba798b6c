# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmarks, run as modules from the checkout root (see bench/README.md):

    sudo /usr/bin/python3 -m bench.run | bench.lazy | bench.containers | bench.fleet [options]

The scripts share code by importing each other from this package (``bench.run`` holds the engine loading,
process helpers and machine facts the others use). The collection is imported by its FQCN through
``.collections``, the link ``make link`` makes: this is the one place that puts it on ``sys.path``.
mem_workload.py and lazy_server.py are workloads, run as plain files (also inside containers).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))  # bench/: the workload scripts are run from here
REPO = os.path.dirname(HERE)
COLLECTIONS = os.path.join(REPO, ".collections")

if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
