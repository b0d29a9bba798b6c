"""The store is input: property-based tests of the manifest schema, names, ids and paths, and the store's
handling of hostile layouts (symlinks, unlisted files, foreign staging entries, broken manifests)."""
from __future__ import annotations

import json
import os
import posixpath
import signal
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as schema
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st

from tests.support.store_fixtures import make_snapshot

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | hs.floats(allow_nan=False) | hs.text(max_size=20),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=10), inner, max_size=4),
    max_leaves=30)


def good_doc() -> Dict[str, Any]:
    doc = mf.new_manifest("20261202T120000Z-1a2b3c4d", "embed", {"model": "m"}, {"hostname": "a", "arch": "x86_64"})
    doc["targets"] = [{"name": "embed", "kind": "process", "path": "containers/embed", "workload": "embed",
                       "workloads_root": "/var/lib/warmstart/workloads",
                       "workload_files": [{"path": "control/ready-for-snapshot", "mode": 0o644}],
                       "control_dir": "/var/lib/warmstart/workloads/embed/control",
                       "criu": {"options": {"tcp": "established", "shell_job": False}}}]
    doc["files"] = [{"path": "containers/embed/criu/pages-1.img", "size": 4, "sha256": "a" * 64}]
    return doc


# --- properties -------------------------------------------------------------------------------

@FAST
@given(json_values)
def test_any_json_value_is_judged_never_crashes(value: Any) -> None:
    found = schema.problems(value, mf.SCHEMA_VERSION)
    assert isinstance(found, list) and all(isinstance(p, str) for p in found)
    if not isinstance(value, dict):
        assert found == ["not a JSON object"]


@FAST
@given(hs.dictionaries(hs.sampled_from(["schema", "id", "name", "labels", "created_at", "source", "targets",
                                        "files", "size", "gpu", "pod"]), json_values, max_size=11))
def test_any_field_replaced_by_any_value_is_judged(change: Dict[str, Any]) -> None:
    doc = dict(good_doc(), **change)
    try:
        mf.validate(doc, "m.json")
    except mf.ManifestError as exc:
        assert str(exc).startswith("m.json: manifest ")
        assert len(exc.reasons) != 1, "one problem is said in the message; several are all in reasons"
        return
    # accepted: then every path in it stays inside a snapshot dir
    for entry in doc["files"]:
        assert not posixpath.isabs(entry["path"]) and ".." not in entry["path"].split("/")


@FAST
@given(hs.binary(max_size=200))
def test_any_bytes_parse_or_fail_as_manifest_errors(data: bytes) -> None:
    try:
        mf.parse(data, "m.json")
    except mf.ManifestError:
        pass


@FAST
@given(hs.text(alphabet=string.ascii_letters + string.digits + "._-/\n\r\x00 ", max_size=40))
def test_names_and_ids_match_in_full(value: str) -> None:
    if schema.is_name(value):
        assert "/" not in value and "\n" not in value and ".." not in value and value
    if schema.is_id(value):
        assert len(value) == 25 and "\n" not in value
    for suffix in ("\n", "\r\n", " "):
        assert not schema.is_name(value + suffix) and not schema.is_id(value + suffix)


@FAST
@given(hs.lists(hs.sampled_from(["a", "b", ".", "..", "", "c.img", "x\n", "/"]), min_size=1, max_size=6))
def test_accepted_relative_paths_stay_inside_any_base(parts: list) -> None:
    rel = "/".join(parts)
    if schema.relpath_problem(rel) is None:
        base = "/srv/store/snapshots/x"
        assert posixpath.normpath(posixpath.join(base, rel)).startswith(base + "/")
        assert posixpath.normpath(rel) == rel


def test_deep_nesting_is_a_manifest_error_not_a_crash() -> None:
    deep = b'{"schema": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(mf.ManifestError, match="nested deeper than"):
        mf.parse(deep, "deep.json")
    nested: Any = 1
    for _level in range(schema.MAX_DEPTH + 1):
        nested = [nested]
    assert schema.problems({"schema": 1, "a": nested}, 1) == [f"nested deeper than {schema.MAX_DEPTH} levels"]


