"""The verified private copy (_storecopy): what is hashed is what lands in our copy; deferred files are copied whole,
or pinned in place under a read lease that a writer breaks."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc


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
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _encstore as es
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


# --- pinned in place: the store's own file under a read lease, hard-linked into the work dir ------------------

def _store(tmp_path: Path) -> tuple:
    src, dst = tmp_path / "store", tmp_path / "work"
    (src / "criu").mkdir(parents=True)
    pages = os.urandom(2 << 20)
    (src / "criu" / "pages-1.img").write_bytes(pages)
    return src, dst, [(entry("criu/pages-1.img", pages, 1 << 20), str(dst / "images" / "pages-1.img"))]


def _open_for_writing(path: Path) -> str:
    """Another process opens ``path`` for writing without waiting: what a store writer's open does to a lease."""
    got = subprocess.run([sys.executable, "-c", "import os, sys\ntry:\n    os.open(sys.argv[1], os.O_WRONLY | "
                          "os.O_NONBLOCK)\n    print('opened')\nexcept OSError as exc:\n    print(exc.errno)",
                          str(path)], capture_output=True, text=True, check=True)
    return got.stdout.strip()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="linking an open file needs CAP_DAC_READ_SEARCH (root)")


@needs_root
def test_a_deferred_page_image_on_a_local_fs_is_pinned_and_a_writer_breaks_the_pin(tmp_path: Path) -> None:
    src, dst, items = _store(tmp_path)
    probe = os.open(str(src), os.O_RDONLY)
    local = sc._fs_type(probe) in sc.KERNEL_FS  # pylint: disable=protected-access
    os.close(probe)
    if not local:
        pytest.skip(f"{src} is not on a local file system the pin trusts")
    pins, rest = sc.pin(str(src), items, {"criu/pages-1.img"})
    try:
        assert rest == [] and len(pins) == 1
        assert (dst / "images" / "pages-1.img").stat().st_ino == (src / "criu" / "pages-1.img").stat().st_ino
        assert pins.items == [(items[0][1], items[0][0])] and pins.broken() == []
        assert _open_for_writing(src / "criu" / "pages-1.img") == str(errno.EAGAIN)  # held off, lease broken
        assert pins.broken() == ["criu/pages-1.img: opened for writing in the store while the restore read it "
                                 "in place"]
        overlap = ov.Overlap(pins.items, pins=pins).start()
        assert overlap.finish() == ["checksum: criu/pages-1.img: opened for writing in the store while the "
                                    "restore read it in place"]
    finally:
        pins.release()
    assert _open_for_writing(src / "criu" / "pages-1.img") == "opened"


@needs_root
def test_an_unbroken_pin_passes_the_overlapped_verify(tmp_path: Path) -> None:
    src, _dst, items = _store(tmp_path)
    pins, rest = sc.pin(str(src), items, {"criu/pages-1.img"})
    try:
        if rest:
            pytest.skip(f"{src}: not pinned here (file system or work dir elsewhere)")
        assert ov.Overlap(pins.items, pins=pins).start().finish() == []
    finally:
        pins.release()


def test_a_page_image_open_for_writing_or_elsewhere_is_copied_not_pinned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, _dst, items = _store(tmp_path)
    writer = os.open(str(src / "criu" / "pages-1.img"), os.O_WRONLY)  # open for writing: no lease is granted
    try:
        pins, rest = sc.pin(str(src), items, {"criu/pages-1.img"})
        assert len(pins) == 0 and rest == items
    finally:
        os.close(writer)
    monkeypatch.setattr(sc, "_fs_type", lambda _fd: 0x6969)  # NFS: a server answers reads; never pinned
    pins, rest = sc.pin(str(src), items, {"criu/pages-1.img"})
    assert len(pins) == 0 and rest == items
    monkeypatch.undo()
    pins, rest = sc.pin(str(src), items, set())  # not deferred: copied and hashed as it passes
    assert len(pins) == 0 and rest == items
    problems, deferred = sc.copy_verified(str(src), rest, {"criu/pages-1.img"})
    assert problems == [] and dg.file_matches(deferred[0][0], items[0][0])
    assert os.stat(deferred[0][0]).st_ino != (src / "criu" / "pages-1.img").stat().st_ino
