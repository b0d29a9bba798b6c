"""Snapshots made with real files in an FsStore, for unit tests of the store and the manifest."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st


def make_snapshot(store: st.FsStore, name: str = "embed", labels: Dict[str, str] | None = None,
                  payload: bytes = b"memory pages " * 1000) -> Dict[str, Any]:
    """Stage files, record them, publish; returns the manifest."""
    snapshot_id = mf.new_id()
    staging = store.stage(snapshot_id)
    images = os.path.join(staging.path, "containers", name, "criu")
    os.makedirs(images, mode=0o755)
    with open(os.path.join(images, "pages-1.img"), "wb") as handle:
        handle.write(payload)
    with open(os.path.join(images, "core-1.img"), "wb") as handle:
        handle.write(b"core")
    os.chmod(os.path.join(images, "core-1.img"), 0o644)
    doc = mf.new_manifest(snapshot_id, name, labels or {}, {"hostname": "node-a"})
    doc["files"] = ck.record_files(staging.path)
    doc["size"] = sum(f["size"] for f in doc["files"])
    doc["targets"] = [{"name": name, "kind": "process", "path": f"containers/{name}"}]
    staging.publish(doc)
    return doc


def tree(top: Path) -> List[Tuple[str, int, int, int]]:
    """Every entry under ``top`` with its mode, size and mtime: what "check mode changed nothing" compares."""
    out = []
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            info = os.lstat(os.path.join(dirpath, name))
            out.append((os.path.relpath(os.path.join(dirpath, name), top), info.st_mode, info.st_size, info.st_mtime_ns))
    return sorted(out)


def publish_images(store: Any, images: Dict[str, bytes], name: str = "w") -> Dict[str, Any]:
    """Stage ``images`` (file name -> bytes) as CRIU would in ``containers/<name>/criu``, record them, publish
    through ``store`` (any ``Store``); returns the manifest as loaded back."""
    sid = mf.new_id()
    staging = store.stage(sid)
    top = os.path.join(staging.path, "containers", name, "criu")
    os.makedirs(top, mode=0o700)
    for fname, data in images.items():
        with open(os.path.join(top, fname), "wb") as handle:
            handle.write(data)
    doc = mf.new_manifest(sid, name, {}, {"hostname": "node-a"})
    doc["files"] = [{k: e[k] for k in ("path", "size", "sha256")} for e in ck.record_files(staging.path)]
    doc["targets"] = [{"name": name, "kind": "process", "path": f"containers/{name}"}]
    staging.publish(doc)
    return store.load(sid)  # type: ignore[no-any-return]


def moto_bucket(monkeypatch: pytest.MonkeyPatch, bucket: str) -> Iterator[Any]:
    """An S3 client on moto in process with ``bucket`` created, and test credentials in the environment."""
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    for k, v in (("AWS_ACCESS_KEY_ID", "t"), ("AWS_SECRET_ACCESS_KEY", "t"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with moto.mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=bucket)
        yield client
