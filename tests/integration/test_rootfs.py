"""Rootfs diffs: captured from an overlay-style upper dir, applied chrooted into another root.

Needs root (whiteouts are character devices 0/0, opaque dirs carry a trusted.* xattr, apply chroots).
"""
from __future__ import annotations

import json
import os
import socket
import stat
import tarfile
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _rootfs as rootfs

pytestmark = pytest.mark.integration


@pytest.fixture
def upper(tmp_path: Path) -> Path:
    up = tmp_path / "upper"
    (up / "etc").mkdir(parents=True)
    (up / "etc" / "app.conf").write_text("new config\n")
    (up / "etc" / "hostname").write_text("")                      # a mountpoint stub, as runc leaves it
    os.mknod(up / "etc" / "motd", stat.S_IFCHR | 0o600, os.makedev(0, 0))  # whiteout: deleted from the image
    (up / "var" / "cache").mkdir(parents=True)
    os.setxattr(up / "var" / "cache", "trusted.overlay.opaque", b"y")       # replaced whole
    (up / "var" / "cache" / "fresh").write_text("fresh\n")
    (up / "lib").mkdir()
    (up / "lib" / "plugin.so").write_bytes(b"\x7fELF fake")
    os.chmod(up / "lib" / "plugin.so", 0o4755)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(up / "etc" / "app.sock"))
    sock.close()
    return up


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    root = tmp_path / "dest"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "motd").write_text("image motd\n")
    (root / "etc" / "hostname").write_text("placeholder-host\n")
    (root / "var" / "cache").mkdir(parents=True)
    (root / "var" / "cache" / "stale").write_text("old\n")
    (root / "usr" / "lib").mkdir(parents=True)
    os.symlink("/usr/lib", root / "lib")   # absolute: must resolve inside the root, never on the host
    return root


def test_capture_lists_deletions_and_opaque_dirs_and_skips_sockets(upper: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stats = rootfs.capture(str(upper), str(out))
    doc = json.loads((out / rootfs.DELETED).read_text())
    assert doc == {"deleted": ["/etc/motd"], "opaque": ["/var/cache"]}
    with tarfile.open(out / rootfs.DIFF_TAR) as tar:
        names = set(tar.getnames())
    assert {"etc/app.conf", "etc/hostname", "var/cache/fresh", "lib/plugin.so"} <= names
    assert "etc/motd" not in names and "etc/app.sock" not in names
    assert stats["deleted"] == 1 and stats["opaque"] == 1
    assert (out / rootfs.DIFF_TAR).stat().st_mode & 0o777 == 0o600


def test_apply_inside_the_root_keeping_mountpoints(upper: Path, dest: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    rootfs.capture(str(upper), str(out))
    host_lib = Path("/usr/lib/plugin.so")
    assert not host_lib.exists()
    res = rootfs.apply(str(dest), str(out), mountpoints=["/", "/etc/hostname"])
    assert (dest / "etc" / "app.conf").read_text() == "new config\n"
    assert not (dest / "etc" / "motd").exists()
    assert sorted(os.listdir(dest / "var" / "cache")) == ["fresh"]
    assert (dest / "usr" / "lib" / "plugin.so").read_bytes() == b"\x7fELF fake"
    assert (dest / "usr" / "lib" / "plugin.so").stat().st_mode & 0o7777 == 0o4755
    assert not host_lib.exists(), "an absolute symlink in the destination was followed on the host"
    assert (dest / "etc" / "hostname").read_text() == "placeholder-host\n", "a mountpoint was replaced"
    assert res["deleted"] == 1 and res["opaque"] == 1


def test_bad_archives_are_refused_with_the_file_named(dest: Path, tmp_path: Path) -> None:
    out = tmp_path / "evil"
    out.mkdir()
    with tarfile.open(out / rootfs.DIFF_TAR, "w") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 0
        tar.addfile(info)
    (out / rootfs.DELETED).write_text(json.dumps({"deleted": [], "opaque": []}))
    with pytest.raises(rootfs.RootfsError, match=r"rootfs-diff.tar: refusing member '../escape'"):
        rootfs.apply(str(dest), str(out))
    (out / rootfs.DELETED).write_text(json.dumps({"deleted": ["/../../etc/passwd"], "opaque": []}))
    with pytest.raises(rootfs.RootfsError, match="refusing path"):
        rootfs.apply(str(dest), str(out))
    (out / rootfs.DELETED).write_text("[not json")
    with pytest.raises(rootfs.RootfsError, match="deleted-files.json cannot be read"):
        rootfs.apply(str(dest), str(out))
    with pytest.raises(rootfs.RootfsError, match="does not exist"):
        rootfs.capture(str(tmp_path / "no-upper"), str(out))


# --- a container's volumes (a pod's emptyDir volumes): _volumes ------------------------------------------------

def test_a_volume_goes_along_with_what_it_holds_and_comes_back_in_another_volume(tmp_path: Path) -> None:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _volumes as vol  # noqa: PLC0415
    src, dst, target = tmp_path / "src-vol", tmp_path / "dst-vol", tmp_path / "target"
    (src / "torch" / "kernels").mkdir(parents=True)
    (src / "torch" / "kernels" / "k1.bin").write_bytes(b"\x01" * 5000)
    (src / "open.log").write_text("held open by the server\n")
    os.chmod(src / "open.log", 0o640)
    os.symlink("/etc/shadow", src / "shadow")            # planted by another container: archived as a link only
    os.symlink("torch", src / "cache")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "server.sock"))
    sock.close()
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a device node: never carried
    dst.mkdir()
    (dst / "stale").write_text("from the placeholder's own start\n")
    target.mkdir(mode=0o700)
    rec = vol.capture(str(src), "/cache", "ext4", str(target), 0)
    assert rec == {"mountpoint": "/cache", "archive": "volumes/0.tar", "entries": 6, "bytes": 5000 + 24,
                   "fstype": "ext4"}
    archive = target / rec["archive"]
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600 and stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    with tarfile.open(archive) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert set(names) == {"torch", "torch/kernels", "torch/kernels/k1.bin", "open.log", "shadow", "cache"}
    assert names["shadow"].issym() and names["shadow"].linkname == "/etc/shadow" and names["shadow"].size == 0
    assert vol.apply(str(dst), "/cache", str(archive)) == {"mountpoint": "/cache", "entries": 6}
    assert (dst / "torch" / "kernels" / "k1.bin").read_bytes() == b"\x01" * 5000
    assert stat.S_IMODE((dst / "open.log").stat().st_mode) == 0o640
    assert os.readlink(dst / "shadow") == "/etc/shadow" and (dst / "stale").exists()


