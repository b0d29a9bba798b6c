"""node/_appsteps: probes and steps run against a real process, as that process sees the world.

The "server" is a small HTTP server in a child process (``SERVER``): it answers /health 503 until a delay has
passed and 200 after, records POSTs, writes a log line when it is up and a file on SIGUSR1. One test puts it in
a network namespace of its own, where only a probe that joins that namespace can reach it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _appsteps as aps
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf

SERVER = r'''
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port, delay, seen = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
up = time.monotonic() + delay
signal.signal(signal.SIGUSR1, lambda *_: open(seen + ".usr1", "w").close())

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self._send(200 if time.monotonic() >= up else 503, {"status": "ok" if time.monotonic() >= up else "loading"})
        else:
            self._send(404, {"detail": "Not Found"})
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(seen, "a") as f:
            f.write(json.dumps({"path": self.path, "body": body.decode(), "type": self.headers.get("Content-Type")}) + "\n")
        self._send(200 if self.path != "/fail" else 500, {"done": self.path})

server = HTTPServer(("127.0.0.1", port), H)
print("listening on", port, flush=True)
server.serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, tmp: Path, delay: float = 0.0, prefix: List[str] = ()) -> None:  # type: ignore[assignment]
        self.port = free_port()
        self.seen = tmp / "seen.jsonl"
        script = tmp / "server.py"
        script.write_text(SERVER)
        self.log = open(tmp / "stdout.log", "ab")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen([*prefix, sys.executable, str(script), str(self.port), str(delay), str(self.seen)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def posts(self) -> List[Dict[str, Any]]:
        return [json.loads(line) for line in self.seen.read_text().splitlines()] if self.seen.exists() else []

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path, delay=0.6)
    try:
        yield s
    finally:
        s.stop()


def probe(spec: Dict[str, Any], timeout: float = 10.0) -> pf.Probe:
    return pf.Probe(next(iter(spec)), next(iter(spec.values())), timeout, 0.05)


def test_an_http_probe_waits_through_503_until_200(server: Server) -> None:
    waited = aps.wait_probe(probe({"http": {"url": f"http://127.0.0.1:{server.port}/health", "body": '"ok"'}}),
                            server.pid, "ready")
    assert waited >= 0.3


def test_a_probe_that_never_passes_says_what_it_saw_last(server: Server) -> None:
    with pytest.raises(aps.AppStepError) as err:
        aps.wait_probe(probe({"http": {"url": f"http://127.0.0.1:{server.port}/nope"}}, timeout=1.0), server.pid,
                       "profile x: ready")
    assert "profile x: ready: HTTP GET" in str(err.value) and "did not pass within 1 s" in str(err.value)
    assert "status 404" in str(err.value)


def test_a_probe_stops_when_the_server_exits(server: Server) -> None:
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(aps.AppStepError, match="exited before"):
        aps.wait_probe(probe({"tcp": {"port": server.port}}), server.pid, "ready")


def test_tcp_log_and_file_probes(server: Server, tmp_path: Path) -> None:
    aps.wait_probe(probe({"tcp": {"port": server.port}}), server.pid, "ready")
    aps.wait_probe(probe({"log": {"regex": r"^listening on \d+$", "stream": "stdout"}}), server.pid, "ready")
    marker = tmp_path / "warm"
    with pytest.raises(aps.AppStepError, match="does not exist yet"):
        aps.wait_probe(probe({"file": {"path": str(marker)}}, timeout=0.3), server.pid, "ready")
    marker.write_text("")
    aps.wait_probe(probe({"file": {"path": str(marker)}}), server.pid, "ready")


def test_a_log_probe_from_an_offset_sees_only_new_lines(server: Server) -> None:
    log = probe({"log": {"regex": "listening", "stream": "any"}}, timeout=0.5)
    aps.wait_probe(log, server.pid, "ready")
    since = aps.log_sizes(server.pid, log)
    assert since and all(size > 0 for size in since.values())
    with pytest.raises(aps.AppStepError, match="no line matches"):
        aps.wait_probe(log, server.pid, "serving", since=since)


def test_steps_run_in_order_and_the_first_failure_names_itself(server: Server, tmp_path: Path) -> None:
    aps.wait_probe(probe({"http": {"url": f"http://127.0.0.1:{server.port}/health"}}), server.pid, "ready")
    touched = tmp_path / "touched"
    steps = [pf.Step("http", {"url": f"http://127.0.0.1:{server.port}/sleep?level=1", "json": {"a": 1}}),
             pf.Step("signal", "SIGUSR1"),
             pf.Step("command", ["/usr/bin/touch", str(touched)], 10.0)]
    done = aps.run_steps(steps, server.pid, "profile x: quiesce")
    assert [d["step"] for d in done] == [s.describe() for s in steps]
    assert server.posts() == [{"path": "/sleep?level=1", "body": '{"a": 1}', "type": "application/json"}]
    deadline = time.monotonic() + 5
    while not Path(str(server.seen) + ".usr1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(str(server.seen) + ".usr1").exists() and touched.exists()
    with pytest.raises(aps.AppStepError) as err:
        aps.run_steps([steps[0], pf.Step("http", {"url": f"http://127.0.0.1:{server.port}/fail"}), steps[1]],
                      server.pid, "profile x: release")
    assert err.value.step == f"profile x: release[1] (HTTP POST http://127.0.0.1:{server.port}/fail)"
    assert "status 500" in str(err.value)
    failing = pf.Step("command", ["/bin/sh", "-c", "echo nope >&2; exit 3"], 10.0)
    with pytest.raises(aps.AppStepError, match="exited 3: 'nope'"):
        aps.run_steps([failing], server.pid, "resume")


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")),
                    reason="needs root, unshare and ip to make a network namespace")
def test_http_reaches_a_server_in_its_own_network_namespace(tmp_path: Path) -> None:
    """A container's 127.0.0.1 is its own: only a probe that joins the server's namespace reaches it. (unshare
    and sh exec: the pid Popen started is the server's, in the new namespace.)"""
    outer = Server(tmp_path, prefix=["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"'])
    try:
        aps.wait_probe(probe({"http": {"url": f"http://127.0.0.1:{outer.port}/health"}}), outer.pid, "ready")
        assert os.stat(f"/proc/{outer.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
        done = aps.run_steps([pf.Step("http", {"url": f"http://127.0.0.1:{outer.port}/wake_up"})], outer.pid,
                             "release")
        assert done and outer.posts()[0]["path"] == "/wake_up"
        with socket.socket() as s:  # from here, the node's namespace, nothing listens there
            assert s.connect_ex(("127.0.0.1", outer.port)) != 0
    finally:
        outer.stop()