@pytest.mark.parametrize("change, fragment", [
    ({"labels": ["a", "b"]}, "labels: not a mapping of strings"),
    ({"targets": ["a", "b"]}, "targets[0]: not a mapping"),
    ({"created_at": None}, "created_at: None is not a UTC timestamp"),
    ({"id": ""}, "id '' is malformed"),
    ({"name": ""}, "name '' is not a safe name"),
])
def test_shapes_that_crashed_before_are_reasons(change: Dict[str, Any], fragment: str) -> None:
    with pytest.raises(mf.ManifestError) as err:
        mf.validate(dict(good_doc(), **change), "m")
    assert any(fragment in r for r in err.value.reasons or [str(err.value)]), (str(err.value), err.value.reasons)


@pytest.mark.parametrize("gpu, fragment", [
    ("x", "gpu: not a mapping"),
    ({"pids": [{"ns_pid": "1"}]}, "gpu.pids: not a list"),
    ({"pids": [{"ns_pid": -3}]}, "gpu.pids: not a list"),
    ({"gpus": ["GPU-1"]}, "gpu.gpus: not a list"),
])
def test_the_gpu_section_the_cuda_restore_reads_is_checked(gpu: Any, fragment: str) -> None:
    with pytest.raises(mf.ManifestError) as err:
        mf.validate(dict(good_doc(), gpu=gpu), "m")
    assert any(fragment in r for r in err.value.reasons or [str(err.value)])
    good = {"pids": [{"pid": 10, "ns_pid": 1}], "gpus": [{"index": 0, "uuid": "GPU-a", "name": "H100"}],
            "cuda_version": 12080, "driver_version": "580.1"}
    assert mf.validate(dict(good_doc(), gpu=good), "m")["gpu"] == good


@pytest.mark.parametrize("field, value, fragment", [
    ("workload_files", [{"path": "/etc/cron.d/x", "mode": 0o644}], "workload_files[0].path '/etc/cron.d/x' is absolute"),
    ("workload_files", [{"path": "../../../../etc/x", "mode": 0o644}], "has an empty, '.' or '..' component"),
    ("workload_files", [{"path": "bin/sh", "mode": 0o4755}], "setuid, setgid and sticky are refused"),
    ("path", "containers/../../etc", "path 'containers/../../etc' is not 'containers/embed'"),
    ("path", "/etc", "path '/etc' is not 'containers/embed'"),
    ("workloads_root", "relative/root", "workloads_root 'relative/root' is not an absolute path"),
    ("control_dir", "/a/../etc", "control_dir '/a/../etc' is not normalised"),
    ("criu", {"options": {"tcp": "bogus"}}, "criu.options.tcp: 'bogus' is not one of"),
    ("name", "a\n", "targets[0].name 'a\\n' is not a safe name"),
    ("ns_pids", ["1"], "ns_pids: not a list of positive integers"),
    ("external_mounts", {"/data": "/"}, "external_mounts: not a list of {mountpoint: absolute path"),
    ("external_mounts", [{"mountpoint": "../etc", "source": "/"}], "external_mounts: not a list"),
    ("mount_namespace", [], "mount_namespace: not a mapping"),
    ("mount_namespace", {"own_proc": "yes", "mounts": [], "skipped": []}, "mount_namespace.own_proc: not a boolean"),
    ("mount_namespace", {"own_proc": True, "mounts": [{"path": "../etc", "fstype": "ext4", "slave": False}],
                         "skipped": []}, "mount_namespace.mounts[0]: not {path: absolute path"),
    ("mount_namespace", {"own_proc": True, "mounts": [{"path": "/", "fstype": 7, "slave": False}], "skipped": []},
     "mount_namespace.mounts[0]: not {path"),
    ("mount_namespace", {"own_proc": True, "mounts": [], "skipped": [1]}, "mount_namespace.skipped: not a list"),
])
def test_target_fields_that_steered_writes_are_refused(field: str, value: Any, fragment: str) -> None:
    doc = good_doc()
    doc["targets"][0][field] = value
    with pytest.raises(mf.ManifestError) as err:
        mf.validate(doc, "m")
    assert any(fragment in r for r in err.value.reasons or [str(err.value)]), (str(err.value), err.value.reasons)


