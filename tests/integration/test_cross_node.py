"""Cross-node restore between two "nodes" that share a store.

The nodes are privileged podman containers of the local Debian image
(tests/support/build_node_image.sh), prepared with the real node_prep role
over the podman connection, with one store directory mounted in both. The
workload is a process with memory state, a listening TCP socket
(SO_REUSEADDR) and a unix socket pair: checkpointed on node A, it must
continue on node B from where it was. A snapshot taken on this machine,
whose software differs from the nodes', must be refused on node B before
anything is touched, naming the files that differ.

The nodes are prepared as a fleet is by default: prepare_nodes makes the fleet signing key on the controller
(here a path of the test's own) and gives every node the key and the trust set, so the snapshot node A takes
is signed and node B checks it; an unsigned snapshot in the store is refused on node B.
"""
from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg

from .ansible_run import REPO
from .podman_lab import node_image, play as _play, podman_env

PORT = 18931
PROGRAM = r"""
import hashlib, os, random, socket, threading, time
state = {"n": 0}
blob = bytearray(random.randbytes(20 << 20))
digest = hashlib.sha256(blob).hexdigest()
a, b = socket.socketpair()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", PORT))
srv.listen(8)
def serve():
    while True:
        conn, _ = srv.accept()
        a.send(b"?")
        pong = b.recv(1)
        conn.sendall(("%d %s %s %d\n" % (state["n"], digest, pong.decode(), os.getpid())).encode())
        conn.close()
threading.Thread(target=serve, daemon=True).start()
open(os.path.join(os.environ["SNAPSHOT_CONTROL_DIR"], "ready-for-snapshot"), "w").close()
while True:
    state["n"] += 1
    time.sleep(0.05)
""".replace("PORT", str(PORT))


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory):
    """Two prepared nodes sharing a store directory (also visible here)."""
    env = podman_env()
    image = node_image()
    store = tmp_path_factory.mktemp("xnode") / "store"
    store.mkdir(mode=0o700)
    fleet_key = store.parent / "controller" / "fleet-signing.key"  # made by prepare_nodes (node_prep_sign_snapshots)
    tag = uuid.uuid4().hex[:8]
    names = [f"ws-xnode-a-{tag}", f"ws-xnode-b-{tag}"]
    try:
        for name in names:
            subprocess.run(["podman", "run", "-d", "--name", name, "--privileged", "--init",
                            "-v", f"{store}:/store", image, "sleep", "infinity"], env=env, check=True,
                           capture_output=True)
        prep = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "warmstart.snapshot.prepare_nodes",
                               "-i", ",".join(names) + ",", "-c", "containers.podman.podman",
                               "-e", "prepare_nodes_become=false",
                               "-e", f"node_prep_fleet_key_path={fleet_key}"],  # signed by default, key of our own
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
        assert prep.returncode == 0, prep.stdout[-3000:]
        yield {"a": names[0], "b": names[1], "store": store, "env": env, "fleet_key": fleet_key}
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *names], env=env, capture_output=True, check=False)


