#!/usr/bin/env bash
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# tests/device/run.sh - the GPU check of the CUDA checkpoint binding, one command, under 5 minutes.
#
# Needs: an NVIDIA GPU, driver >= 570 (>= 580 for the GPU device map), a Python with PyTorch (CUDA build);
# pynvml or nvidia-smi for the memory checks. Root is not needed for the CUDA checks (same user as the
# PyTorch process); the CRIU + CUDA step through the modules needs root and CRIU (CRIU=/path/to/bundle/bin/criu).
#
#   bash tests/device/run.sh                       # PYTHON=/path/to/python to pick the one with torch
#   bash tests/device/run.sh --mib 4096 --json out.json
#
# Prints PASS/FAIL/SKIP per check and a SUMMARY line; exits non-zero when a check failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch' 2>/dev/null; then
    for candidate in /opt/venv/bin/python /usr/local/bin/python3 /usr/bin/python3; do
        if [ -x "$candidate" ] && "$candidate" -c 'import torch' 2>/dev/null; then PY=$candidate; break; fi
    done
fi
echo "tests/device/run.sh: python $PY, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 || echo 'no nvidia-smi')"
exec timeout 290 "$PY" tests/device/cuda_checkpoint.py --python "$PY" "$@"
