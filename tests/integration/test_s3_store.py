"""S3 snapshot stores against a real S3-compatible server on loopback (moto's server, started here).

Checkpoints upload, restores fetch into a verified node cache (reused when intact, fetched again when
corrupt), a corrupt object is refused before any process is touched, an unreachable store or wrong
credentials fail before the checkpoint, downloads resume where they stopped, and retention works on
the bucket.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _s3store as s3s
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st

from .process_lab import Lab, free_port, needs_root_and_criu, query
from .s3_lab import SECRET, keys, serve

pytestmark = pytest.mark.integration


def no_secret(results: Dict[str, Any]) -> None:
    assert SECRET not in json.dumps(results), "a credential leaked into module output"


def test_checkpoint_uploads_and_restore_uses_a_verified_cache(lab: Lab, s3: Dict[str, Any]) -> None:
    port = free_port()
    store, opts = s3["url"], s3["opts"]
    res = lab.play([lab.start("w", port, 24),
                    lab.checkpoint("checkpoint", store, workload="w", leave_running=False, store_options=opts)])
    snap = res["checkpoint"]["snapshot"]
    token = lab.token("w")
    objects = keys(s3)
    prefix = f"fleet/snapshots/{snap['id']}/"
    assert f"{prefix}manifest.json" in objects
    assert any(k.startswith(f"{prefix}containers/w/criu/pages-") for k in objects)
    assert sum(v for k, v in objects.items() if k != f"{prefix}manifest.json") == snap["size"]
    assert snap["transfer"]["uploaded"] == sum(objects.values()), "every byte uploaded once, manifest included"
    cached = s3["cache"] / "s3" / f"{s3['bucket']}__fleet" / snap["id"]
    assert (cached / "manifest.json").is_file(), "the staged copy should stay as this node's cache"

    res = lab.play([
        {"name": "info", "warmstart.snapshot.snapshot_info": {"store": store, "store_options": opts}},
        lab.restore("restore from cache", store, snapshot=snap["id"], store_options=opts),
    ])
    assert [s["id"] for s in res["info"]["snapshots"]] == [snap["id"]]
    transfer = res["restore from cache"]["restore"]["transfer"]
    assert transfer["downloaded"] == 0 and transfer["reused"] == snap["size"]
    assert query(port)["token"] == token
    no_secret(res)

    # a corrupted cached file is noticed and fetched again; a missing cache is fetched whole
    page = next(cached.glob("containers/w/criu/pages-*.img"))
    with open(page, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\0" * 4096)
    res = lab.play([lab.stop("w"), lab.restore("restore, cache corrupt", store, snapshot=snap["id"], store_options=opts)])
    transfer = res["restore, cache corrupt"]["restore"]["transfer"]
    assert transfer["downloaded"] == page.stat().st_size and transfer["reused"] == snap["size"] - transfer["downloaded"]
    assert query(port)["token"] == token
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(cached)
    res = lab.play([lab.stop("w"), lab.restore("restore, no cache", store, snapshot=snap["id"], store_options=opts)])
    assert res["restore, no cache"]["restore"]["transfer"]["downloaded"] == snap["size"]
    assert query(port)["token"] == token


def test_corrupt_object_is_refused_before_any_process_starts(lab: Lab, s3: Dict[str, Any]) -> None:
    port = free_port()
    store, opts = s3["url"], s3["opts"]
    snap = lab.play([lab.start("c", port, 8), lab.checkpoint("checkpoint", store, workload="c", leave_running=False,
                                                             store_options=opts)])["checkpoint"]["snapshot"]
    key = next(k for k in keys(s3) if "/pages-" in k and snap["id"] in k)
    body = bytearray(s3["client"].get_object(Bucket=s3["bucket"], Key=key)["Body"].read())
    body[100] ^= 0xFF
    s3["client"].put_object(Bucket=s3["bucket"], Key=key, Body=bytes(body))
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(s3["cache"])
    res = lab.play([lab.restore("restore", store, expect_fail=True, snapshot=snap["id"], store_options=opts)])["restore"]
    assert res["failed"] and "SHA256 of the download does not match" in res["msg"] and key in res["msg"]
    assert lab.ours() == [], "a process was started from a corrupt snapshot"
    bad = key.split(f"{snap['id']}/", 1)[1]
    kept = [p for p in s3["cache"].rglob("*") if str(p).endswith((bad, f"{bad}.part"))]
    assert kept == [], "a corrupt download was kept in the cache (intact files may stay: they were verified)"


def test_bad_store_fails_before_the_checkpoint(lab: Lab, s3: Dict[str, Any]) -> None:
    port = free_port()
    closed = free_port()
    strict_port = free_port()
    strict = serve(strict_port, INITIAL_NO_AUTH_ACTION_COUNT="0")
    try:
        cases = {
            "unreachable": (s3["url"], dict(s3["opts"], endpoint_url=f"http://127.0.0.1:{closed}"), "cannot reach"),
            "no bucket": (f"s3://nope-{uuid.uuid4().hex[:8]}/x", s3["opts"], "does not exist"),
            "bad credentials": (s3["url"], dict(s3["opts"], endpoint_url=f"http://127.0.0.1:{strict_port}"),
                                "access denied (check the credentials"),
        }
        tasks = [lab.start("b", port, 8)]
        for case, (store, opts, _needle) in cases.items():
            tasks.append(lab.checkpoint(case, store, expect_fail=True, workload="b", leave_running=False,
                                        store_options=opts))
        res = lab.play(tasks)
    finally:
        strict.kill()
        strict.wait()
    for case, (_store, _opts, needle) in cases.items():
        assert res[case]["failed"] and needle in res[case]["msg"], (case, res[case]["msg"])
    assert query(port)["token"] == lab.token("b"), "the source must keep running"
    no_secret(res)


def test_download_resumes_where_it_stopped(s3: Dict[str, Any], lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3s, "PART", 1 << 20)
    store = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "c1"), concurrency=1)
    sid = mf.new_id()
    staging = store.stage(sid)
    blob = os.urandom(5 << 20)
    (Path(staging.path) / "data.bin").write_bytes(blob)
    manifest = mf.new_manifest(sid, "resume", {}, {"hostname": "x"})
    manifest["files"] = ck.record_files(staging.path)
    staging.publish(manifest)

    reader = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "c2"), concurrency=1)
    calls = {"n": 0}
    real = reader.client.get_object

    def flaky(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 3:  # the manifest, then two ranges
            raise ConnectionError("network went away")
        return real(**kwargs)

    monkeypatch.setattr(reader.client, "get_object", flaky)
    with pytest.raises(st.StoreError, match="network went away"):
        reader.local_dir(sid)
    part = Path(reader.cache_dir(sid)) / "data.bin.part"
    assert part.exists() and len((Path(f"{part}.done")).read_text().split()) == 2
    calls["n"] = -100
    local = reader.local_dir(sid)
    assert calls["n"] == -100 + 1 + 3, "only the 3 missing ranges (plus the manifest) should be fetched again"
    assert (Path(local) / "data.bin").read_bytes() == blob and not part.exists()


def publish_pages(s3: Dict[str, Any], lab: Lab, size: int, label: str) -> Dict[str, Any]:
    """A snapshot of one random ``pages-1.img`` of ``size`` bytes with 1 MiB chunk digests, published to the
    bucket (``PART`` is 1 MiB in these tests); its id, the bytes and the manifest."""
    store = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "c1"), concurrency=1)
    sid = mf.new_id()
    staging = store.stage(sid)
    blob = os.urandom(size)
    (Path(staging.path) / "pages-1.img").write_bytes(blob)
    manifest = mf.new_manifest(sid, label, {}, {"hostname": "x"})
    manifest["files"] = [dg.hash_file(str(Path(staging.path) / "pages-1.img"), "pages-1.img", chunk_size=1 << 20)]
    staging.publish(manifest)
    return {"id": sid, "blob": blob, "manifest": manifest}


def test_a_download_cut_mid_chunk_resumes(s3: Dict[str, Any], lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection drops half-way through a chunk: the half-written range is not in the ledger (only
    verified ranges are), so the next run fetches it again whole and the file comes out intact."""
    monkeypatch.setattr(s3s, "PART", 1 << 20)
    published = publish_pages(s3, lab, (4 << 20) + 777, "cut")
    sid, blob = published["id"], published["blob"]

    reader = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "c2"), concurrency=1)
    real = reader.client.get_object

    class Cut:
        """A body that breaks after half a chunk."""

        def __init__(self, body: Any) -> None:
            self.body, self.sent = body, 0

        def read(self, size: int = -1) -> bytes:
            if self.sent >= 1 << 19:
                raise ConnectionError("connection reset mid-chunk")
            data = self.body.read(min(size, (1 << 19) - self.sent) if size > 0 else (1 << 19) - self.sent)
            self.sent += len(data)
            return bytes(data)

    def cut_third_range(**kwargs: Any) -> Any:
        resp = real(**kwargs)
        if kwargs.get("Range", "").startswith(f"bytes={2 << 20}-"):
            resp["Body"] = Cut(resp["Body"])
        return resp

    monkeypatch.setattr(reader.client, "get_object", cut_third_range)
    with pytest.raises(st.StoreError, match="connection reset mid-chunk"):
        reader.local_dir(sid)
    ledger = Path(reader.cache_dir(sid)) / "pages-1.img.part.done"
    kept = {int(x) for x in ledger.read_text().split()}
    assert {0, 1 << 20} <= kept and (2 << 20) not in kept, "the verified ranges are kept, the cut one is not"
    fetched: List[Any] = []
    monkeypatch.setattr(reader.client, "get_object", lambda **kw: fetched.append(kw.get("Range")) or real(**kw))
    local = reader.local_dir(sid)
    assert (Path(local) / "pages-1.img").read_bytes() == blob
    ends = {0: (1 << 20) - 1, 1 << 20: (2 << 20) - 1, 2 << 20: (3 << 20) - 1, 3 << 20: (4 << 20) - 1,
            4 << 20: (4 << 20) + 776}
    assert sorted(r for r in fetched if r) == sorted(f"bytes={o}-{e}" for o, e in ends.items() if o not in kept), \
        "exactly the ranges not verified before are fetched again, the cut one whole"


