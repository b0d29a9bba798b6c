"""Snapshots made with real files in an FsStore, for unit tests of the store and the manifest."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils import _store as st


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
    doc["files"] = st.record_files(staging.path)
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
