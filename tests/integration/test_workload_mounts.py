"""A workload's own mount namespace and /proc, with real CRIU (issue 31, item 1).

A workload started by warmstart.snapshot.workload is the init of its own PID namespace; CUDA (and anything that
reads /proc/self) refuses to work where /proc shows the node's PIDs instead. So a workload gets a mount
namespace of its own, every mount a slave of the node's, with a /proc of its PID namespace; CRIU dumps and
restores that namespace with the tree. Checked here:

- the workload and its child see their own /proc before a checkpoint and after eager and lazy restores;
- mounts of other containers, pods and sessions (here: under /run/user) are left out of the snapshot unless
  the tree holds something on them, so a restore does not need them; a kept mount missing on the restoring
  node is refused before anything runs, naming it;
- on a node whose mounts are shared (as systemd makes them), the restored copy is again a slave of the node's
  mounts: a mount made on the node after the restore reaches it, an unmount too; restoring that snapshot
  where those mounts are private is refused, naming each;
- ``mount_namespace: false`` keeps the node's mount namespace (and /proc), as before.
"""
from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from .process_lab import Lab, free_port, json_line, port_open

# The workload: a child process, a file it may hold open (argv[2]), and a TCP socket that answers with what it
# sees of /proc and of the paths it is asked about.
SERVER = r'''
import json, os, socket, sys, time
port = int(sys.argv[1])
held = open(sys.argv[2]) if len(sys.argv) > 2 else None
child = os.fork()
if child == 0:
    while True:
        time.sleep(60)
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(8)
open(os.path.join(os.environ["SNAPSHOT_CONTROL_DIR"], "ready-for-snapshot"), "w").close()
while True:
    conn, _ = srv.accept()
    with conn:
        asked = conn.recv(4096).decode().split()
        with open("/proc/self/status") as handle:
            nspid = next(line.split()[1:] for line in handle if line.startswith("NSpid:"))
        if held:
            held.seek(0)
        state = {"pid": os.getpid(), "self": os.readlink("/proc/self"), "nspid": nspid, "child": child,
                 "proc_pids": sorted(int(e) for e in os.listdir("/proc") if e.isdigit()),
                 "held": held.read() if held else None, "exists": {p: os.path.exists(p) for p in asked}}
        conn.sendall((json.dumps(state) + "\n").encode())
'''

# A node whose mounts are shared, as systemd makes them: a private copy first, so that on a node whose mounts are
# shared indeed nothing mounted in here reaches the node (and the other tests' snapshots).
SHARED_NODE = ("unshare", "--mount", "--propagation", "private", "--", "unshare", "--mount", "--propagation", "shared",
               "--")
PRIVATE_NODE = ("unshare", "--mount", "--propagation", "private", "--")


def ask(port: int, *paths: str) -> Dict[str, Any]:
    return json_line(("127.0.0.1", port), (" ".join(paths) + "\n").encode(), timeout=20)


def start(lab: Lab, name: str, port: int, *extra: str, **opts: Any) -> Dict[str, Any]:
    script = lab.tmp / "mounts_server.py"
    script.write_text(SERVER)
    lab.script = script  # lab.ours() and lab.cleanup() find this test's processes by their script
    return {"name": f"start {name}", "warmstart.snapshot.workload": {
        "name": name, "root": str(lab.workloads), "wait_ready": True, "ready_timeout": 60,
        "command": ["/usr/bin/python3", str(script), str(port), *extra], **opts}}


def shell(name: str, cmd: str, **extra: Any) -> Dict[str, Any]:
    return {"name": name, "ansible.builtin.shell": cmd, **extra}


def manifest(lab: Lab, snapshot_id: str) -> Dict[str, Any]:
    return json.loads((lab.store / "snapshots" / snapshot_id / "manifest.json").read_text())


def own_proc_seen(state: Dict[str, Any]) -> None:
    """The workload sees the /proc of its own PID namespace: itself as 1, its child, nothing of the node."""
    assert state["pid"] == 1 and state["self"] == "1", state
    assert state["nspid"][-1] == "1"
    assert state["proc_pids"] == sorted([1, state["child"]]), state


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_workload_sees_its_own_proc_before_and_after_a_restore(lab: Lab, lazy: bool) -> None:
    port = free_port()
    lab.play([start(lab, "ownproc", port)])
    own_proc_seen(ask(port))
    res = lab.play([lab.checkpoint("checkpoint", workload="ownproc", leave_running=False),
                    lab.restore("restore", name="ownproc", lazy=lazy)])
    ck = res["checkpoint"]["snapshot"]
    record = manifest(lab, ck["id"])["targets"][0]["mount_namespace"]
    assert record["own_proc"] is True
    assert {"path": "/proc", "fstype": "proc", "slave": False} in record["mounts"]
    assert [m for m in record["mounts"] if m["path"] == "/"], record
    restored = res["restore"]["restore"]
    assert restored["lazy"]["used"] is lazy
    own_proc_seen(ask(port))
    assert lab.ours() and restored["pid"] in lab.ours()


