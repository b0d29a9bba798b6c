"""Compression at rest on real CRIU: a workload holding a repeated random marker in memory (compressible) is
checkpointed into a compressed filesystem store and a compressed and encrypted bucket (moto on loopback), and
restored on "another node" (another cache dir and record of verified files) with its memory bit-identical
(the workload's SHA256 of its memory, and the marker read from /proc/<pid>/mem); the stored page images are
smaller than the plaintext. A corrupted compressed chunk is refused before any process is touched; a lazy
restore and a page server serve a compressed snapshot.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .marked_lab import in_memory, kill_marked, marker, running, start, write_kek
from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration

MB = 48


@pytest.fixture(autouse=True)
def _stop_marked(lab: Lab) -> Iterator[None]:
    yield
    kill_marked(lab)


def another_node(lab: Lab, monkeypatch: pytest.MonkeyPatch, cache: Path, name: str) -> None:
    """This node forgets what it knew of its snapshots: its plaintext copies and its record of verified files."""
    shutil.rmtree(cache / "plain", ignore_errors=True)
    monkeypatch.setenv("WARMSTART_VERIFIED_DIR", str(lab.tmp / f"verified-{name}"))


def checkpointed(lab: Lab, name: str, opts: Dict[str, Any], store: Any = None) -> Dict[str, Any]:
    port = free_port()
    res = lab.play([start(lab, name, port, MB),
                    lab.checkpoint("checkpoint", store, workload=name, leave_running=False, store_options=opts)])
    return {"port": port, "snap": res["checkpoint"]["snapshot"]}


def manifest(lab: Lab, sid: str) -> Dict[str, Any]:
    return json.loads((lab.store / "snapshots" / sid / "manifest.json").read_text())


def check_restored(lab: Lab, name: str, port: int) -> None:
    state = query(port)
    mark = marker(lab, name)
    assert state["marker"] == mark.hex() and state["whole"], "the memory is back, every byte"
    assert [in_memory(pid, mark) for pid in running(lab)] == [True], "read from /proc/<pid>/mem"


def test_fs_store_compresses_and_restores_on_another_node(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMSTART_VERIFIED_DIR", str(lab.tmp / "verified-writer"))
    cache = lab.tmp / "cache"
    opts = {"compression": "zstd", "cache_dir": str(cache)}
    got = checkpointed(lab, "z", opts)
    snap = got["snap"]
    doc = manifest(lab, snap["id"])
    block = doc["compression"]
    pages = [rel for rel in block["files"] if "/pages-" in rel]
    assert pages, block
    plain = sum(block["files"][rel]["size"] for rel in pages)
    stored = sum((lab.store / "snapshots" / snap["id"] / rel).stat().st_size for rel in pages)
    assert plain >= MB << 20 and stored < plain // 10, (stored, plain)
    # the node that took it keeps its plaintext copy (0700/0600)
    copies = list((cache / "plain" / "zstd").rglob("pages-*.img"))
    assert copies and sum(p.stat().st_size for p in copies) == plain
    assert all(p.stat().st_mode & 0o077 == 0 for p in (cache / "plain").rglob("*"))
    another_node(lab, monkeypatch, cache, "b")
    lab.play([lab.restore("restore", snapshot=snap["id"], store_options=opts)])
    check_restored(lab, "z", got["port"])
    assert sum(p.stat().st_size for p in (cache / "plain" / "zstd").rglob("pages-*.img")) == plain
    # a node whose switch is off reads it too
    lab.play([lab.stop("z")])
    another_node(lab, monkeypatch, cache, "c")
    lab.play([lab.restore("restore, switch off", snapshot=snap["id"], store_options={"cache_dir": str(cache)})])
    check_restored(lab, "z", got["port"])


def test_a_corrupted_compressed_chunk_is_refused_before_anything_runs(lab: Lab,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = lab.tmp / "cache"
    opts = {"compression": "zstd", "cache_dir": str(cache)}
    snap = checkpointed(lab, "bad", opts)["snap"]
    doc = manifest(lab, snap["id"])
    rel = max(doc["compression"]["files"], key=lambda r: doc["compression"]["files"][r]["size"])
    path = lab.store / "snapshots" / snap["id"] / rel
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x20
    path.write_bytes(bytes(blob))
    another_node(lab, monkeypatch, cache, "b")
    res = lab.play([lab.restore("restore", snapshot=snap["id"], store_options=opts, expect_fail=True)])
    assert res["restore"]["failed"] and rel in res["restore"]["msg"], res["restore"]["msg"]
    assert not running(lab), "nothing may have been started"
    assert not lab.restore_root.exists() or not list(lab.restore_root.iterdir()), "nothing restored"
    assert not list((cache / "plain").rglob("*.img")), "no plaintext copy of a corrupted snapshot"


def test_bucket_compressed_and_encrypted_restores(lab: Lab, monkeypatch: pytest.MonkeyPatch,
                                                  s3: Dict[str, Any]) -> None:
    keys = lab.tmp / "keys"
    write_kek(keys / "kek", "fleet")
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys))
    opts = dict(s3["opts"], compression="zstd", compression_level=5, encryption=True)
    got = checkpointed(lab, "s", opts, s3["url"])
    snap = got["snap"]
    mark = marker(lab, "s")
    client, bucket = s3["client"], s3["bucket"]
    doc = json.loads(client.get_object(Bucket=bucket, Key=f"fleet/snapshots/{snap['id']}/manifest.json")["Body"]
                     .read())
    assert doc["encryption"] and doc["compression"]["level"] == 5
    plain = sum(e["size"] for e in doc["compression"]["files"].values())
    assert snap["size"] < plain // 10, (snap["size"], plain)
    for obj in client.list_objects_v2(Bucket=bucket, Prefix=f"fleet/snapshots/{snap['id']}/")["Contents"]:
        assert mark[:32] not in client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read(), obj["Key"]
    shutil.rmtree(s3["cache"], ignore_errors=True)  # another node: nothing cached
    another_node(lab, monkeypatch, s3["cache"], "b")
    res = lab.play([lab.restore("restore", s3["url"], snapshot=snap["id"], store_options=opts)])
    check_restored(lab, "s", got["port"])
    assert res["restore"]["restore"]["transfer"]["downloaded"] == snap["size"], "the compressed bytes moved"


def test_lazy_restore_and_page_server_from_a_compressed_snapshot(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = lab.tmp / "cache"
    opts = {"compression": "zstd", "cache_dir": str(cache)}
    got = checkpointed(lab, "lz", opts)
    snap = got["snap"]
    another_node(lab, monkeypatch, cache, "b")
    res = lab.play([lab.restore("lazy restore", snapshot=snap["id"], lazy=True, lazy_wait=True,
                                store_options=opts)])
    assert res["lazy restore"]["restore"]["lazy"]["used"] is True
    check_restored(lab, "lz", got["port"])
    lab.play([lab.stop("lz")])
    another_node(lab, monkeypatch, cache, "c")
    port = free_port()
    other = {"compression": "zstd", "cache_dir": str(lab.tmp / "client-cache")}
    res = lab.play([
        {"name": "serve", "warmstart.snapshot.page_server": {
            "store": str(lab.store), "snapshot": snap["id"], "address": "127.0.0.1", "port": port, "timeout": 120,
            "store_options": opts, "log_dir": str(lab.tmp / "ps")}},
        lab.restore("restore from page server", snapshot=snap["id"], page_server=f"127.0.0.1:{port}",
                    lazy_wait=True, store_options=other),
    ])
    out = res["restore from page server"]["restore"]
    assert out["lazy"]["used"] is True
    check_restored(lab, "lz", got["port"])
