"""The node_prep role on this machine, through the prepare_nodes playbook.

Real runs: the CRIU bundle is built from Debian's source tarball (cached in
the role's build cache between runs), installed, and checked with CRIU.
Needs root, like the role itself.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg
from tests.support.signing_keys import new_key

from .ansible_run import Run, playbook, prep_vars

PLAYBOOK = "warmstart.snapshot.prepare_nodes"
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def prepared(prepared_node: dict) -> dict:
    """Stats of the session's first run of the playbook on localhost (conftest.py)."""
    return prepared_node


def test_prepare_installs_working_criu(prepared: dict) -> None:
    out = subprocess.run(["criu", "--version"], capture_output=True, text=True, check=True).stdout
    version = out.split("Version:")[1].split()[0]
    assert tuple(int(p) for p in version.split(".")[:2]) >= (4, 2), out
    check = subprocess.run(["criu", "check"], capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "Looks good" in check.stdout + check.stderr
    assert os.path.realpath("/usr/local/bin/criu").startswith("/opt/warmstart/criu/")


def test_bundle_is_self_contained(prepared: dict) -> None:
    bundle = Path("/opt/warmstart/criu/current")
    meta = json.loads((bundle / "BUNDLE.json").read_text())
    assert meta["criu_version"].startswith("4.2") and len(meta["source_sha256"]) == 64
    ldd = subprocess.run(["ldd", str(bundle / "libexec" / "criu")], capture_output=True,
                         text=True, check=True).stdout
    for line in ldd.splitlines():
        if "=>" in line and "/" in line.split("=>")[1]:
            lib = line.split("=>")[1].split()[0]
            name = Path(lib).name
            if not name.startswith(("libc.so", "libm.so", "ld-linux")):
                assert os.path.realpath(lib).startswith(str(bundle.resolve() / "lib")), f"{name} comes from {lib}"
    assert (bundle / "lib" / "criu" / "cuda_plugin.so").is_file()


def test_pycriu_talks_to_criu_over_rpc(prepared: dict) -> None:
    code = ("import pycriu; c = pycriu.criu(); c.use_binary('/usr/local/bin/criu'); "
            "c.check(); print(pycriu.__file__)")
    out = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("/opt/warmstart/criu/")


def test_files_and_modes(prepared: dict) -> None:
    root = os.stat("/var/lib/warmstart")
    assert stat.S_ISDIR(root.st_mode) and stat.S_IMODE(root.st_mode) == 0o700
    profile = json.loads(Path("/var/lib/kubelet/seccomp/profiles/block-iouring.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    blocked = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ERRNO" for n in rule["names"]}
    assert blocked == {"io_uring_setup", "io_uring_enter", "io_uring_register"}


def test_second_run_changes_nothing(prepared: dict) -> None:
    again = playbook(PLAYBOOK, extra=prep_vars())
    assert again.rc == 0, again.messages()
    assert again.stats()["changed"] == 0


def test_check_mode_changes_nothing(prepared: dict) -> None:
    check = playbook(PLAYBOOK, "--check", extra=prep_vars())
    assert check.rc == 0, check.messages()
    assert check.stats()["changed"] == 0


# --- bad input: each fails the host with a message saying what and where ---

def test_refuses_old_kernel() -> None:
    run = playbook(PLAYBOOK, extra={**prep_vars(), "node_prep_kernel_min_version": "99.1"})
    assert run.rc != 0
    msg = run.messages()
    assert "localhost: kernel " + os.uname().release in msg and "older than 99.1" in msg


def test_refuses_node_without_python() -> None:
    run = playbook(PLAYBOOK, extra={**prep_vars(), "ansible_python_interpreter": "/nonexistent/python3"})
    assert run.rc != 0
    assert "localhost: no usable Python 3" in run.messages()


def test_refuses_non_root() -> None:
    run = playbook(PLAYBOOK, extra={**prep_vars(), "ansible_become_user": "nobody", "ansible_become_method": "su",
                                    "ansible_become_flags": "-s /bin/sh"})
    assert run.rc != 0
    assert "needs root" in run.messages() and "uid 65534" in run.messages()


def test_refuses_unknown_install_mode() -> None:
    run = playbook(PLAYBOOK, extra={**prep_vars(), "node_prep_criu_install": "magic"})
    assert run.rc != 0
    assert "node_prep_criu_install" in run.messages() + run.stdout


def _isolated(tmp_path: Path, **extra: object) -> dict:
    """Vars that send the build and the install to tmp_path only."""
    return {
        **prep_vars(),
        "node_prep_criu_install": "bundle",
        "node_prep_criu_build_cache": str(tmp_path / "cache"),
        "node_prep_criu_bundle_root": str(tmp_path / "opt"),
        "node_prep_criu_link": "",
        "node_prep_pycriu": False,
        "node_prep_verify": False,
        **extra,
    }


def test_checksum_mismatch_stops_before_build(tmp_path: Path) -> None:
    run = playbook(PLAYBOOK, extra=_isolated(tmp_path, node_prep_criu_source_sha256="0" * 64))
    assert run.rc != 0
    msg = run.messages()
    assert "checksum" in msg.lower() and "0" * 64 in msg
    assert not list((tmp_path / "cache").glob("*.tar.gz"))
    assert not (tmp_path / "opt" / "4.2.1").exists()


def test_build_failure_reports_and_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "criu-9.9.tar.gz"
    tree = tmp_path / "criu-9.9"
    tree.mkdir()
    (tree / "Makefile").write_text("criu lib cuda_plugin:\n\t@echo 'compel: deliberately broken source' >&2; exit 1\n")
    with tarfile.open(src, "w:gz") as tar:
        tar.add(tree, arcname="criu-9.9")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    run = playbook(PLAYBOOK, extra=_isolated(tmp_path, node_prep_criu_version="9.9",
                                             node_prep_criu_source_url=src.as_uri(),
                                             node_prep_criu_source_sha256=sha))
    assert run.rc != 0
    msg = run.messages()
    assert "Building CRIU 9.9 on localhost failed" in msg and "deliberately broken" in msg
    assert not list((tmp_path / "cache").glob("*.tar.gz"))
    assert not (tmp_path / "opt" / "9.9").exists()


@pytest.mark.serial  # its tmpfs is the node's for a while: a snapshot another test takes meanwhile would keep it
def test_unwritable_snapshot_root(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        run = playbook(PLAYBOOK, extra={**prep_vars(), "node_prep_snapshot_root": str(ro / "snapshots"),
                                        "node_prep_verify": False})
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert run.rc != 0
    msg = run.messages()
    assert f"snapshot root {ro / 'snapshots'} is not usable" in msg and "Read-only" in msg


# --- the snapshot keys (tasks/keys.yml) ---

def _keys_play(tmp_path: Path, name: str, check: bool = False, **variables: object) -> Run:
    """node_prep's keys tasks alone on localhost, with ``variables``; the keys directory under tmp_path."""
    role = {"name": "warmstart.snapshot.node_prep", "tasks_from": "keys.yml"}
    play = [{"hosts": "localhost", "gather_facts": True,
             "vars": {"node_prep_keys_dir": str(tmp_path / "keys"), **variables},
             "tasks": [{"name": "keys", "ansible.builtin.include_role": role}]}]
    path = tmp_path / f"{name}.yml"
    path.write_text(json.dumps(play))
    return playbook(str(path), *(["--check"] if check else []))


def _modes(top: Path) -> dict:
    return {str(p.relative_to(top)): stat.S_IMODE(p.stat().st_mode) for p in [top, *sorted(top.rglob("*"))]}


def test_keys_land_with_their_modes_idempotently_and_removed_keys_go(tmp_path: Path) -> None:
    private, pub_a, kid_a = new_key()
    _priv_b, pub_b, _kid_b = new_key()
    kek1, kek2 = base64.b64encode(os.urandom(32)).decode(), base64.b64encode(os.urandom(32)).decode()
    full = {"node_prep_signing_key": private.decode(),
            "node_prep_trusted_keys": {"a": pub_a.decode(), "b": pub_b.decode()},
            "node_prep_keks": {"k1": kek1, "k2": kek2}}
    first = _keys_play(tmp_path, "first", **full)
    assert first.rc == 0, first.messages()
    assert first.stats()["changed"] > 0
    top = tmp_path / "keys"
    assert _modes(top) == {".": 0o755, "signing.key": 0o600, "trusted": 0o755, "trusted/a.pub": 0o644,
                           "trusted/b.pub": 0o644, "kek": 0o700, "kek/k1.key": 0o600, "kek/k2.key": 0o600}
    assert all(p.stat().st_uid == 0 for p in top.rglob("*"))
    for secret in (private.decode().splitlines()[1], kek1, kek2):
        assert secret not in first.stdout + first.stderr, "a secret key was logged"
    assert sg.load_signing_key(str(top / "signing.key")).key_id == kid_a
    assert len(sg.load_trust_set(str(top / "trusted")).ids) == 2
    assert (top / "kek" / "k1.key").read_text().strip() == kek1
    again = _keys_play(tmp_path, "again", **full)
    assert again.rc == 0 and again.stats()["changed"] == 0, again.messages()
    rotated = {"node_prep_signing_key_state": "absent", "node_prep_trusted_keys": {"a": pub_a.decode()},
               "node_prep_keks": {"k1": kek1}}
    before = _modes(top)
    check = _keys_play(tmp_path, "check", check=True, **rotated)
    assert check.rc == 0 and check.stats()["changed"] > 0, check.messages()
    assert _modes(top) == before, "check mode changed the keys"
    done = _keys_play(tmp_path, "rotated", **rotated)
    assert done.rc == 0, done.messages()
    assert _modes(top) == {".": 0o755, "trusted": 0o755, "trusted/a.pub": 0o644, "kek": 0o700, "kek/k1.key": 0o600}
    assert sg.load_trust_set(str(top / "trusted")).ids == [kid_a]


def test_keys_refuses_a_malformed_kek_without_showing_it(tmp_path: Path) -> None:
    run = _keys_play(tmp_path, "bad", node_prep_keks={"k1": "c2hvcnQ="})
    assert run.rc != 0
    assert "every value must be the base64 text of 32 random bytes" in run.messages()
    assert "c2hvcnQ=" not in run.stdout + run.stderr
    assert not (tmp_path / "keys").exists()


def test_signed_by_default_makes_the_fleet_key_once_and_hands_it_out(tmp_path: Path) -> None:
    """No key given: the fleet key is made on the controller (0600, like an SSH key), installed on a node that
    takes snapshots, and its public half is the trust set; a second run changes nothing; a restore-only node
    keeps the trust set and loses the private key, as does signing_key_state absent (once: no churn); check mode
    makes nothing; opting out installs nothing."""
    controller = tmp_path / "controller" / "fleet-signing.key"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    check = _keys_play(fresh, "check", check=True, node_prep_fleet_key_path=str(fresh / "ctl" / "k"))
    assert check.rc == 0, check.messages()
    assert not (fresh / "ctl").exists() and not (fresh / "keys").exists(), "check mode made a key"
    first = _keys_play(tmp_path, "first", node_prep_fleet_key_path=str(controller))
    assert first.rc == 0, first.messages()
    key = sg.load_signing_key(str(controller))
    assert stat.S_IMODE(controller.stat().st_mode) == 0o600 and stat.S_IMODE(controller.parent.stat().st_mode) == 0o700
    top = tmp_path / "keys"
    assert _modes(top) == {".": 0o755, "signing.key": 0o600, "trusted": 0o755, f"trusted/fleet-{key.key_id}.pub": 0o644}
    assert (top / "signing.key").read_bytes() == controller.read_bytes()
    assert sg.load_trust_set(str(top / "trusted")).ids == [key.key_id]
    assert controller.read_text().splitlines()[1] not in first.stdout + first.stderr, "the private key was logged"
    again = _keys_play(tmp_path, "again", node_prep_fleet_key_path=str(controller))
    assert again.rc == 0 and again.stats()["changed"] == 0, again.messages()
    assert sg.load_signing_key(str(controller)).key_id == key.key_id, "the fleet key was replaced"
    for run_name in ("absent", "absent again"):  # the key taken off a node that signs by default: once, then no churn
        absent = _keys_play(tmp_path, run_name, node_prep_fleet_key_path=str(controller),
                            node_prep_signing_key_state="absent")
        assert absent.rc == 0, absent.messages()
        assert _modes(top) == {".": 0o755, "trusted": 0o755, f"trusted/fleet-{key.key_id}.pub": 0o644}
    assert absent.stats()["changed"] == 0, absent.messages()
    restore_only = _keys_play(tmp_path, "restore-only", node_prep_fleet_key_path=str(controller),
                              node_prep_takes_snapshots=False)
    assert restore_only.rc == 0, restore_only.messages()
    assert _modes(top) == {".": 0o755, "trusted": 0o755, f"trusted/fleet-{key.key_id}.pub": 0o644}
    opted_out = tmp_path / "out"
    opted_out.mkdir()
    off = _keys_play(opted_out, "off", node_prep_sign_snapshots=False, node_prep_fleet_key_path=str(opted_out / "k"))
    assert off.rc == 0, off.messages()
    assert not (opted_out / "keys").exists() and not (opted_out / "k").exists()


def test_a_fleet_key_others_can_read_is_refused_not_used(tmp_path: Path) -> None:
    controller = tmp_path / "fleet-signing.key"
    private, _pub, _kid = new_key()
    controller.write_bytes(private)
    controller.chmod(0o644)
    run = _keys_play(tmp_path, "loose", node_prep_fleet_key_path=str(controller))
    assert run.rc != 0
    assert f"signing key {controller} is accessible by group or others (mode 0644)" in run.messages()
    assert not (tmp_path / "keys" / "signing.key").exists()