def _query(nodes: dict, node: str) -> list[str]:
    code = ("import socket; c = socket.create_connection(('127.0.0.1', %d), timeout=5); "
            "print(c.makefile().readline().strip())" % PORT)
    out = subprocess.run(["podman", "exec", nodes[node], "python3", "-c", code], env=nodes["env"],
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.split()


def _on(nodes: dict, node: str, tmp_path: Path, tasks: list, name: str, ok: bool = True) -> dict:
    return _play(tmp_path, nodes["env"], f"{nodes[node]},", "containers.podman.podman", tasks, name, ok)


def test_restore_on_another_node(nodes: dict, tmp_path: Path) -> None:
    wl_name = f"xnode-{uuid.uuid4().hex[:6]}"
    start = _on(nodes, "a", tmp_path, [
        {"name": "start", "warmstart.snapshot.workload": {
            "name": wl_name, "command": ["/usr/bin/python3", "-c", PROGRAM], "wait_ready": True}},
    ], "start")
    assert start["start"]["workload"]["running"]
    before = _query(nodes, "a")
    assert before[2] == "?" and before[3] == "1"
    snap = _on(nodes, "a", tmp_path, [
        {"name": "checkpoint", "warmstart.snapshot.checkpoint": {
            "workload": wl_name, "store": "/store", "leave_running": False, "labels": {"test": "cross-node"}}},
        {"name": "gone", "ansible.builtin.command": {"argv": ["cat", f"/var/lib/warmstart/workloads/{wl_name}/pid"]},
         "register": "pidfile", "failed_when": "pidfile.rc == 0"},
    ], "checkpoint")["checkpoint"]["snapshot"]
    manifest = json.loads((nodes["store"] / "snapshots" / snap["id"] / "manifest.json").read_text())
    # signed by default: prepare_nodes made the fleet key on the controller and gave it to the nodes
    assert manifest["signature"]["key_id"] == sg.load_signing_key(str(nodes["fleet_key"])).key_id

    restored = _on(nodes, "b", tmp_path, [
        {"name": "restore", "warmstart.snapshot.restore": {"labels": {"test": "cross-node"}, "store": "/store"}},
        {"name": "sentinel", "ansible.builtin.slurp": {
            "src": f"/var/lib/warmstart/workloads/{wl_name}/control/restore-complete"}},
    ], "restore")
    assert restored["restore"]["restore"]["id"] == snap["id"]
    assert restored["restore"]["restore"]["ns_pid"] == 1
    assert base64.b64decode(restored["sentinel"]["content"]).decode().startswith("pid=1\n")
    time.sleep(0.3)
    after = _query(nodes, "b")
    # memory (counter, 20 MB blob hash), the unix socketpair and the TCP listener all survived
    assert int(after[0]) >= int(before[0])
    assert after[1] == before[1]
    assert after[2] == "?"
    assert after[3] == "1"  # still the init of its own PID namespace
    time.sleep(0.3)
    assert int(_query(nodes, "b")[0]) > int(after[0])
    _on(nodes, "b", tmp_path, [{"name": "stop", "warmstart.snapshot.workload": {"name": wl_name, "state": "stopped"}}],
        "stop")


def test_other_software_is_refused_before_restore(nodes: dict, tmp_path: Path) -> None:
    """A snapshot from this machine maps its python3, which differs from the nodes' own."""
    wl_name = f"host-{uuid.uuid4().hex[:6]}"
    roots = {"workloads_root": str(tmp_path / "wl")}
    local = _play(tmp_path, nodes["env"], "localhost,", "local", [
        {"name": "start", "warmstart.snapshot.workload": {
            "name": wl_name, "root": roots["workloads_root"], "wait_ready": True,
            "command": ["/usr/bin/python3", "-c", PROGRAM.replace(str(PORT), str(PORT + 1))]}},
        {"name": "checkpoint", "warmstart.snapshot.checkpoint": {
            "workload": wl_name, **roots, "store": str(nodes["store"]), "name": "from-host",
            "store_options": {"signing_key": str(nodes["fleet_key"])}}},  # signed as the fleet signs
        {"name": "unsigned", "warmstart.snapshot.checkpoint": {
            "workload": wl_name, **roots, "store": str(nodes["store"]), "name": "unsigned-from-host"}},
        {"name": "stop", "warmstart.snapshot.workload": {"name": wl_name, "root": roots["workloads_root"],
                                                         "state": "stopped"}},
    ], "host")
    assert local["checkpoint"]["snapshot"]["source_running"]
    refused = _on(nodes, "b", tmp_path, [
        {"name": "restore", "warmstart.snapshot.restore": {"snapshot": local["checkpoint"]["snapshot"]["id"],
                                                           "store": "/store"},
         "register": "r", "ignore_errors": True},
    ], "refused", ok=True)["restore"]
    assert refused["failed"]
    assert "refusing to restore" in refused["msg"]
    assert any(r.startswith("file /usr/") and "at checkpoint" in r for r in refused["reasons"]), refused["reasons"]
    assert "criu_log_tail" not in refused  # CRIU never ran
    answers = _on(nodes, "b", tmp_path, [
        {"name": "restore", "warmstart.snapshot.restore": {"snapshot": local["unsigned"]["snapshot"]["id"],
                                                           "store": "/store"},
         "register": "r", "ignore_errors": True},
        # by name: a newer snapshot this node cannot trust may be a newer version of anything, so the selection
        # refuses rather than fall back to the older signed one silently
        {"name": "by name", "warmstart.snapshot.restore": {"name": "from-host", "store": "/store"},
         "register": "n", "ignore_errors": True},
    ], "unsigned", ok=True)
    by_name, unsigned = answers["by name"], answers["restore"]
    assert by_name["failed"] and "cannot be read or trusted" in by_name["msg"], by_name.get("msg")
    assert unsigned["failed"] and "it is not signed" in unsigned["msg"], unsigned.get("msg")
