"""_safefs: every way a planted name could redirect a write, a chmod or a chown is refused or replaced."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(b"root's\n")
    os.chmod(path, 0o600)
    return path


def test_write_file_replaces_a_symlink_or_hard_link_never_writes_through(tmp_path: Path, secret: Path) -> None:
    box = tmp_path / "box"
    box.mkdir()
    os.symlink(secret, box / "a")
    os.link(secret, box / "b")
    for name in ("a", "b"):
        safefs.write_file(str(box / name), b"mine", 0o644)
        assert (box / name).read_bytes() == b"mine" and not (box / name).is_symlink()
        assert stat.S_IMODE(os.lstat(box / name).st_mode) == 0o644
    assert secret.read_bytes() == b"root's\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(os.listdir(box)) == ["a", "b"], "no temporary file left"


def test_write_file_sets_the_owner_on_the_file_it_made(tmp_path: Path) -> None:
    path = safefs.write_file(str(tmp_path / "env.json"), b"{}", 0o600, owner=(65534, 65534))
    info = os.lstat(path)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (65534, 65534, 0o600)


def test_a_symlinked_directory_on_the_way_is_refused(tmp_path: Path, secret: Path) -> None:
    os.symlink(secret.parent, tmp_path / "dirlink")
    with pytest.raises(safefs.UnsafePath):
        safefs.write_file(str(tmp_path / "dirlink" / "x"), b"x")
    assert not (secret.parent / "x").exists() or (secret.parent / "x").read_bytes() != b"x"


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_open_file_refuses_what_someone_planted(tmp_path: Path, secret: Path, plant: str) -> None:
    path = tmp_path / "lock"
    if plant == "symlink":
        os.symlink(secret, path)
    elif plant == "hardlink":
        os.link(secret, path)
    else:
        os.mkfifo(path)
    with pytest.raises(safefs.UnsafePath):
        os.close(safefs.open_file(str(path), os.O_RDWR | os.O_CREAT))
    assert secret.read_bytes() == b"root's\n"


def test_create_file_is_exclusive(tmp_path: Path, secret: Path) -> None:
    os.symlink(secret, tmp_path / "part")
    with pytest.raises(safefs.UnsafePath):
        safefs.create_file(str(tmp_path / "part"))
    assert safefs.remove(str(tmp_path / "part")) is True and secret.exists()
    os.close(safefs.create_file(str(tmp_path / "part")))
    assert (tmp_path / "part").is_file()


def test_set_mode_and_lock_down_never_follow(tmp_path: Path, secret: Path) -> None:
    os.symlink(secret, tmp_path / "link")
    with pytest.raises(safefs.UnsafePath):
        safefs.set_mode(str(tmp_path / "link"), 0o666)
    top = tmp_path / "tree"
    (top / "d").mkdir(parents=True)
    (top / "d" / "f").write_bytes(b"f")
    os.chmod(top / "d" / "f", 0o644)
    os.symlink(secret, top / "d" / "s")
    safefs.lock_down_tree(str(top))
    assert stat.S_IMODE((top / "d").stat().st_mode) == 0o700
    assert stat.S_IMODE((top / "d" / "f").stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and (top / "d" / "s").is_symlink()
    os.chmod(secret, 0o640)
    safefs.lock_down_tree(str(top))
    assert stat.S_IMODE(secret.stat().st_mode) == 0o640, "a symlink in the tree changed its target's mode"


def test_a_temporary_file_removed_or_a_result_replaced_by_a_racer_is_written_again(
        tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = tmp_path / "box"
    box.mkdir()
    real_rename = os.rename
    calls = {"n": 0}

    def remove_first_temp(src: str, dst: str, **kw: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:  # the racer removes the first temporary file just before it is renamed
            os.unlink(src, dir_fd=kw["src_dir_fd"])
        real_rename(src, dst, **kw)

    monkeypatch.setattr(safefs.os, "rename", remove_first_temp)
    safefs.write_file(str(box / "ready"), b"mine")
    assert (box / "ready").read_bytes() == b"mine" and calls["n"] == 2
    assert os.listdir(box) == ["ready"], "no temporary file left"

    def swap_after(src: str, dst: str, **kw: int) -> None:
        real_rename(src, dst, **kw)
        os.unlink(dst, dir_fd=kw["dst_dir_fd"])  # the racer puts its own link in place at once, every time
        os.symlink(secret, dst, dir_fd=kw["dst_dir_fd"])

    monkeypatch.setattr(safefs.os, "rename", swap_after)
    with pytest.raises(safefs.UnsafePath, match=r"removed or replaced before it was in place, 5 times"):
        safefs.write_file(str(box / "ready"), b"again")
    with pytest.raises(safefs.UnsafePath, match="someone else writes that directory"):
        safefs.copy_into(str(box), "copied", str(secret), 0o644)
    assert secret.read_bytes() == b"root's\n" and sorted(os.listdir(box)) == ["copied", "ready"]
    assert safefs.is_temp(".ready.ws-0123456789abcdef") and not safefs.is_temp("ready.ws-0123456789abcdef")