def test_every_bad_field_is_listed_at_once() -> None:
    doc = dict(good_doc(), labels=[1], created_at="yesterday", files=[{"path": "/x", "size": -1, "sha256": "z"}])
    with pytest.raises(mf.ManifestError) as err:
        mf.validate(doc, "m")
    assert len(err.value.reasons) >= 5 and "(and " in str(err.value)


# --- the store's layout ------------------------------------------------------------------------

@pytest.fixture()
def store(tmp_path: Path) -> st.FsStore:
    return st.FsStore(str(tmp_path / "store"))


def test_one_broken_manifest_never_hides_the_others(store: st.FsStore) -> None:
    good = make_snapshot(store, "good")
    bad_ids = []
    for n, body in enumerate([b"[" * 50_000, json.dumps(dict(good_doc(), labels=["x"])).encode(),
                              json.dumps(dict(good_doc(), targets=["x"])).encode(),
                              json.dumps({k: v for k, v in good_doc().items() if k != "created_at"}).encode()]):
        sid = f"20261202T12000{n}Z-0000000{n}"
        path = Path(store.snapshot_dir(sid))
        path.mkdir(parents=True)
        doc_bytes = body.replace(b"20261202T120000Z-1a2b3c4d", sid.encode())
        (path / "manifest.json").write_bytes(doc_bytes)
        bad_ids.append(sid)
    listed = {d["id"]: d for d in store.list()}
    assert "error" not in listed[good["id"]]
    for sid in bad_ids:
        assert listed[sid]["error"].startswith(f"{store.snapshot_dir(sid)}/manifest.json: manifest "), listed[sid]


@pytest.mark.parametrize("which", ["tmp", "snapshots"])
def test_symlinked_layout_is_refused(store: st.FsStore, tmp_path: Path, which: str) -> None:
    store.ensure()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me")
    os.rmdir(os.path.join(store.root, which))
    os.symlink(elsewhere, os.path.join(store.root, which))
    with pytest.raises(st.StoreError, match=f"{which} is a symlink"):
        store.staging_entries() if which == "tmp" else store.list()
    assert (elsewhere / "precious").read_text() == "keep me"


def test_only_warmstart_staging_entries_are_listed(store: st.FsStore) -> None:
    store.ensure()
    ours = Path(store.tmp) / ("ab" * 16)
    deleting = Path(store.tmp) / "deleting-20261202T120000Z-1a2b3c4d-0a0b0c0d"
    for path in (ours, deleting):
        path.mkdir()
    for foreign in ("important", "AB" * 16, ("ab" * 16) + "\n", "deleting-x"):
        (Path(store.tmp) / foreign).mkdir()
    assert sorted(e["path"] for e in store.staging_entries()) == sorted([str(ours), str(deleting)])


@pytest.mark.parametrize("tamper", ["unlisted", "symlink", "fifo", "unlisted_pages", "symlinked_dir"])
def test_verify_accounts_for_every_entry(store: st.FsStore, tmp_path: Path, tamper: str) -> None:
    doc = make_snapshot(store)
    top = Path(store.snapshot_dir(doc["id"]))
    images = top / "containers" / "embed" / "criu"
    if tamper == "unlisted":
        (images / "extra.img").write_bytes(b"x")
        want = "containers/embed/criu/extra.img: not listed in the manifest"
    elif tamper == "symlink":
        (images / "core-1.img").unlink()
        (images / "core-1.img").symlink_to("/etc/hostname")
        want = "containers/embed/criu/core-1.img: a symlink, not a regular file"
    elif tamper == "fifo":
        os.mkfifo(images / "fifo.img")
        want = "containers/embed/criu/fifo.img: a fifo, not a regular file"
    elif tamper == "unlisted_pages":  # dropped from files[] (manifest rewritten), then corrupted
        doc["files"] = [e for e in doc["files"] if not e["path"].endswith("pages-1.img")]
        mf.dump(doc, str(top / "manifest.json"))
        (images / "pages-1.img").write_bytes(b"planted")
        want = "containers/embed/criu/pages-1.img: not listed in the manifest"
    else:
        real = tmp_path / "real"
        os.rename(images, real)
        images.symlink_to(real)
        want = "containers/embed/criu: a symlink, not a regular file"
    problems = ck.verify_files(str(top), doc)
    assert want in problems, problems


