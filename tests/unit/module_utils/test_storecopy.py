"""The verified private copy (_storecopy): what is hashed is what lands in our copy; deferred files are copied whole."""
from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils import _storecopy as sc


def entry(rel: str, data: bytes, chunk: int = 0) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if chunk:
        doc["chunks"] = {"size": chunk, "sha256": [hashlib.sha256(data[i:i + chunk]).hexdigest()
                                                   for i in range(0, len(data), chunk)]}
    return doc


@pytest.fixture(params=["copy_file_range", "read and write"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a deferred file is copied: in the kernel, and read/write where the kernel refuses (EXDEV)."""
    if request.param == "read and write":
        def refuse(*_args: Any) -> int:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        monkeypatch.setattr(os, "copy_file_range", refuse)
    return str(request.param)


def test_hashed_and_deferred_files_land_whole(tmp_path: Path, kernel: str) -> None:
    src, dst = tmp_path / "store", tmp_path / "work"
    (src / "criu").mkdir(parents=True)
    pages, core = os.urandom(3 << 20 | 4097), os.urandom(5000)
    (src / "criu" / "pages-1.img").write_bytes(pages)
    (src / "criu" / "core-1.img").write_bytes(core)
    items = [(entry("criu/pages-1.img", pages, 1 << 20), str(dst / "pages-1.img")),
             (entry("criu/core-1.img", core), str(dst / "core-1.img"))]
    problems, deferred = sc.copy_verified(str(src), items, {"criu/pages-1.img"})
    assert problems == [], kernel
    assert (dst / "pages-1.img").read_bytes() == pages and (dst / "core-1.img").read_bytes() == core
    assert [(path, e["path"]) for path, e in deferred] == [(str(dst / "pages-1.img"), "criu/pages-1.img")]
    assert dg.file_matches(str(dst / "pages-1.img"), items[0][0])
    assert oct((dst / "pages-1.img").stat().st_mode & 0o777) == oct(0o600)


def test_changed_short_and_planted_sources_are_problems(tmp_path: Path, kernel: str) -> None:
    src, dst = tmp_path / "store", tmp_path / "work"
    src.mkdir()
    good = os.urandom(70000)
    (src / "a.img").write_bytes(good[::-1])           # other bytes, same size: hashed -> mismatch
    (src / "b.img").write_bytes(good[:1000])          # shorter than the manifest
    (src / "c.img").symlink_to(src / "a.img")         # a symlink planted by a writer
    items = [(entry(n, good), str(dst / n)) for n in ("a.img", "b.img", "c.img", "d.img")]
    problems, _deferred = sc.copy_verified(str(src), items)
    assert problems == ["b.img: size 1000 bytes, manifest says 70000 (truncated or replaced)",
                        "c.img: cannot be opened (Too many levels of symbolic links; a symlink?)",
                        "d.img: missing", "a.img: SHA256 mismatch (corrupted)"], kernel


def test_a_plaintext_copy_that_would_not_fit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encrypted and the compressed stores' plaintext copies check the node's free space first."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils import _encstore as es
    written: list = []
    doc = {"id": "s1", "files": [{"path": "a.img", "size": 10}]}
    free = 100 << 20

    class Vfs:  # pylint: disable=too-few-public-methods
        f_bavail, f_frsize = free // 4096, 4096
    monkeypatch.setattr(os, "statvfs", lambda _path: Vfs())
    problems = es.build_copy(str(tmp_path / "cache" / "s1"), doc, lambda e, p: written.append(p), need=1 << 30)
    assert problems == [f"{tmp_path / 'cache' / 's1'}: 100 MiB free, the plaintext copy of snapshot s1 needs "
                        "1024 MiB (+64 MiB to spare): free space there, or point store_options.cache_dir elsewhere"]
    assert written == [] and not (tmp_path / "cache" / "s1").exists()