def test_node_local_mounts_are_left_out_unless_the_tree_holds_something_on_them(lab: Lab) -> None:
    """Mounts under /run/user (a login session's) stand for those of other containers, pods and sessions."""
    session = Path("/run/user") / f"ws-{uuid.uuid4().hex[:8]}"
    unused, used = session / "unused", session / "used"
    lab.mount_tmpfs(unused, "size=1m")
    lab.mount_tmpfs(used, "size=1m")
    (used / "model.txt").write_text("weights\n")
    port = free_port()
    try:
        res = lab.play([start(lab, "nodelocal", port, str(used / "model.txt")),
                        lab.checkpoint("checkpoint", workload="nodelocal", leave_running=False)])
        record = manifest(lab, res["checkpoint"]["snapshot"]["id"])["targets"][0]["mount_namespace"]
        assert str(unused) in record["skipped"], record
        assert str(used) in [m["path"] for m in record["mounts"]], record
        assert str(used) not in record["skipped"]
        # The unused mount is gone from the node before the restore: the snapshot does not need it.
        subprocess.run(["umount", str(unused)], check=True)
        unused.rmdir()
        lab.play([lab.restore("restore", name="nodelocal")])
        state = ask(port, str(unused), str(used / "model.txt"))
        own_proc_seen(state)
        assert state["held"] == "weights\n"
        assert state["exists"] == {str(unused): False, str(used / "model.txt"): True}
    finally:
        lab.cleanup()
        subprocess.run(["umount", "-R", "-l", str(session)], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(session)], check=False)


@pytest.mark.serial  # its mount is the node's: a snapshot another test takes meanwhile keeps it, then misses it
def test_a_kept_mount_missing_on_the_restoring_node_is_refused_naming_it(lab: Lab) -> None:
    data = lab.tmp / "data"
    lab.mount_tmpfs(data, "size=1m")
    port = free_port()
    res = lab.play([start(lab, "missing", port),
                    lab.checkpoint("checkpoint", workload="missing", leave_running=False)])
    record = manifest(lab, res["checkpoint"]["snapshot"]["id"])["targets"][0]["mount_namespace"]
    assert str(data) in [m["path"] for m in record["mounts"]], "a mount of the node's is kept, used or not"
    subprocess.run(["umount", str(data)], check=True)
    data.rmdir()
    refused = lab.play([lab.restore("restore", name="missing", expect_fail=True)])["restore"]
    assert refused["failed"] is True and "refusing to restore snapshot" in refused["msg"]
    assert f"mount {data}: the workload had it (tmpfs), this node has no {data}" in refused["reasons"]
    assert lab.ours() == [] and not port_open(port)
    assert not lab.restore_root.exists() or not any(lab.restore_root.iterdir()), "a refused restore left a work dir"


def mounted_in(pid_expr: str, path: Path) -> str:
    """A shell test: whether ``path`` is a mount point in the mount namespace of the pid (a Jinja expression)."""
    return f"awk -v p={path} '$5 == p {{ found = 1 }} END {{ exit !found }}' /proc/{pid_expr}/mountinfo"


def test_on_a_node_with_shared_mounts_the_copy_keeps_receiving_the_node_s_mounts(lab: Lab) -> None:
    held, late = lab.tmp / "held", lab.tmp / "late"
    held.mkdir()
    late.mkdir()
    port = free_port()
    pid = "{{ restored.restore.pid }}"
    tasks: List[Dict[str, Any]] = [
        shell("mount held", f"mount -t tmpfs -o size=1m tmpfs {held} && echo kept > {held}/data.txt"),
        start(lab, "shared", port, str(held / "data.txt")),
        lab.checkpoint("checkpoint", workload="shared", leave_running=False),
        {**lab.restore("restore", name="shared"), "register": "restored"},
        shell("mount late", f"mount -t tmpfs -o size=1m tmpfs {late} && touch {late}/here"),
        shell("late seen", mounted_in(pid, late)),
        shell("unmount late", f"umount {late}"),
        shell("late gone", mounted_in(pid, late), ignore_errors=True),
    ]
    res = lab.play(tasks, prefix=SHARED_NODE)
    assert res["late seen"]["rc"] == 0, "a mount made on the node after the restore did not reach the copy"
    assert res["late gone"]["rc"] == 1, "an unmount on the node did not reach the copy (it pins the node's mount)"
    record = manifest(lab, res["checkpoint"]["snapshot"]["id"])["targets"][0]["mount_namespace"]
    slaves = {m["path"] for m in record["mounts"] if m["slave"]}
    assert {"/", str(held)} <= slaves, record
    state = ask(port)
    own_proc_seen(state)
    assert state["held"] == "kept\n"

    # Where those mounts are private, the copy could not be a slave of them: refused, each named.
    lab.play([lab.stop("shared")])
    refused = lab.play([lab.restore("restore", name="shared", expect_fail=True)], prefix=PRIVATE_NODE)["restore"]
    reasons = "\n".join(refused["reasons"])
    assert "mount /: the workload's copy of it was a slave of the node's" in reasons
    assert f"mount {held}: the workload's copy of it was a slave of the node's" in reasons
    assert f"here {held} is not a mount point" in reasons
    assert lab.ours() == [] and not port_open(port)


def test_mount_namespace_false_keeps_the_node_s(lab: Lab) -> None:
    port = free_port()
    res = lab.play([start(lab, "nodens", port, mount_namespace=False),
                    lab.checkpoint("checkpoint", workload="nodens", leave_running=False),
                    lab.restore("restore", name="nodens")])
    assert res["start nodens"]["workload"]["spec"]["mount_namespace"] is False
    target = manifest(lab, res["checkpoint"]["snapshot"]["id"])["targets"][0]
    assert "mount_namespace" not in target
    state = ask(port)
    assert state["pid"] == 1 and state["self"] != "1", "the node's /proc shows the node's PID for /proc/self"
    restored_pid: Optional[int] = res["restore"]["restore"]["pid"]
    assert state["self"] == str(restored_pid)