def test_load_refuses_a_symlinked_snapshot_dir(store: st.FsStore, tmp_path: Path) -> None:
    doc = make_snapshot(store)
    real = tmp_path / "moved"
    os.rename(store.snapshot_dir(doc["id"]), real)
    os.symlink(real, store.snapshot_dir(doc["id"]))
    with pytest.raises(st.StoreError, match="is a symlink, not a directory; refusing to follow it"):
        store.load(doc["id"])


# --- writing on the node -----------------------------------------------------------------------

def test_copy_into_never_follows_a_symlink(tmp_path: Path) -> None:
    base = tmp_path / "wl"
    (base / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    src = tmp_path / "src"
    src.write_text("data")
    (base / "logs").symlink_to(outside)
    with pytest.raises(safefs.UnsafePath, match="component 'logs'"):
        safefs.copy_into(str(base), "logs/x.log", str(src), 0o644)
    assert list(outside.iterdir()) == []
    (base / "sub" / "f").symlink_to(outside / "victim")
    safefs.copy_into(str(base), "sub/f", str(src), 0o4755)  # replaces the link itself, drops setuid
    assert not (outside / "victim").exists()
    assert (base / "sub" / "f").read_text() == "data" and not (base / "sub" / "f").is_symlink()
    assert (os.stat(base / "sub" / "f").st_mode & 0o7777) == 0o755


def test_inside_resolves_paths(tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "link").symlink_to("/etc")
    assert safefs.inside(str(tmp_path / "root" / "a"), [str(tmp_path / "root")])
    assert not safefs.inside(str(tmp_path / "root" / ".." / "x"), [str(tmp_path / "root")])
    assert not safefs.inside(str(tmp_path / "link"), [str(tmp_path)])


# --- one restore of a workload at a time, never untracked --------------------------------------

def test_restore_lock_is_exclusive_and_names_the_holder(tmp_path: Path) -> None:
    fd = rst.exclusive("workload w under /x", lock_dir=str(tmp_path))
    try:
        with pytest.raises(rst.Busy, match=f"another restore of workload w under /x is running.*pid {os.getpid()}"):
            rst.exclusive("workload w under /x", lock_dir=str(tmp_path))
        os.close(rst.exclusive("workload other under /x", lock_dir=str(tmp_path)))
    finally:
        os.close(fd)
    os.close(rst.exclusive("workload w under /x", lock_dir=str(tmp_path)))


def test_restore_recorded_returns_pid_and_rebuilds_errors(tmp_path: Path) -> None:
    recorded = tmp_path / "pid"
    assert rst.restore_recorded(lambda: 4242, lambda pid: recorded.write_text(str(pid)), RuntimeError) == 4242
    assert recorded.read_text() == "4242"

    def fails() -> int:
        raise ValueError("criu said no")
    with pytest.raises(RuntimeError) as err:
        rst.restore_recorded(fails, lambda pid: None, lambda report: RuntimeError(report["error"]))
    assert "criu said no" in str(err.value)


CALLER = r'''
import os, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
out = sys.argv[2]
def slow_restore():
    open(out + ".started", "w").close()
    time.sleep(1.5)   # the caller is SIGKILLed meanwhile
    return 31337
def record(pid):  # written whole (a rename): the test never reads a file created but not yet written
    with open(out + ".part", "w") as handle:
        handle.write(str(pid))
    os.rename(out + ".part", out)
rst.restore_recorded(slow_restore, record, RuntimeError)
'''


def test_a_killed_caller_still_gets_its_tree_recorded(tmp_path: Path) -> None:
    record = tmp_path / "pidfile"
    collections = str(Path(__file__).resolve().parents[3] / ".collections")
    caller = subprocess.Popen([sys.executable, "-c", CALLER, collections, str(record)])
    started = Path(f"{record}.started")
    end = time.monotonic() + 30
    while not started.exists() and time.monotonic() < end and caller.poll() is None:
        time.sleep(0.02)
    assert started.exists(), "the restore never started"
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    end = time.monotonic() + 10
    while not record.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert record.read_text() == "31337"


HELD_CALLER = r'''
import os, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _restorer as rst
out, tree = sys.argv[2], int(sys.argv[3])
def orphaned(pid):
    with open(out + ".part", "w") as handle:  # renamed whole: the test never reads a half-written verdict
        handle.write(f"orphaned {pid} by {os.getpid()}")
    os.rename(out + ".part", out + ".verdict")
held = rst.restore_held(lambda: tree, lambda pid: open(out, "w").write(str(pid)), RuntimeError, orphaned)
print(held.pid, flush=True)
if sys.argv[4] == "settle":
    held.settled()
    print("settled", flush=True)
else:
    time.sleep(60)   # SIGKILLed meanwhile, before any verdict
'''


def _held_caller(tmp_path: Path, how: str) -> "Tuple[subprocess.Popen[str], Path]":
    record = tmp_path / "pidfile"
    collections = str(Path(__file__).resolve().parents[3] / ".collections")
    caller = subprocess.Popen([sys.executable, "-c", HELD_CALLER, collections, str(record), "4343", how],
                              stdout=subprocess.PIPE, text=True)
    return caller, record


def test_a_held_tree_settled_by_the_module_gets_no_second_verdict(tmp_path: Path) -> None:
    caller, record = _held_caller(tmp_path, "settle")
    out, _err = caller.communicate(timeout=20)
    assert caller.returncode == 0 and out.split() == ["4343", "settled"]
    assert record.read_text() == "4343"
    assert not (tmp_path / "pidfile.verdict").exists()  # the child went without deciding anything


def test_a_module_killed_before_its_verdict_leaves_the_verdict_to_the_restorer_child(tmp_path: Path) -> None:
    caller, record = _held_caller(tmp_path, "die")
    assert caller.stdout is not None and caller.stdout.readline().strip() == "4343"
    assert record.read_text() == "4343"
    assert not (tmp_path / "pidfile.verdict").exists()  # still waiting for the module
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    end = time.monotonic() + 10
    verdict = tmp_path / "pidfile.verdict"
    while not verdict.exists() and time.monotonic() < end:
        time.sleep(0.05)
    text = verdict.read_text()
    assert text.startswith("orphaned 4343 by ") and int(text.split()[-1]) != caller.pid


def test_a_held_restore_that_fails_reports_and_decides_nothing(tmp_path: Path) -> None:
    def fails() -> int:
        raise ValueError("criu said no")
    called: List[int] = []
    with pytest.raises(RuntimeError, match="criu said no"):
        rst.restore_held(fails, lambda pid: None, lambda report: RuntimeError(report["error"]), called.append)
    assert called == []  # no tree: nothing to decide


def test_an_empty_criu_log_is_a_warning_naming_the_free_space(tmp_path: Path) -> None:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
    (tmp_path / "restore.log").write_text("")
    warning = rs._log_warning(str(tmp_path))  # pylint: disable=protected-access
    assert warning and "restore.log is empty or missing" in warning and "MiB" in warning
    (tmp_path / "restore.log").write_text("(00.000001) Version: 4.2.1\n")
    assert rs._log_warning(str(tmp_path)) is None  # pylint: disable=protected-access


def test_a_tree_that_cannot_be_recorded_is_killed_not_left_running(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        def fail_to_record(pid: int) -> None:
            raise OSError(28, "No space left on device")
        with pytest.raises(RuntimeError, match=f"pid {victim.pid}.*could not be recorded.*it was killed"):
            rst.restore_recorded(lambda: victim.pid, fail_to_record, lambda report: RuntimeError(report["error"]))
        assert victim.wait(5) == -signal.SIGKILL
    finally:
        victim.kill()


# --- every field of a full manifest, replaced by every JSON type (issue 32, class 5) ------------------------------

def full_doc() -> Dict[str, Any]:
    """A manifest with every section a node reads: chunked files, a target with all its fields, GPU, pod,
    compression, signature."""
    doc = good_doc()
    doc["files"] = [{"path": "containers/embed/criu/pages-1.img", "size": 3 << 20, "sha256": "a" * 64,
                     "chunks": {"size": 1 << 20, "sha256": ["b" * 64] * 3}},
                    {"path": "containers/embed/criu/core-1.img", "size": 4, "sha256": "c" * 64}]
    doc["targets"][0].update(
        files_in_use={"/srv/model.bin": 7}, ns_pids=[1, 2], cmdline=["python3", "s.py"], stdio=["null"],
        external_mounts=[{"mountpoint": "/data", "source": "/srv"}],
        mount_namespace={"own_proc": True, "mounts": [{"path": "/", "fstype": "ext4", "slave": True}],
                         "skipped": ["/run/user/0"]},
        criu={"version": "4.2.1", "options": {"tcp": "close", "ghost_limit": 1, "shell_job": False}},
        tcp_connections=[{"local": "127.0.0.1:40000", "remote": "127.0.0.1:8080", "internal": True}],
        volumes=[{"mountpoint": "/data", "archive": "volumes/0.tar", "entries": 3, "bytes": 12, "fstype": "tmpfs"}])
    doc["gpu"] = {"pids": [{"pid": 10, "ns_pid": 1}], "gpus": [{"index": 0, "uuid": "GPU-a", "name": "H100"}],
                  "cuda_version": 12080, "driver_version": "580.1"}
    doc["pod"] = {"namespace": "ns", "name": "p", "container": "c"}
    doc["compression"] = {"alg": schema.ZSTD_ALG, "frame": 1 << 22, "files": {
        "containers/embed/criu/pages-1.img": {"size": 3 << 20, "sha256": "d" * 64, "frames": [3 << 20]}}}
    doc["signature"] = {"alg": "ed25519", "key_id": "0" * 16, "value": "QUJD"}
    doc["size"] = 3 << 20
    return doc


def paths_of(value: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Every key path in a JSON value (dict keys and list indexes), the containers themselves included."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += paths_of(child, prefix + (key,))
    elif isinstance(value, list):
        for n, child in enumerate(value):
            out += paths_of(child, prefix + (n,))
    return out


FULL_PATHS = paths_of(full_doc())


def replaced(path: Tuple[Any, ...], value: Any) -> Dict[str, Any]:
    doc = full_doc()
    parent: Any = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def test_the_full_manifest_is_accepted() -> None:
    assert schema.problems(full_doc(), mf.SCHEMA_VERSION) == []
    assert len(FULL_PATHS) > 60


@pytest.mark.parametrize("value, problem", [
    ({"local": "a:1", "remote": "b:2"}, "tcp_connections[0]: not {local, remote: address:port, internal: bool}"),
    ({"local": "a:1", "remote": "b" * 65, "internal": True}, "tcp_connections[0]: not {local, remote"),
    ({"local": "a:1", "remote": "b:2", "internal": "yes"}, "tcp_connections[0]: not {local, remote"),
    ({"local": "a:1", "remote": "b:2", "internal": True, "more": 1}, "tcp_connections[0]: not {local, remote"),
])
def test_a_listed_tcp_connection_is_checked(value: Any, problem: str) -> None:
    doc = full_doc()
    doc["targets"][0]["tcp_connections"] = [value]
    assert any(problem in p for p in schema.problems(doc, mf.SCHEMA_VERSION))
    doc["targets"][0]["tcp_connections"] = [dict(local="a:1", remote="b:2", internal=False)] * 257
    assert "targets[0].tcp_connections: not a list of at most 256 connections" in schema.problems(
        doc, mf.SCHEMA_VERSION)


@pytest.mark.parametrize("value, problem", [
    ({"mountpoint": "/data", "archive": "volumes/0.tar", "entries": 1, "bytes": 1},
     "volumes[0]: not {mountpoint, archive, entries, bytes, fstype}"),
    ({"mountpoint": "data", "archive": "volumes/0.tar", "entries": 1, "bytes": 1, "fstype": "x"},
     "volumes[0].mountpoint 'data' is not an absolute path"),
    ({"mountpoint": "/", "archive": "volumes/0.tar", "entries": 1, "bytes": 1, "fstype": "x"},
     "volumes[0].mountpoint '/' is / or named twice"),
    ({"mountpoint": "/data", "archive": "../../criu/pages-1.img", "entries": 1, "bytes": 1, "fstype": "x"},
     "volumes[0].archive '../../criu/pages-1.img' is not 'volumes/0.tar'"),
    ({"mountpoint": "/data", "archive": "volumes/0.tar", "entries": -1, "bytes": True, "fstype": "x"},
     "volumes[0].entries: not a non-negative integer"),
    ({"mountpoint": "/data", "archive": "volumes/0.tar", "entries": 1, "bytes": 1, "fstype": "a\nb"},
     "volumes[0].fstype: not a short string"),
])
def test_a_volume_taken_along_is_checked(value: Any, problem: str) -> None:
    doc = full_doc()
    doc["targets"][0]["volumes"] = [value]
    assert any(problem in p for p in schema.problems(doc, mf.SCHEMA_VERSION)), schema.problems(doc, mf.SCHEMA_VERSION)
    good = {"mountpoint": "/data", "archive": "volumes/0.tar", "entries": 1, "bytes": 1, "fstype": "x"}
    doc["targets"][0]["volumes"] = [good, dict(good, archive="volumes/1.tar")]
    assert "targets[0].volumes[1].mountpoint '/data' is / or named twice" in schema.problems(doc, mf.SCHEMA_VERSION)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.sampled_from(FULL_PATHS), json_values | hs.lists(hs.lists(hs.integers(), max_size=2), max_size=2))
def test_any_nested_field_replaced_by_any_json_value_is_judged(path: Tuple[Any, ...], value: Any) -> None:
    """Whatever a store writer puts at any place of a manifest - a list where a path was, a dict where a size
    was - the schema says so in words; it never raises (a TypeError once broke listing the whole store)."""
    found = schema.problems(replaced(path, value), mf.SCHEMA_VERSION)
    assert isinstance(found, list) and all(isinstance(p, str) for p in found)


@pytest.mark.parametrize("path, value", [
    (("files", 0, "path"), ["a", "b"]), (("files", 0, "path"), {"a": 1}), (("files", 1, "path"), 7),
    (("targets", 0, "workload_files", 0, "path"), ["x"]), (("labels",), {"k": ["v"]}),
    (("compression", "files"), {"containers/embed/criu/pages-1.img": []}),
    (("targets", 0, "mount_namespace", "mounts", 0), ["/"]),
])
def test_one_bad_manifest_of_any_shape_breaks_no_listing(store: st.FsStore, path: Tuple[Any, ...],
                                                         value: Any) -> None:
    """A manifest that fails the schema is listed as an error entry; the store's other snapshots still list,
    select and clean up."""
    good = make_snapshot(store, "embed", {"model": "m"})
    bad = make_snapshot(store, "embed", {"model": "m"})
    doc = replaced(path, value)
    doc["id"] = bad["id"]
    Path(store.snapshot_dir(bad["id"]), mf.MANIFEST).write_text(json.dumps(doc))
    listed = store.list()
    assert {d["id"] for d in listed if "error" not in d} == {good["id"]}
    assert [d for d in listed if "error" in d and d["id"] == bad["id"]], listed
    from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret  # pylint: disable=import-outside-toplevel
    decision = ret.plan(listed, [], ret.policy(keep_last=5, remove_broken=True))
    assert decision is not None


# --- selection never passes over a newer snapshot silently (issue 32, class 4) ---------------------------------------

def _select(store: st.FsStore, **kw: Any) -> Tuple[Dict[str, Any], List[Dict[str, str]]]:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf  # pylint: disable=import-outside-toplevel
    passed: List[Dict[str, str]] = []
    doc = pf.select(store, None, "embed", None, {"hostname": "node-a"}, skip_compat=True, passed_over=passed, **kw)
    return doc, passed


def test_a_newer_unreadable_snapshot_refuses_selection_unless_skipped(store: st.FsStore) -> None:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap  # pylint: disable=import-outside-toplevel
    older = make_snapshot(store, "embed")
    time.sleep(1.1)  # ids carry the second they were made in
    newer = make_snapshot(store, "embed")
    Path(store.snapshot_dir(newer["id"]), mf.MANIFEST).write_text('{"schema": 1, "id": 7}')
    with pytest.raises(snap.SnapshotError) as err:
        _select(store)
    assert "refusing to fall back to an older one silently" in str(err.value)
    assert err.value.details["outcome"] == "incompatible"
    assert [r.split(":")[0] for r in err.value.reasons] == [newer["id"]]
    doc, passed = _select(store, skip_unreadable=True)
    assert doc["id"] == older["id"] and [p["id"] for p in passed] == [newer["id"]]
    assert passed[0]["reason"].startswith("unreadable: ")


def test_an_older_unreadable_snapshot_is_no_reason_to_refuse(store: st.FsStore) -> None:
    broken = make_snapshot(store, "other")
    Path(store.snapshot_dir(broken["id"]), mf.MANIFEST).write_text("not json")
    time.sleep(1.1)
    good = make_snapshot(store, "embed")
    doc, passed = _select(store)
    assert doc["id"] == good["id"] and passed == []


def test_with_no_usable_match_a_broken_one_is_named(store: st.FsStore) -> None:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap  # pylint: disable=import-outside-toplevel
    broken = make_snapshot(store, "embed")
    Path(store.snapshot_dir(broken["id"]), mf.MANIFEST).write_text("not json")
    with pytest.raises(snap.SnapshotError) as err:
        _select(store)
    assert "newer than every match" in str(err.value) and err.value.reasons[0].startswith(broken["id"])


def test_criu_failing_on_changed_page_images_is_reported_as_the_mismatch(tmp_path: Path) -> None:
    """A writer changed the page images under an overlapped verify and CRIU stumbled on them: the error names
    the mismatch (the cause), not only CRIU's complaint; with intact images CRIU's own error stands."""
    import hashlib
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _overlap as ov
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
    from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError
    data = os.urandom(1 << 16)
    entry = {"path": "containers/x/criu/pages-1.img", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    image = tmp_path / "pages-1.img"
    failed = CriuError("CRIU restore failed: vdso: Invalid ELF magic", log_tail="tail")
    image.write_bytes(data)
    intact = ov.Overlap([(str(image), entry)]).start()
    assert rs._mismatch_first(intact, failed, {"id": "s1"}) is failed  # pylint: disable=protected-access
    image.write_bytes(data[::-1])
    changed = ov.Overlap([(str(image), entry)]).start()
    err = rs._mismatch_first(changed, failed, {"id": "s1"})  # pylint: disable=protected-access
    assert isinstance(err, snap.SnapshotError)
    assert "s1 refused: its page images do not match the manifest" in str(err) and "Invalid ELF magic" in str(err)
    assert err.reasons == [f"checksum: {entry['path']}: SHA256 mismatch (corrupted)"]
    assert err.log_tail == "tail"
