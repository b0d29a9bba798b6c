"""restore ``tcp: keep | close`` on real CRIU: a workload that holds an ESTABLISHED TCP connection to a peer the
test controls (the test process itself, on 127.0.0.1) is checkpointed (``tcp: established``, the checkpoint's
default: CRIU dumps the connection's state) and restored on this node, into the host's network namespace.

- ``keep`` (and the default here: this node took the snapshot): the connection works on - the peer's next
  message is echoed, and the workload's own message reaches the peer;
- ``close``: the workload finds its connection closed (end of file, a write fails), the peer that writes to the
  old connection gets a reset, and the workload's listener still answers;
- into a podman placeholder the default closes a connection to a peer outside (the placeholder's network
  namespace is not the dump's) and keeps one whose both ends are in the snapshot over loopback; with both
  kinds at once, each gets its own (``mixed``).

TCP_APP is written over the lab's script (so the lab's cleanup kills its copies): it connects to ``--peer`` at
start, echoes what the peer sends (``echo:<line>``), and answers its listener (``--port``) with a JSON line of
its state; a request ``send`` first writes ``hello`` to the peer and reports how that went.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

from .ansible_run import REPO
from .container_lab import Pod, pod_for, wait_file
from .process_lab import Lab, free_port, json_line, needs_root_and_criu, query, read_line

pytestmark = pytest.mark.integration

TCP_APP = r'''
"""warmstart tcp test workload: one established connection to --peer, a listener on --port."""
import argparse, errno, json, os, select, socket

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--mb", type=int, default=0)
ap.add_argument("--peer", required=True, help="host:port to connect to at start")
ap.add_argument("--listen", default="127.0.0.1")
ap.add_argument("--inner", action="store_true", help="also hold a loopback connection to itself")
args = ap.parse_args()

ctl = os.environ["SNAPSHOT_CONTROL_DIR"]
host, port = args.peer.rsplit(":", 1)
peer = socket.create_connection((host, int(port)), timeout=10)
peer.settimeout(None)
state = {"peer": "open", "received": [], "sent": None, "counter": 0, "pid": os.getpid()}
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((args.listen, args.port))
srv.listen(16)
if args.inner:  # like a tensor-parallel server's workers and their store: a connection inside, over loopback
    inner_srv = socket.socket()
    inner_srv.bind(("127.0.0.1", 0))
    inner_srv.listen(1)
    client = socket.create_connection(inner_srv.getsockname())
    server, _ = inner_srv.accept()
    state.update(inner="open", rounds=0)
with open(os.path.join(ctl, "ready-for-snapshot.tmp"), "w") as handle:
    handle.write("warm\n")
os.rename(os.path.join(ctl, "ready-for-snapshot.tmp"), os.path.join(ctl, "ready-for-snapshot"))


def closed(exc):
    return "error " + errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else "error " + str(exc)


while True:
    watch = [srv] + ([peer] if state["peer"] == "open" else [])
    readable, _, _ = select.select(watch, [], [], 0.05)
    state["counter"] += 1
    if peer in readable:
        try:
            data = peer.recv(4096)
        except OSError as exc:
            state["peer"] = closed(exc)
        else:
            if not data:
                state["peer"] = "eof"
            else:
                state["received"].append(data.decode(errors="replace"))
                try:
                    peer.sendall(b"echo:" + data)
                except OSError as exc:
                    state["peer"] = closed(exc)
    if srv in readable:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            try:
                request = conn.recv(64)
            except OSError:
                continue
            if request.startswith(b"send"):
                try:
                    peer.sendall(b"hello\n")
                    state["sent"] = "ok"
                except OSError as exc:
                    state["sent"] = closed(exc)
            if state.get("inner") == "open":  # one round over the loopback connection: client -> server -> client
                try:
                    client.settimeout(5)
                    server.settimeout(5)
                    client.sendall(b"ping")
                    server.sendall(server.recv(4).upper())
                    back = client.recv(4)
                    state["inner"] = "open" if back == b"PING" else f"eof ({back!r})"
                    state["rounds"] += state["inner"] == "open"
                except OSError as exc:
                    state["inner"] = closed(exc)
            conn.sendall((json.dumps(state) + "\n").encode())
'''


@pytest.fixture
def peer() -> Iterator[socket.socket]:
    """The test's end of the workload's connection: a listener on 127.0.0.1 the workload connects to."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(30)
    try:
        yield srv
    finally:
        srv.close()


