"""node_info end to end: the real `ansible` CLI runs the module against localhost."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLED_CRIU = "/opt/warmstart/criu/4.2.1/bin/criu"  # installed by prepare_nodes (conftest)


def _ansible() -> str:
    beside_python = Path(sys.executable).parent / "ansible"
    found = str(beside_python) if beside_python.exists() else shutil.which("ansible")
    if not found:
        pytest.fail("ansible CLI not found (make venv)")
    return found


def run_node_info(*args: str) -> Dict[str, Any]:
    """Run the module ad hoc with the json callback; return localhost's result."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    cmd: List[str] = [_ansible(), "localhost", "-m", "warmstart.snapshot.node_info", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300, check=False)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from {' '.join(cmd)} (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_node_info_reports_this_node() -> None:
    result = run_node_info()
    assert result.get("failed") is not True, result.get("msg")
    assert result["changed"] is False
    node = result["node"]
    assert node["kernel"]["release"] == os.uname().release
    assert node["kernel"]["min"] == "5.12"
    assert node["arch"] == os.uname().machine
    assert "ansible_facts" not in result, "an _info module sets no host facts"
    assert node["fingerprint"]["kernel"] == os.uname().release
    assert node["snapshot_root"]["path"] == "/var/lib/warmstart"
    assert isinstance(node["gpus"], list)
    if not node["gpus"]:
        assert node["gpu_reason"]


def test_node_info_check_mode_with_options(tmp_path: Path) -> None:
    args = f"snapshot_root={tmp_path} kernel_min_version=99.1 probe_features=false criu_path={BUNDLED_CRIU}"
    result = run_node_info("--check", "-a", args)
    assert result["changed"] is False
    node = result["node"]
    assert node["kernel"]["ok"] is False and node["kernel"]["min"] == "99.1"
    assert node["snapshot_root"]["exists"] is True
    assert node["criu"]["features"] == {}
    assert node["criu"]["path"] == BUNDLED_CRIU
    assert node["criu"]["version"] == "4.2.1"


def test_node_info_fails_for_a_criu_path_that_is_not_executable(tmp_path: Path) -> None:
    result = run_node_info("-a", f"criu_path={tmp_path}/criu")
    assert result["failed"] is True
    assert result["msg"] == f"criu_path '{tmp_path}/criu' is not an executable file"