def test_a_volume_with_links_planted_to_the_host_is_read_and_written_only_inside_it(tmp_path: Path) -> None:
    """Another container of the pod may plant links in a shared emptyDir: capture follows none of them out of the
    volume, and an archive whose entries go through a planted link writes inside the volume, never on the host."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime import _volumes as vol  # noqa: PLC0415
    outside = tmp_path / "host-secret"
    outside.mkdir()
    (outside / "key").write_text("host secret\n")
    src = tmp_path / "src-vol"
    src.mkdir()
    os.symlink(str(outside), src / "dir-link")          # an absolute link to a host dir (as the node sees it)
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    vol.capture(str(src), "/data", "tmpfs", str(target), 0)
    with tarfile.open(target / "volumes" / "0.tar") as tar:
        assert [m.name for m in tar.getmembers()] == ["dir-link"], "nothing read through the link"
    # an archive of our own making that writes through a link the placeholder's volume holds
    evil = tmp_path / "evil.tar"
    payload = tmp_path / "payload"
    payload.write_text("written by the restore\n")
    with tarfile.open(evil, "w") as tar:
        tar.add(payload, arcname="dir-link/key")
    dst = tmp_path / "dst-vol"
    dst.mkdir()
    os.symlink(str(outside), dst / "dir-link")
    with pytest.raises(vol.VolumeError, match="File exists: '/dir-link'"):  # the link leads nowhere in the volume
        vol.apply(str(dst), "/data", str(evil))
    assert (outside / "key").read_text() == "host secret\n", "the host file was written through the planted link"
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        tar.add(payload, arcname="../escaped")
    with pytest.raises(vol.VolumeError, match=r"refusing member '\.\./escaped'"):
        vol.apply(str(dst), "/data", str(bad))
    assert not (tmp_path / "escaped").exists()
    with pytest.raises(vol.VolumeError, match="volume /data: its host directory .* cannot be opened"):
        vol.capture(str(tmp_path / "missing"), "/data", "tmpfs", str(target), 1)