def exchange(conn: socket.socket, line: bytes, timeout: float = 15.0) -> bytes:
    """Send ``line`` to the workload over the connection; what it answers (up to a newline)."""
    conn.settimeout(timeout)
    conn.sendall(line)
    return read_line(conn)


def warm_connection(lab: Lab, peer: socket.socket, name: str) -> Tuple[int, socket.socket]:
    """Start the workload on a fresh port, accept its connection, check it echoes; (its port, our end)."""
    lab.script.write_text(TCP_APP)
    port = free_port()
    lab.play([lab.start(name, port, 0, "--peer", f"127.0.0.1:{peer.getsockname()[1]}")])
    conn = peer.accept()[0]
    assert exchange(conn, b"ping1\n") == b"echo:ping1\n"
    state = query(port)
    assert state["peer"] == "open" and state["received"] == ["ping1\n"]
    return port, conn


def checkpoint_and_restore(lab: Lab, name: str, tcp: Optional[str]) -> Dict[str, Any]:
    """Checkpoint the workload (tcp: established, its source ended), restore it here; the restore's result."""
    args: Dict[str, Any] = {"name": name}
    if tcp is not None:
        args["tcp"] = tcp
    results = lab.play([lab.checkpoint("checkpoint", workload=name, leave_running=False),
                        lab.restore("restore", **args)])
    options = results["checkpoint"]["snapshot"]
    assert options["source_running"] is False
    return results["restore"]["restore"]


SAME_NODE = "restored on node {host}, which took the snapshot, into the host's network namespace"


@pytest.mark.parametrize("tcp", [None, "keep"], ids=["default", "keep"])
def test_keep_on_the_node_that_took_the_snapshot_the_connection_works_on(
        lab: Lab, peer: socket.socket, tcp: Optional[str]) -> None:
    port, conn = warm_connection(lab, peer, "tcpkeep")
    with conn:
        restored = checkpoint_and_restore(lab, "tcpkeep", tcp)
        reason = SAME_NODE.format(host=socket.gethostname())
        if tcp == "keep":
            reason = f"tcp: keep was asked for (also the default: {reason})"
        assert (restored["tcp"]["mode"], restored["tcp"]["reason"]) == ("keep", reason)
        assert [(c["internal"], c["done"]) for c in restored["tcp"]["connections"]] == [(False, "kept")]
        # The same connection, restored: the peer's next message is echoed, the workload's own reaches the peer.
        assert exchange(conn, b"ping2\n") == b"echo:ping2\n"
        state = json_line(("127.0.0.1", port), b"send\n")
        assert state["peer"] == "open" and state["sent"] == "ok"
        assert state["received"] == ["ping1\n", "ping2\n"] and state["pid"] == 1
        conn.settimeout(15)
        assert conn.recv(64) == b"hello\n"


def test_close_the_workload_sees_its_connection_closed_and_the_peer_a_reset(lab: Lab, peer: socket.socket) -> None:
    port, conn = warm_connection(lab, peer, "tcpclose")
    with conn:
        restored = checkpoint_and_restore(lab, "tcpclose", "close")
        assert restored["tcp"]["reason"] == ("tcp: close was asked for (the default would be keep: "
                                             f"{SAME_NODE.format(host=socket.gethostname())})")
        assert [(c["internal"], c["done"]) for c in restored["tcp"]["connections"]] == [(False, "closed")]
        # The workload: its connection comes back closed - a read says end of file, a write fails.
        end = time.monotonic() + 15
        state = query(port)
        while state["peer"] == "open" and time.monotonic() < end:
            time.sleep(0.1)
            state = query(port)
        assert state["peer"] == "eof", state
        sent = json_line(("127.0.0.1", port), b"send\n")["sent"]
        assert sent is not None and sent.startswith("error E"), sent
        # Its listener was restored and answers (query above went through it); the memory is the snapshot's.
        assert state["received"] == ["ping1\n"] and state["pid"] == 1
        # The peer: the old connection is gone on the workload's side, so what it sends is answered by a reset.
        conn.settimeout(15)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            conn.sendall(b"ping2\n")
            conn.recv(64)
            conn.sendall(b"ping3\n")  # a reset that raced the first send is seen by the next one
            conn.recv(64)


