#!/usr/bin/env bash
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# tests/device/e2e.sh - a warm GPU inference server snapshotted and restored end to end, one command, < 8 minutes.
#
#   bash tests/device/e2e.sh --out DIR               # on the GPU machine (as root), with .device-bundle carried
#   bash tests/device/e2e.sh --out DIR --dry-run     # here, no GPU: assembles .device-bundle, runs it on the CPU
#
# PYTHON=/path/to/python picks the Python with PyTorch and transformers (else the first one found that has them).
# Prints PASS/FAIL/SKIP per check and a SUMMARY line; writes DIR/e2e.json and DIR/e2e.md; exits 1 on a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
    for candidate in /opt/warmstart/demo-venv/bin/python /opt/venv/bin/python /usr/local/bin/python3 /usr/bin/python3; do
        if [ -x "$candidate" ] && "$candidate" -c 'import torch, transformers' 2>/dev/null; then PY=$candidate; break; fi
    done
fi
# The runner needs protobuf and ansible-core only to assemble the bundle (dry run); the checkout's venv has them.
RUNNER=$PY
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import google.protobuf, ansible' 2>/dev/null; then RUNNER=.venv/bin/python; fi
exec timeout 470 "$RUNNER" tests/device/e2e.py --python "$PY" "$@"
