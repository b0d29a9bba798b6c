"""io_uring never stops a snapshot (issue 34, item 0), on real CRIU through the real modules.

CRIU cannot dump an io_uring instance, and stock servers take one without asking (libuv under uvloop, as
uvicorn[standard] runs vLLM's and most FastAPI servers; liburing). So:

- a process started by the ``workload`` module runs under a seccomp filter that answers io_uring with
  ENOSYS (runtimes fall back to epoll): the workload's own attempt fails that way, its checkpoint and
  restore succeed, and the restored copy still runs under the filter (CRIU restores it), refused again;
- a stock server as it ships (FastAPI on uvicorn[standard], whose uvloop takes an io_uring instance wherever
  the kernel offers one, as vLLM's API server runs), started by the ``workload`` module: it serves without
  io_uring, is checkpointed and comes back answering as itself;
- a process that holds an io_uring instance anyway (a ``pid:`` target started outside warmstart) is
  refused before anything is touched: the error names the process, the cause and the fix; the process
  keeps running, unstopped, and the store holds nothing. Check mode says the same.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

from .process_lab import Lab, free_port, port_open, proc_state, query
from .stock_lab import cached_venv

pytestmark = pytest.mark.integration


def seccomp_mode(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Seccomp:"))


STOCK = ["uvicorn[standard]==0.55.0", "fastapi==0.165.0", "uvloop==0.23.0"]
APP = """
import os
from fastapi import FastAPI

app = FastAPI()
TOKEN = os.urandom(8).hex()


@app.get("/state")
def state():
    return {"token": TOKEN, "pid": os.getpid()}
"""


@pytest.fixture(scope="module")
def stock_python() -> str:
    """A venv holding the stock server's packages from PyPI, built once per version set and cached."""
    return str(cached_venv("uvicorn", STOCK))


def http_state(port: int, timeout: float = 30.0) -> Dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=5) as answer:
                return dict(json.loads(answer.read()))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def rings(pid: int) -> int:
    """io_uring instances open in ``pid``."""
    return sum(1 for fd in os.listdir(f"/proc/{pid}/fd")
               if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[io_uring]")


def test_a_stock_uvloop_server_runs_without_io_uring_and_comes_back(lab: Lab, stock_python: str) -> None:
    (lab.tmp / "stockapp.py").write_text(APP)
    port = free_port()
    lab.play([{"name": "start", "warmstart.snapshot.workload": {
        "name": "stock", "root": str(lab.workloads),
        "command": [stock_python, "-m", "uvicorn", "--app-dir", str(lab.tmp), "stockapp:app", "--loop", "uvloop",
                    "--host", "127.0.0.1", "--port", str(port)]}}])
    try:
        before = http_state(port)
        source = lab.pidfile_pid("stock") or 0
        assert rings(source) == 0, "the stock server holds io_uring under the workload module"
        res = lab.play([lab.checkpoint("checkpoint", workload="stock", leave_running=False),
                        lab.restore("restore", name="stock")])
        after = http_state(port)
        assert after["token"] == before["token"], "what answers is not the restored server"
        assert rings(res["restore"]["restore"]["pid"]) == 0
    finally:
        stop = {"name": "stock", "root": str(lab.workloads), "state": "stopped"}
        lab.play([{"name": "stop", "warmstart.snapshot.workload": stop}])


def test_a_workload_runs_without_io_uring_and_its_copy_too(lab: Lab) -> None:
    port = free_port()
    lab.play([lab.start("ringed", port, 8, "--io-uring")])
    before = query(port)
    assert before["io_uring"] == "ENOSYS" and before["io_uring_now"] == "ENOSYS", before
    assert seccomp_mode(lab.pidfile_pid("ringed") or 0) == "2", "the workload runs without the filter"
    res = lab.play([lab.checkpoint("checkpoint", workload="ringed", leave_running=False),
                    lab.restore("restore", name="ringed")])
    assert res["checkpoint"]["changed"] and res["restore"]["changed"]
    after = query(port)
    assert after["token"] == before["token"], "what answers is not the restored workload"
    assert after["io_uring_now"] == "ENOSYS", f"the restored copy got io_uring: {after}"
    assert seccomp_mode(res["restore"]["restore"]["pid"]) == "2", "CRIU did not restore the seccomp filter"


@pytest.fixture
def outsider(lab: Lab) -> Iterator[Tuple[subprocess.Popen, int]]:
    """The lab's server started by hand, outside warmstart (nothing refuses it io_uring), and its port."""
    control = lab.tmp / "outsider" / "control"
    control.mkdir(parents=True)
    port = free_port()
    child = subprocess.Popen(  # pylint: disable=consider-using-with  # killed below
        ["/usr/bin/python3", str(lab.script), "--port", str(port), "--mb", "4", "--io-uring"],
        env={**os.environ, "SNAPSHOT_CONTROL_DIR": str(control)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_open(port) and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        ring = query(port)["io_uring"]
        if not isinstance(ring, int):
            pytest.skip(f"this kernel gives no io_uring to anyone ({ring}): nothing to refuse")
        yield child, port
    finally:
        child.kill()
        child.wait(10)


def test_a_tree_holding_io_uring_is_refused_before_anything_is_touched(
        lab: Lab, outsider: Tuple[subprocess.Popen, int]) -> None:
    child, port = outsider
    res = lab.play([lab.checkpoint("check", pid=child.pid, check=True, expect_fail=True),
                    lab.checkpoint("checkpoint", pid=child.pid, leave_running=False, expect_fail=True)])
    for task in ("check", "checkpoint"):
        got = res[task]
        assert got.get("failed"), f"{task}: a tree holding io_uring was not refused"
        text = got.get("msg", "") + " ".join(got.get("reasons") or [])
        assert f"pid {child.pid}" in text and "io_uring" in text and "warmstart.snapshot.workload" in text, got
        assert "Unknown shit" not in text, f"{task}: CRIU was run on it: {text}"
    assert child.poll() is None and proc_state(child.pid) not in ("T", "t"), "the source was touched"
    assert query(port)["pid"] == child.pid
    assert lab.published() == [] and lab.staging() == [], "a refused checkpoint left something in the store"