# --- into a podman placeholder ------------------------------------------------------------

@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    yield from pod_for(tmp_path)


def host_peer(pod: Pod) -> Tuple[str, socket.socket]:
    """A listener on the host that the containers reach at their network's gateway: (the gateway, the listener)."""
    gateway = json.loads(pod.podman("network", "inspect", "podman").stdout)[0]["subnets"][0]["gateway"]
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("0.0.0.0", 0))
    srv.listen(4)
    srv.settimeout(60)
    return gateway, srv


def peer_closed(pod: Pod, ph: str) -> Dict[str, Any]:
    """The restored workload's state once it saw its connection to the peer closed (or after 15 s)."""
    end = time.monotonic() + 15
    state = json_line((pod.ip(ph), 8080), b"state\n")
    while state["peer"] == "open" and time.monotonic() < end:
        time.sleep(0.1)
        state = json_line((pod.ip(ph), 8080), b"state\n")
    return state


def test_into_a_placeholder_the_default_closes_the_connection(pod: Pod) -> None:
    """The source container's workload holds a connection to a peer on the host; restored into a placeholder
    (another network namespace, another address) it finds that connection closed, its listener answers."""
    (pod.app / "tcp_app.py").write_text(TCP_APP)
    gateway, srv = host_peer(pod)
    port = srv.getsockname()[1]
    with srv:
        src = pod.run("tcpsrc", "python3", "/app/tcp_app.py", "--port", "8080", "--listen", "0.0.0.0",
                      "--peer", f"{gateway}:{srv.getsockname()[1]}")
        wait_file(pod.control("tcpsrc") / "ready-for-snapshot", 60)
        conn = srv.accept()[0]
        with conn:
            assert exchange(conn, b"ping1\n") == b"echo:ping1\n"
            assert json_line((pod.ip(src), 8080), b"state\n")["peer"] == "open"
            ph = pod.placeholder("tcpph")
            results = pod.play([pod.checkpoint("checkpoint", container=src, leave_running=False),
                                pod.restore("restore", name=src, into={"container": ph})], "tcp")
    dest = results["restore"]["restore"]["destinations"][0]
    assert dest["result"] == "succeeded"
    assert dest["tcp"]["mode"] == "close" and dest["tcp"]["reason"] == (
        f"restored into placeholder {ph}'s network namespace: 1 of the 1 established connections lead out of the "
        "snapshot or use the source's own address")
    (listed,) = dest["tcp"]["connections"]
    assert (listed["internal"], listed["done"]) == (False, "closed") and listed["remote"] == f"{gateway}:{port}"
    state = peer_closed(pod, ph)
    assert state["peer"] == "eof" and state["received"] == ["ping1\n"], state


