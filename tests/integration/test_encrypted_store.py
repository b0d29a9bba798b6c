"""Encryption at rest on real CRIU: a workload holding a random marker in memory is checkpointed into an
encrypted filesystem store and an encrypted bucket (moto on loopback); no stored byte sequence holds the
marker, the restored process holds it again, and a wrong or missing key-encryption key is refused before
any process is touched. The bucket's objects also carry the provider's server-side encryption (SSE-KMS).
"""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration

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


@pytest.fixture
def keys(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's keys dir (WARMSTART_KEYS_DIR, as node_prep lays it out): one KEK, kek/fleet.key."""
    top = lab.tmp / "keys"
    write_kek(top / "kek", "fleet")
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(top))
    return top


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


@pytest.fixture(autouse=True)
def _stop_marked(lab: Lab) -> Iterator[None]:
    yield
    for pid in running(lab):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_fs_store_holds_no_plaintext_and_restores(lab: Lab, keys: Path) -> None:
    port = free_port()
    opts = {"encryption": True, "cache_dir": str(lab.tmp / "cache")}
    res = lab.play([start(lab, "m", port),
                    lab.checkpoint("checkpoint", workload="m", leave_running=False, store_options=opts)])
    snap = res["checkpoint"]["snapshot"]
    mark = marker(lab, "m")
    assert not holders(lab.store, mark), "the marker is stored in plaintext"
    assert not holders(lab.store, mark[:32]), "a part of the marker is stored in plaintext"
    # the node that took it keeps its decrypted copy (0700): it holds the marker, and a restore reuses it
    plain = lab.tmp / "cache" / "plain"
    assert holders(plain, mark) and all(d.stat().st_mode & 0o077 == 0 for d in plain.rglob("*"))
    shutil.rmtree(plain)  # another node's view: decrypt from the store
    res = lab.play([lab.restore("restore", snapshot=snap["id"], store_options=opts)])
    state = query(port)
    assert state["marker"] == mark.hex() and state["whole"], "the marker is back in the restored process"
    assert [in_memory(pid, mark) for pid in running(lab)] == [True], "read from /proc/<pid>/mem"
    assert not holders(lab.store, mark)


def test_wrong_or_missing_kek_is_refused_before_anything_runs(lab: Lab, keys: Path) -> None:
    port = free_port()
    opts = {"encryption": True, "cache_dir": str(lab.tmp / "cache")}
    snap = lab.play([start(lab, "k", port, 4),
                     lab.checkpoint("checkpoint", workload="k", leave_running=False, store_options=opts)])
    snap = snap["checkpoint"]["snapshot"]
    shutil.rmtree(lab.tmp / "cache" / "plain")
    shutil.rmtree(keys / "kek")
    write_kek(keys / "kek", "other")
    res = lab.play([
        lab.restore("wrong kek", snapshot=snap["id"], store_options=opts, expect_fail=True),
        lab.restore("no encryption", snapshot=snap["id"], store_options={"cache_dir": opts["cache_dir"]},
                    expect_fail=True),
        {"name": "drop keks", "ansible.builtin.file": {"path": str(keys / "kek"), "state": "absent"}},
        lab.restore("missing kek", snapshot=snap["id"], store_options=opts, expect_fail=True),
    ])
    assert "which is not in" in res["wrong kek"]["msg"] and "other" in res["wrong kek"]["msg"]
    assert "set store_options.encryption" in res["no encryption"]["msg"]
    assert "node_prep_keks" in res["missing kek"]["msg"]
    assert not running(lab), "nothing may have been started"
    assert not lab.restore_root.exists() or not list(lab.restore_root.iterdir()), "nothing restored"
    assert not (lab.tmp / "cache" / "plain").exists() or not list((lab.tmp / "cache" / "plain").rglob("*.img"))
    # no KEK to write with: the checkpoint is refused before CRIU touches the workload
    res = lab.play([start(lab, "k2", free_port(), 4),
                    lab.checkpoint("checkpoint without kek", workload="k2", store_options=opts, expect_fail=True)])
    assert "node_prep_keks" in res["checkpoint without kek"]["msg"]
    assert lab.published() == [snap["id"]] and not lab.staging()
    assert len(running(lab)) == 1 and open(f"/proc/{running(lab)[0]}/stat").read().split()[2] in "RS"


def test_bucket_holds_no_plaintext_carries_sse_and_restores(lab: Lab, keys: Path, s3: Dict[str, Any]) -> None:
    port = free_port()
    opts = dict(s3["opts"], encryption=True, sse="aws:kms", sse_kms_key_id="warmstart-test-key")
    res = lab.play([start(lab, "b", port),
                    lab.checkpoint("checkpoint", s3["url"], workload="b", leave_running=False, store_options=opts)])
    snap = res["checkpoint"]["snapshot"]
    mark = marker(lab, "b")
    client, bucket = s3["client"], s3["bucket"]
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"fleet/snapshots/{snap['id']}/")["Contents"]
    assert len(listed) > 3
    for obj in listed:
        body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        assert mark[:32] not in body, f"{obj['Key']} holds the marker in plaintext"
        head = client.head_object(Bucket=bucket, Key=obj["Key"])
        assert head["ServerSideEncryption"] == "aws:kms" and "warmstart-test-key" in head["SSEKMSKeyId"], obj["Key"]
    assert not holders(s3["cache"] / "s3", mark) if (s3["cache"] / "s3").exists() else True
    shutil.rmtree(s3["cache"] / "plain")  # another node's view: decrypt from the bucket
    res = lab.play([lab.restore("restore", s3["url"], snapshot=snap["id"], store_options=opts)])
    state = query(port)
    assert state["marker"] == mark.hex() and state["whole"]
    assert [in_memory(pid, mark) for pid in running(lab)] == [True]
    assert res["restore"]["restore"]["transfer"]["downloaded"] == snap["size"]
