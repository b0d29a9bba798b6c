"""A workload holding MB MiB of a 64-byte random marker in memory (raw bytes, only in memory; very
compressible), and how tests find the marker: in the store's files, in a restored process's memory."""
from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

from .process_lab import Lab

MARKED = r'''
"""Holds MB MiB of a 64-byte random marker (raw bytes, only in memory); answers its state over TCP."""
import hashlib, json, os, socket, sys
port, mb, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
marker = os.urandom(64)
mem = bytearray(marker * ((mb << 20) // 64))
with open(out, "w") as handle:
    handle.write(marker.hex())  # outside the workload and the snapshot: how the test learns it
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(4)
ctl = os.environ["SNAPSHOT_CONTROL_DIR"]
with open(os.path.join(ctl, "ready-for-snapshot"), "w") as handle:
    handle.write("ready\n")
while True:
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(5)
        conn.recv(64)
        state = {"pid": os.getpid(), "marker": bytes(mem[:64]).hex(), "sha256": hashlib.sha256(mem).hexdigest(),
                 "whole": mem == bytearray(bytes(mem[:64]) * (len(mem) // 64))}
        conn.sendall((json.dumps(state) + "\n").encode())
'''


def write_kek(kek_dir: Path, name: str) -> None:
    kek_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (kek_dir / f"{name}.key").write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    (kek_dir / f"{name}.key").chmod(0o600)


def start(lab: Lab, name: str, port: int, mb: int = 16) -> Dict[str, Any]:
    script = lab.tmp / "marked.py"
    script.write_text(MARKED)
    return {"name": f"start {name}", "warmstart.snapshot.workload": {
        "name": name, "root": str(lab.workloads), "wait_ready": True, "ready_timeout": 120,
        "command": ["/usr/bin/python3", str(script), str(port), str(mb), str(lab.tmp / f"{name}.marker")]}}


def marker(lab: Lab, name: str) -> bytes:
    return bytes.fromhex((lab.tmp / f"{name}.marker").read_text())


def holders(top: Path, needle: bytes) -> List[str]:
    """Files under ``top`` whose bytes contain ``needle``."""
    return [str(p) for p in top.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


def running(lab: Lab) -> List[int]:
    found = subprocess.run(["pgrep", "-f", str(lab.tmp / "marked.py")], capture_output=True, text=True, check=False)
    return [int(x) for x in found.stdout.split()]


def in_memory(pid: int, needle: bytes) -> bool:
    """Whether the process ``pid`` holds ``needle`` in a writable mapping (read through /proc/<pid>/mem)."""
    with open(f"/proc/{pid}/maps", encoding="ascii") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False


def kill_marked(lab: Lab) -> None:
    """SIGKILL every marked workload of ``lab`` still running (a test's teardown)."""
    for pid in running(lab):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