@pytest.mark.parametrize("verify", [True, False], ids=["verified-copy", "store-in-place"])
def test_into_a_placeholder_the_loopback_connection_stays_and_the_one_leaving_closes(pod: Pod, verify: bool) -> None:
    """The source container's workload holds a loopback connection to itself and one to a peer on the host: the
    default restore into a placeholder keeps the first (it carries a round there) and closes the second (end of
    file) - the closed one rewritten in the restore's own copy of files.img (the verified copy, or beside links
    to a store read in place without verify)."""
    (pod.app / "tcp_app.py").write_text(TCP_APP)
    gateway, srv = host_peer(pod)
    port = srv.getsockname()[1]
    with srv:
        src = pod.run("mixsrc", "python3", "/app/tcp_app.py", "--port", "8080", "--listen", "0.0.0.0", "--inner",
                      "--peer", f"{gateway}:{port}")
        wait_file(pod.control("mixsrc") / "ready-for-snapshot", 60)
        conn = srv.accept()[0]
        with conn:
            assert exchange(conn, b"ping1\n") == b"echo:ping1\n"
            before = json_line((pod.ip(src), 8080), b"state\n")
            assert (before["peer"], before["inner"], before["rounds"]) == ("open", "open", 1), before
            ph = pod.placeholder("mixph")
            results = pod.play([pod.checkpoint("checkpoint", container=src, leave_running=False),
                                pod.restore("restore", name=src, into={"container": ph}, verify=verify)], "mixed")
    dest = results["restore"]["restore"]["destinations"][0]
    assert dest["result"] == "succeeded", dest
    assert dest["tcp"]["mode"] == "mixed" and dest["tcp"]["reason"] == (
        f"2 of the 3 established connections have both ends in the snapshot, over loopback, and are kept in "
        f"placeholder {ph}'s network namespace; the other 1 lead out of it or use the source's own address, and "
        "are closed"), dest["tcp"]
    done = sorted((c["internal"], c["done"], c["remote"]) for c in dest["tcp"]["connections"])
    assert [d[:2] for d in done] == [(False, "closed"), (True, "kept"), (True, "kept")], done
    assert done[0][2] == f"{gateway}:{port}"
    state = peer_closed(pod, ph)
    assert state["peer"] == "eof" and state["received"] == ["ping1\n"], state
    assert state["inner"] == "open" and state["rounds"] >= 2, state  # the kept connection carried rounds here
    assert not list(pod.restore_root.glob("*/tcp-images")) and not list(pod.restore_root.glob("*/snapshot"))


LOOP_APP = r'''
"""warmstart tcp test workload: a connection from itself to itself over loopback; --port answers its state."""
import json, os, socket

inner = socket.socket()
inner.bind(("127.0.0.1", 0))
inner.listen(1)
client = socket.create_connection(inner.getsockname())
server, _ = inner.accept()
state = {"inner": "open", "rounds": 0, "pid": os.getpid()}
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8080))
srv.listen(16)
ctl = os.environ["SNAPSHOT_CONTROL_DIR"]
with open(os.path.join(ctl, "ready-for-snapshot.tmp"), "w") as handle:
    handle.write("warm\n")
os.rename(os.path.join(ctl, "ready-for-snapshot.tmp"), os.path.join(ctl, "ready-for-snapshot"))
while True:
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(5)
        try:
            conn.recv(64)
        except OSError:
            continue
        if state["inner"] == "open":  # one round over the loopback connection: client -> server -> client
            try:
                server.settimeout(5)
                client.settimeout(5)
                client.sendall(b"ping")
                got = server.recv(4)
                server.sendall(got.upper())
                back = client.recv(4)
                state["inner"] = "open" if back == b"PING" else f"eof ({back!r})"
                state["rounds"] += state["inner"] == "open"
            except OSError as exc:
                state["inner"] = f"error {exc}"
        conn.sendall((json.dumps(state) + "\n").encode())
'''


def test_into_a_placeholder_a_connection_inside_the_container_is_kept(pod: Pod) -> None:
    """Two ends of one loopback connection inside the source container: both are in the snapshot, so the default
    keeps it in the placeholder's network namespace, and it carries data there."""
    (pod.app / "loop_app.py").write_text(LOOP_APP)
    src = pod.run("loopsrc", "python3", "/app/loop_app.py")
    wait_file(pod.control("loopsrc") / "ready-for-snapshot", 60)
    assert json_line((pod.ip(src), 8080), b"state\n")["rounds"] == 1
    ph = pod.placeholder("loopph")
    results = pod.play([pod.checkpoint("checkpoint", container=src, leave_running=False),
                        pod.restore("restore", name=src, into={"container": ph})], "loop")
    dest = results["restore"]["restore"]["destinations"][0]
    assert dest["result"] == "succeeded", dest
    assert dest["tcp"]["mode"] == "keep" and dest["tcp"]["reason"].startswith(
        "every established connection (2) has both ends in the snapshot"), dest["tcp"]
    assert sorted((c["internal"], c["done"]) for c in dest["tcp"]["connections"]) == [(True, "kept"), (True, "kept")]
    state = json_line((pod.ip(ph), 8080), b"state\n")
    assert (state["inner"], state["rounds"]) == ("open", 2), state  # the restored connection carried a round
    assert json_line((pod.ip(ph), 8080), b"state\n")["rounds"] == 3


