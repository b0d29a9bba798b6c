"""Container workloads that are process trees, restored into inert placeholders (podman, runc, --init).

Real inference servers are trees: one worker per GPU, gunicorn/uvicorn workers, data-loader forks, shell
entrypoints. Each shape below runs under ``podman run --init``, is checkpointed, and restored into two
placeholders from one snapshot (a container map); every process of the tree must be alive there and its
counters must go on from where the source was.

The cause of the old failure ("Requested sid N doesn't match inherited 0"): the tree belonged to the
container init's session, whose leader is not dumped; CRIU's shell-job restore moved it into the restorer's
session, invisible inside the placeholder's PID namespace, and every child but the root failed CRIU's
session check. The checkpoint now makes the tree lead its own session (_pstree).
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf

from .container_lab import Pod, pod_for, wait_file
from .process_lab import slow_criu

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

# Every process writes "<role> <counter>" into /tmp/c-<role> every 0.1 s; "ready-for-snapshot" once all run.
TREE = r'''
import os, sys, threading, time
ctl = os.environ["SNAPSHOT_CONTROL_DIR"]

def tick(role):
    n = 0
    while True:
        n += 1
        with open(f"/tmp/c-{role}.tmp", "w") as f:
            f.write(str(n))
        os.replace(f"/tmp/c-{role}.tmp", f"/tmp/c-{role}")
        time.sleep(0.1)

def child(role, grandchild=False, own_group=False):
    pid = os.fork()
    if pid:
        return pid
    if own_group:
        os.setpgid(0, 0)
    if grandchild:
        child(role + "-g")
    threading.Thread(target=tick, args=(role + "-t",), daemon=True).start()  # a second thread
    tick(role)

child("a", grandchild=True)
child("b", own_group=True)
time.sleep(0.5)
open(os.path.join(ctl, "ready-for-snapshot"), "w").close()
tick("root")
'''
TREE_ROLES = ["root", "a", "a-t", "a-g", "a-g-t", "b", "b-t"]

# A shell entrypoint that execs nothing: it forks `sleep` every 0.2 s (often mid fork/exec at dump time).
SHELL = ('i=0; while :; do i=$((i+1)); echo $i > /tmp/c-sh; '
         '[ $i = 5 ] && : > "$SNAPSHOT_CONTROL_DIR/ready-for-snapshot"; sleep 0.2; done')


def counters(pod: Pod, full: str, roles: List[str]) -> Dict[str, int]:
    out = {}
    for role in roles:
        done = pod.podman("exec", full, "cat", f"/tmp/c-{role}", check=False)
        out[role] = int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else -1
    return out


def tree_restore(pod: Pod, name: str, cmd: List[str], roles: List[str]) -> Dict[str, Any]:
    src = pod.run(name, *cmd)
    wait_file(pod.control(name) / "ready-for-snapshot", 60)
    ph = [pod.placeholder(f"{name}-ph{n}") for n in range(2)]
    time.sleep(3.0)  # counters well above what a fresh start reaches in the second after a restore
    before = counters(pod, src, roles)
    res = pod.play([
        pod.checkpoint("checkpoint", container=src, wait_ready=True, leave_running=False),
        pod.restore("restore", name=src, into={"container_map": [f"{src}={p}" for p in ph]}),
    ], name)
    time.sleep(1.0)
    first = {p: counters(pod, p, roles) for p in ph}
    time.sleep(1.0)
    second = {p: counters(pod, p, roles) for p in ph}
    return {"src": src, "ph": ph, "res": res, "before": before, "first": first, "second": second}


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("trees"), {"tree.py": TREE})


@pytest.mark.parametrize("shape", ["python_tree", "shell_loop"])
def test_a_process_tree_restores_into_two_placeholders(pod: Pod, shape: str) -> None:
    if shape == "python_tree":
        cmd, roles = ["python3", "/app/tree.py"], TREE_ROLES
    else:
        cmd, roles = ["sh", "-c", SHELL], ["sh"]
    out = tree_restore(pod, shape.replace("_", "-"), cmd, roles)
    res = out["res"]
    assert res["restore"]["restore"]["outcome"] == "succeeded", res["restore"]
    target = res["checkpoint"]["snapshot"]
    assert target["name"] == out["src"]
    for p in out["ph"]:
        first, second = out["first"][p], out["second"][p]
        assert all(first[r] >= out["before"][r] > 0 for r in roles), \
            f"{p}: counters did not go on from the dump: {out['before']} -> {first}"
        assert all(second[r] > first[r] for r in roles), f"{p}: a process of the tree does not run: {first} -> {second}"
        lines = pod.ps(p)
        assert lines[0].split()[0] == "1" and "sleep infinity" in lines[0], lines
        if shape == "python_tree":
            assert sum("/app/tree.py" in line for line in lines) == 4, lines  # root, a, a-g, b


def test_a_restored_tree_leads_its_session_and_can_be_checkpointed_again(pod: Pod) -> None:
    out = tree_restore(pod, "again", ["python3", "/app/tree.py"], TREE_ROLES)
    again = pod.play([pod.checkpoint("checkpoint the copy", container=out["ph"][0], name="again-copy")], "again2")
    snap = again["checkpoint the copy"]["snapshot"]
    assert snap["name"] == "again-copy" and snap["source_running"] is True
    time.sleep(0.5)
    assert all(v > 0 for v in counters(pod, out["ph"][0], TREE_ROLES).values())


def test_two_restores_into_one_placeholder_start_one_copy(pod: Pod, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Both see an inert placeholder; the placeholder's lock lets one restore, the other is refused (and the
    placeholder, with the first one's copy in it, is not killed as a failed restore would)."""
    slow = slow_criu(tmp_path_factory.mktemp("slowcriu"), 2)
    src = pod.run("twice", "python3", "/app/tree.py")
    wait_file(pod.control("twice") / "ready-for-snapshot", 60)
    ph = pod.placeholder("twice-ph")
    pod.play([pod.checkpoint("checkpoint", container=src, wait_ready=True)], "twice-ck")
    results: List[Dict[str, Any]] = []

    def one(n: int) -> None:
        res = pod.play([pod.restore(f"restore {n}", name=src, into={"container": ph}, criu_path=str(slow),
                                    expect_fail=True)], f"twice-{n}", ok=False)
        results.append(res[f"restore {n}"])
    threads = [threading.Thread(target=one, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    outcomes = sorted(r["restore"]["destinations"][0]["result"] for r in results)
    assert outcomes == ["refused", "succeeded"], results
    loser = next(r for r in results if r["restore"]["destinations"][0]["result"] == "refused")
    assert "another restore of placeholder" in loser["msg"] or "is not inert" in loser["msg"], loser["msg"]
    assert pod.running(ph)
    assert sum("/app/tree.py" in line for line in pod.ps(ph)) == 4, pod.ps(ph)


@pytest.mark.parametrize("host_dir", ["/etc", "/", "/etc/shadow"])
def test_a_manifest_cannot_bind_a_host_path_into_a_placeholder(pod: Pod, host_dir: str) -> None:
    """A store writer adds an external mount whose source is a host path; the placeholder lacks that mount.
    It used to be bound from the manifest's source path; now only the placeholder's own mounts count."""
    name = f"bind{len(host_dir)}"
    src = pod.run(name, "python3", "/app/tree.py")
    wait_file(pod.control(name) / "ready-for-snapshot", 60)
    snap = pod.play([pod.checkpoint("checkpoint", container=src, wait_ready=True)], f"{name}-ck")["checkpoint"]["snapshot"]
    sid = mf.new_id()
    shutil.copytree(pod.store / "snapshots" / snap["id"], pod.store / "snapshots" / sid)
    doc = json.loads((pod.store / "snapshots" / sid / "manifest.json").read_text())
    doc["id"] = sid
    doc["targets"][0]["external_mounts"].append({"mountpoint": "/hostroot", "source": host_dir, "fstype": "none"})
    (pod.store / "snapshots" / sid / "manifest.json").write_text(json.dumps(doc))
    ph = pod.placeholder(f"{name}-ph")
    res = pod.play([pod.restore("restore", snapshot=sid, into={"container": ph}, expect_fail=True)], f"{name}-rs",
                   ok=False)["restore"]
    assert res.get("failed") and "has no mount at /hostroot" in res["msg"], res["msg"]
    assert pod.running(ph) and len(pod.ps(ph)) == 1, "the placeholder was touched"
    assert not any("/hostroot" in line for line in open(f"/proc/{pod.pid1(ph)}/mountinfo"))
