#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A ``cuda-checkpoint`` for CRIU's own CUDA plugin where NVIDIA's utility is not installed (device runs only).

CRIU's ``cuda_plugin.so`` does its CUDA work by running ``cuda-checkpoint`` from $PATH. The device machine may
not have NVIDIA's binary (no registry to fetch it from); tests/device/e2e.py then puts this file on $PATH as
``cuda-checkpoint`` so that CRIU's plugin can be compared at all. It answers the calls the plugin makes
(``-h``, ``--get-restore-tid``, ``--get-state``, ``--action lock|checkpoint|restore|unlock``, ``--pid``,
``--timeout``) with the same CUDA driver calls NVIDIA's utility makes (cuCheckpointProcess*, through the
collection's ``_cudabackends.DriverBackend``). The run's results say which of the two served the plugin.
"""
from __future__ import annotations

import argparse
import os
import sys

USAGE = """usage: cuda-checkpoint [--get-state | --get-restore-tid | --action ACTION] --pid PID [--timeout MS]
  --action {lock,checkpoint,restore,unlock}
  --get-state, --get-restore-tid, --pid, --timeout, --toggle (unsupported)
warmstart's shim over the CUDA driver API (tests/device/cuda_checkpoint_shim.py)
"""
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


def main(argv: list) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--get-state", action="store_true")
    parser.add_argument("--get-restore-tid", action="store_true")
    parser.add_argument("--action", choices=["lock", "checkpoint", "restore", "unlock"])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--timeout", type=int, default=0)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.environ["WARMSTART_COLLECTIONS"])
    from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi  # pylint: disable=import-outside-toplevel
    from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends  # pylint: disable=import-outside-toplevel
    backend = _cudabackends.DriverBackend()
    try:
        if args.get_state:
            print(STATES.get(backend.state(args.pid), "unknown"))
        elif args.get_restore_tid:
            print(backend.restore_thread_id(args.pid))
        elif args.action == "lock":
            backend.lock(args.pid, args.timeout)
        elif args.action == "checkpoint":
            backend.checkpoint(args.pid)
        elif args.action == "restore":
            backend.restore(args.pid)
        elif args.action == "unlock":
            backend.unlock(args.pid)
    except _cudaabi.CudaError as exc:
        print(f"cuda-checkpoint shim: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
