"""proc.detach: the double fork behind the checkpoint guardian and the lazy-restore supervisors; proc.unstopped:
which threads of a tree still run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc


def test_detach_runs_the_body_in_its_own_session_with_only_the_kept_descriptors() -> None:
    rfd, wfd = os.pipe()
    stray_r, stray_w = os.pipe()  # must not leak into the grandchild

    def body() -> None:
        fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
        os.write(wfd, json.dumps({"pid": os.getpid(), "sid": os.getsid(0), "ppid": os.getppid(), "fds": fds,
                                  "stdin": os.readlink("/proc/self/fd/0")}).encode())

    try:
        proc.detach(body, keep=(wfd,))
        os.close(wfd)
        got = json.loads(os.read(rfd, 65536))
    finally:
        os.close(rfd)
        os.close(stray_r)
        os.close(stray_w)
    assert got["pid"] != os.getpid() and got["sid"] != os.getsid(0)  # a session of its own (not its leader)
    assert got["ppid"] != os.getpid()  # not our child: nothing of ours to reap
    assert stray_r not in got["fds"] and stray_w not in got["fds"] and rfd not in got["fds"]
    assert len(set(got["fds"]) - {0, 1, 2, wfd}) <= 1  # listdir's own descriptor at most
    assert got["stdin"] == os.devnull


def test_file_mismatches_name_each_file_and_hint_at_node_local_ones(tmp_path: Path) -> None:
    same = tmp_path / "lib.so"
    same.write_bytes(b"x" * 10)
    other = tmp_path / "model.bin"
    other.write_bytes(b"y" * 5)
    got = proc.file_mismatches({str(same): 10, str(other): 7, "/tmp/hsperfdata_root/999999999": 32768,
                                "/dev/shm/psm_1234": 4096, str(tmp_path / "gone.so"): 3})
    assert got[0].startswith("file /dev/shm/psm_1234: missing on this node; a shared-memory file"), got
    jvm = next(r for r in got if r.startswith("file /tmp/hsperfdata_root/999999999: "))
    assert "missing on this node; a JVM's performance-data file" in jvm and "-XX:-UsePerfData" in jvm, jvm
    assert f"file {tmp_path / 'gone.so'}: missing on this node" in got
    assert f"file {other}: 5 bytes on this node, 7 at checkpoint (different software)" in got
    assert len(got) == 4, "an unchanged file was reported"
    assert proc.file_mismatches({f"/nonexistent/{n}": 1 for n in range(12)}, limit=8)[-1] == "... and 4 more files differ"


def test_unstopped_names_the_threads_of_a_tree_that_still_run() -> None:
    """proc.unstopped: every thread of the tree, children included, until a SIGSTOP has taken hold of each."""
    code = "import subprocess, threading, time; c = subprocess.Popen(['sleep', '60']); " \
           "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        # the sleep child, then python's second thread (it starts after the child): wait for both
        while (len(proc.descendants(parent.pid)) < 2 or len(os.listdir(f"/proc/{parent.pid}/task")) < 2) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        tree = proc.descendants(parent.pid)
        running = proc.unstopped(parent.pid)
        assert len(tree) == 2 and len(running) == 3, (tree, running)  # two threads of python, the sleep child
        proc.signal_tree(parent.pid, signal.SIGSTOP)
        while proc.unstopped(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.unstopped(parent.pid) == []
        proc.signal_tree(parent.pid, signal.SIGCONT)
        while len(proc.unstopped(parent.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(proc.unstopped(parent.pid)) == sorted(running)
    finally:
        proc.signal_tree(parent.pid, signal.SIGKILL)
        parent.wait()
