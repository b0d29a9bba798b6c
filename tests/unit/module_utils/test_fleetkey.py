"""The fleet signing key on the controller (_fleetkey): made once, never replaced, never loose."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _fleetkey as fk
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg


def test_made_once_0600_in_a_0700_dir_and_then_reused(tmp_path: Path) -> None:
    path = tmp_path / "ctl" / "fleet-signing.key"
    first = fk.ensure(str(path))
    assert first.created and first.key_id and first.public_pem and "BEGIN PUBLIC KEY" in first.public_pem
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    second = fk.ensure(str(path))
    assert not second.created and (second.key_id, second.public_pem) == (first.key_id, first.public_pem)
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "fleet.pub").write_text(first.public_pem)
    signed = sg.sign({"id": "s1", "files": []}, sg.load_signing_key(str(path)))
    assert sg.check(signed, sg.load_trust_set(str(trusted)), "test") == first.key_id


def test_check_mode_makes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ctl" / "fleet-signing.key"
    planned = fk.ensure(str(path), check_mode=True)
    assert planned.created and planned.key_id is None and planned.public_pem is None
    assert not (tmp_path / "ctl").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_key_others_can_read_is_refused_not_replaced(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "fleet-signing.key"
    made = fk.ensure(str(path))
    before = path.read_bytes()
    os.chmod(path, mode)
    with pytest.raises(sg.KeyFileError, match=f"accessible by group or others \\(mode {mode:04o}\\)"):
        fk.ensure(str(path))
    assert path.read_bytes() == before and made.created


def test_something_else_at_the_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet-signing.key"
    path.write_text("not a key\n")
    path.chmod(0o600)
    with pytest.raises(sg.KeyFileError, match="is not an unencrypted PEM"):
        fk.ensure(str(path))
    assert path.read_text() == "not a key\n"
    dangling = tmp_path / "dangling.key"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(sg.KeyFileError, match="cannot be read"):
        fk.ensure(str(dangling))
    assert not (tmp_path / "nowhere").exists(), "a key was made through a symlink"