def test_chunks_are_checked_as_they_arrive(s3: Dict[str, Any], lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with chunk digests is checked range by range while it downloads: a corrupt chunk is named, the
    intact ranges are kept, and once the object is good again only the bad range is fetched."""
    monkeypatch.setattr(s3s, "PART", 1 << 20)
    published = publish_pages(s3, lab, (5 << 20) + 99, "chunks")
    sid, blob = published["id"], published["blob"]
    assert len(published["manifest"]["files"][0]["chunks"]["sha256"]) == 6
    reader = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "c2"), concurrency=1)
    key = reader.key(sid, "pages-1.img")
    bad = bytearray(blob)
    bad[(2 << 20) + 5] ^= 0xFF
    s3["client"].put_object(Bucket=s3["bucket"], Key=key, Body=bytes(bad))
    with pytest.raises(st.StoreError, match=r"chunk 2 \(bytes 2097152-3145727\) does not match its SHA256"):
        reader.local_dir(sid)
    ledger = Path(reader.cache_dir(sid)) / "pages-1.img.part.done"
    kept = {int(x) for x in ledger.read_text().split()}
    assert {0, 1 << 20} <= kept and (2 << 20) not in kept, "the ranges before the bad one were verified and kept"
    s3["client"].put_object(Bucket=s3["bucket"], Key=key, Body=blob)
    calls = {"n": 0}
    real = reader.client.get_object

    def counted(**kwargs: Any) -> Any:
        calls["n"] += 1
        return real(**kwargs)

    monkeypatch.setattr(reader.client, "get_object", counted)
    local = reader.local_dir(sid)
    assert calls["n"] == 1 + 6 - len(kept), "the manifest and the ranges not yet verified, the bad one among them"
    assert (Path(local) / "pages-1.img").read_bytes() == blob


def test_cleanup_removes_old_snapshots_and_unpublished_uploads(lab: Lab, s3: Dict[str, Any]) -> None:
    needs_root_and_criu()
    port = free_port()
    store, opts = s3["url"], s3["opts"]
    res = lab.play([lab.start("r", port, 4),
                    lab.checkpoint("first", store, workload="r", store_options=opts),
                    lab.checkpoint("second", store, workload="r", store_options=opts)])
    first, second = res["first"]["snapshot"]["id"], res["second"]["snapshot"]["id"]
    orphan = mf.new_id()
    s3["client"].put_object(Bucket=s3["bucket"], Key=f"fleet/snapshots/{orphan}/containers/r/criu/pages-1.img", Body=b"x")
    res = lab.play([
        {"name": "info", "warmstart.snapshot.snapshot_info": {"store": store, "store_options": opts}},
        {"name": "cleanup", "warmstart.snapshot.cleanup": {"store": store, "store_options": opts, "keep_last": 1,
                                                           "incomplete_older_than": 0}},
    ])
    assert f"{s3['url']}/snapshots/{orphan}" in [e["path"] for e in res["info"]["staging"]]
    assert [e["id"] for e in res["cleanup"]["removed"]] == [first]
    left = {k.split("/")[2] for k in keys(s3)}
    assert left == {second}, left


def test_snapshot_deleted_while_a_node_downloads_it(s3: Dict[str, Any], lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another node's cleanup removes the snapshot mid-download: a clear error, nothing half-used."""
    monkeypatch.setattr(s3s, "PART", 1 << 20)
    writer = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "w"), concurrency=1)
    sid = mf.new_id()
    staging = writer.stage(sid)
    (Path(staging.path) / "data.bin").write_bytes(os.urandom(4 << 20))
    manifest = mf.new_manifest(sid, "gone", {}, {"hostname": "x"})
    manifest["files"] = ck.record_files(staging.path)
    staging.publish(manifest)

    reader = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "r"), concurrency=1)
    real = reader.client.get_object
    calls = {"n": 0}

    def deleting(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # manifest, one range, then the snapshot is removed by someone else
            writer.delete(sid)
        return real(**kwargs)

    monkeypatch.setattr(reader.client, "get_object", deleting)
    with pytest.raises(st.StoreError, match=r"downloading data.bin: not found"):
        reader.local_dir(sid)
    assert not (Path(reader.cache_dir(sid)) / "data.bin").exists(), "an incomplete file must never look complete"
    assert not reader.verified.get(sid)
    assert [k for k in keys(s3) if sid in k] == []


def progress_lines(run: Any, action: str) -> list:
    return [line for line in run.stderr.splitlines() if line.startswith(f"[localhost] warmstart.snapshot.{action}: ")]


def test_long_transfers_show_progress(lab: Lab, s3: Dict[str, Any]) -> None:
    """Upload and download print 'phase: done of total (pct), rate' lines while they run; JSON stdout stays whole."""
    port = free_port()
    store, opts = s3["url"], s3["opts"]
    progress = lab.tmp / "progress.json"
    res = lab.play([lab.start("p", port, 384),
                    lab.checkpoint("checkpoint", store, workload="p", leave_running=False, store_options=opts,
                                   progress_interval=0.2, progress_file=str(progress))])
    snap = res["checkpoint"]["snapshot"]
    lines = progress_lines(lab.last, "checkpoint")
    assert any(re.match(r".*upload: [\d.]+ \w+ of [\d.]+ MiB \(\d+%\), [\d.]+ \w+/s", ln) for ln in lines), lines
    # the file the module kept: finished, with every phase it went through and its seconds
    doc = json.loads(progress.read_text())
    assert doc["phase"] == "done" and {"dump", "checksum", "upload"} <= set(doc["phases"]), doc
    assert oct(progress.stat().st_mode & 0o777) == "0o644"

    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(s3["cache"])
    res = lab.play([lab.restore("restore", store, snapshot=snap["id"], store_options=opts, progress_interval=0.2)])
    assert res["restore"]["restore"]["transfer"]["downloaded"] == snap["size"]
    lines = progress_lines(lab.last, "restore")
    downloads = [ln for ln in lines if ": download: " in ln]
    assert downloads, lines
    pct = [int(m.group(1)) for m in (re.search(r"\((\d+)%\)", ln) for ln in downloads) if m]
    assert pct == sorted(pct) and all(0 <= p <= 100 for p in pct), downloads
    assert query(port)["token"] == lab.token("p")

    # progress_interval 0: no lines (and the result is the same module result)
    res = lab.play([lab.stop("p"), lab.restore("quiet", store, snapshot=snap["id"], store_options=opts,
                                               progress_interval=0)])
    assert res["quiet"]["restore"]["id"] == snap["id"] and progress_lines(lab.last, "restore") == []
