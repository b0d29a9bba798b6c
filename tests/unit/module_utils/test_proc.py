"""proc.detach: the double fork behind the checkpoint guardian and the lazy-restore supervisors."""
from __future__ import annotations

import json
import os

from ansible_collections.warmstart.snapshot.plugins.module_utils import _proc as proc


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