def tcp_module(function: str, images: Path) -> Any:
    """``_tcp.<function>(images)`` as a checkpoint runs it: in the node's module interpreter, which has pycriu."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp; "
            f"print(json.dumps(_tcp.{function}(sys.argv[2])))")
    done = subprocess.run(["/usr/bin/python3", "-c", code, str(REPO / ".collections"), str(images)],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_connections_of_a_real_dump_are_listed_with_which_stay_inside(tmp_path: Path) -> None:
    """A process with a loopback connection to itself and one to a peer outside, dumped by this node's CRIU (the
    session fixture prepared it): ``_tcp.connections`` tells the two apart, as a checkpoint records them."""
    needs_root_and_criu()
    criu = shutil.which("criu") or "/usr/local/bin/criu"
    peer = socket.socket()
    peer.bind(("127.0.0.2", 0))
    peer.listen(1)
    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(2); "
            "c = socket.create_connection(s.getsockname()); a, _ = s.accept(); "
            "o = socket.create_connection(('127.0.0.2', int(sys.argv[1]))); print('ok', flush=True); time.sleep(60)")
    app = subprocess.Popen([sys.executable, "-c", code, str(peer.getsockname()[1])], stdout=subprocess.PIPE,
                           text=True, start_new_session=True)
    out = None
    try:
        assert app.stdout and app.stdout.readline().strip() == "ok"
        out = peer.accept()[0]
        images = tmp_path / "images"
        images.mkdir()
        done = subprocess.run([criu, "dump", "-t", str(app.pid), "-D", str(images), "--tcp-established", "--shell-job",
                               "--leave-running", "-o", "dump.log"], capture_output=True, text=True, check=False)
        assert done.returncode == 0, (images / "dump.log").read_text()[-2000:]
        conns = tcp_module("connections", images)
        assert sorted(c["internal"] for c in conns) == [False, True, True], conns
        inside = [c for c in conns if c["internal"]]
        assert {inside[0]["local"], inside[0]["remote"]} == {inside[1]["local"], inside[1]["remote"]}
        (outside,) = [c for c in conns if not c["internal"]]
        assert outside["remote"] == f"127.0.0.2:{peer.getsockname()[1]}" and outside["local"].startswith("127.0.0.")
        assert tcp_module("listed", images) == conns and tcp_module("connections", tmp_path) == []  # no files.img
        rewritten = tmp_path / "rewritten"
        rewritten.mkdir()
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
                "from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp; "
                "data, closed = _tcp.close_in_images(sys.argv[2], [(c['local'], c['remote']) for c in json.loads(sys.argv[4])]); "
                "open(sys.argv[3] + '/files.img', 'wb').write(data); print(json.dumps(closed))")
        done = subprocess.run(["/usr/bin/python3", "-c", code, str(REPO / ".collections"), str(images), str(rewritten),
                               json.dumps(inside)], capture_output=True, text=True, check=False, timeout=60)
        assert done.returncode == 0 and json.loads(done.stdout) == 1, done.stderr[-2000:]
        assert tcp_module("connections", rewritten) == inside  # the one leaving is a closed socket now
        (images / "files.img").write_bytes(b"\0" * 8 + b"\xff\xff\xff\x0f" + b"\x01" * 12)
        assert tcp_module("listed", images) is None  # undecodable: no list (a restore then closes)
    finally:
        app.kill()
        app.wait()
        peer.close()
        if out is not None:
            out.close()
