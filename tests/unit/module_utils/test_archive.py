"""_archive and _archiveimport: a container checkpoint archive (podman's, the kubelet's) read, checked, mapped and
published as a container snapshot.

pycriu is not in the test venv: the CRIU messages the import reads (pstree_entry, mnt_entry, netns_entry) are
built here from descriptors with their real field numbers (CRIU's images/*.proto), the same wire format; fields
left out of them survive a rewrite as unknown fields. test_checkpoint_archive.py runs it on real podman archives.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _images as im
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archive as arc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archiveimport as ai
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as schema
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths as paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores
from tests.support.signing_keys import keys_dir

F = descriptor_pb2.FieldDescriptorProto
FIELDS = {  # message -> (name, number, type, label): the fields of CRIU's messages the import reads or writes
    "pstree_entry": [("pid", 1, F.TYPE_UINT32, F.LABEL_REQUIRED), ("ppid", 2, F.TYPE_UINT32, F.LABEL_REQUIRED),
                     ("pgid", 3, F.TYPE_UINT32, F.LABEL_REQUIRED), ("sid", 4, F.TYPE_UINT32, F.LABEL_REQUIRED)],
    "mnt_entry": [("fstype", 1, F.TYPE_UINT32, F.LABEL_REQUIRED), ("root", 6, F.TYPE_STRING, F.LABEL_REQUIRED),
                  ("mountpoint", 7, F.TYPE_STRING, F.LABEL_REQUIRED), ("ext_mount", 13, F.TYPE_BOOL, F.LABEL_OPTIONAL),
                  ("ext_key", 18, F.TYPE_STRING, F.LABEL_OPTIONAL)],
    "netns_entry": [("ext_key", 8, F.TYPE_STRING, F.LABEL_OPTIONAL)],
    "plugins_entry": [("plugins", 12, F.TYPE_STRING, F.LABEL_REPEATED)],
    "inventory_entry": [("img_version", 1, F.TYPE_UINT32, F.LABEL_REQUIRED),
                        ("plugins_entry", 12, F.TYPE_MESSAGE, F.LABEL_OPTIONAL)],
}


def _classes() -> Dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(name="archive_test.proto", package="wstest", syntax="proto2")
    for name, fields in FIELDS.items():
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, label in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if ftype == F.TYPE_MESSAGE:
                field.type_name = ".wstest.plugins_entry"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"wstest.{n}")) for n in FIELDS}


MSG = _classes()


@pytest.fixture(autouse=True)
def fake_pycriu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(im, "message", lambda _module, name: MSG[name])


def image(kind: str, *entries: Dict[str, Any]) -> bytes:
    """An image of ``entries``: inventory.img has its own magic only, every other one CRIU's common magic first."""
    out = [struct.pack("<I", 0x58313116) if kind == "inventory_entry" else struct.pack("<II", 0x54564319, 0x12345678)]
    for fields in entries:
        body = MSG[kind](**fields).SerializeToString()
        out.append(struct.pack("<I", len(body)) + body)
    return b"".join(out)


MOUNTS = [  # what runc declares external in a podman container
    {"fstype": 0, "root": "/hosts", "mountpoint": "/etc/hosts", "ext_key": "/etc/hosts"},
    {"fstype": 5, "root": "/", "mountpoint": "/dev/shm", "ext_key": "/dev/shm"},
    {"fstype": 5, "root": "/null", "mountpoint": "/proc/keys", "ext_key": "/dev/null"},
    {"fstype": 12, "root": "/libpod", "mountpoint": "/sys/fs/cgroup/cpu", "ext_key": "/sys/fs/cgroup/cpu"},
    {"fstype": 1, "root": "/", "mountpoint": "/proc"},   # not external
]


def spec(**change: Any) -> Dict[str, Any]:
    doc: Dict[str, Any] = {
        "hostname": "907273a9a326", "process": {"args": ["python3", "server.py"], "terminal": False},
        "mounts": [{"destination": "/etc/hosts", "type": "bind", "source": "/run/ctr/hosts"},
                   {"destination": "/dev/shm", "type": "bind", "source": "/var/lib/ctr/shm"}],
        "linux": {"cgroupsPath": "/libpod_parent/libpod-9072", "namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/run/netns/x"}, {"type": "mount"}]}}
    doc.update(change)
    return doc


def members(**change: Optional[bytes]) -> Dict[str, Optional[bytes]]:
    """A podman archive's members (name -> bytes); ``change`` replaces (None: leaves out) members by name, with
    '__' for '/' and '_' for '.'."""
    config = {"id": "9072" * 16, "name": "embed", "rootfsImageName": "localhost/embed:1",
              "rootfsImageID": "ab" * 32, "runtime": "runc"}
    out: Dict[str, Optional[bytes]] = {
        "config.dump": json.dumps(config).encode(), "spec.dump": json.dumps(spec()).encode(),
        "network.status": b"{}", "stats-dump": b"", "rootfs-diff.tar": tar_bytes({"tmp/count": b"11"}),
        "deleted.files": json.dumps(["/etc/motd"]).encode(),
        "devshm-checkpoint.tar": tar_bytes({"./": None, "seg": b"shared"}),
        "checkpoint/inventory.img": image("inventory_entry", {"img_version": 2}),
        "checkpoint/pstree.img": image("pstree_entry", dict(pid=1, ppid=0, pgid=1, sid=1),
                                       dict(pid=7, ppid=1, pgid=1, sid=1)),
        "checkpoint/mountpoints-13.img": image("mnt_entry", *MOUNTS),
        "checkpoint/netns-10.img": image("netns_entry", {"ext_key": "extRootNetNS"}),
        "checkpoint/pages-1.img": os.urandom(8192),
        "checkpoint/descriptors.json": json.dumps(["/dev/null", "pipe:[11]", "pipe:[12]"]).encode(),
    }
    for key, value in change.items():
        out[key.replace("__", "/").replace("_", ".")] = value
    return out


def tar_bytes(files: Dict[str, Optional[bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_archive(path: Path, files: Dict[str, Optional[bytes]], mode: str = "w",
                  extra: Tuple[tarfile.TarInfo, ...] = ()) -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            if data is None:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return path


def test_a_podman_archive_maps_onto_a_container_entry(tmp_path: Path) -> None:
    out = arc.read(str(write_archive(tmp_path / "a.tar", members())), None)
    assert out.compression == "none" and not out.problems
    assert sorted(out.passed_over) == ["network.status"]
    plan = arc.plan(out, None)
    e = plan.entry
    assert (e["name"], e["path"], e["kind"], e["pid_namespace"], e["ns_pids"]) == \
        ("embed", "containers/embed", "container", True, [1, 7])
    assert e["container"]["image_id"] == "ab" * 32 and e["container"]["cgroup_path"] == "/libpod_parent/libpod-9072"
    assert e["stdio"] == ["/dev/null", "pipe:[11]", "pipe:[12]"] and e["cmdline"] == ["python3", "server.py"]
    mounts = {m["mountpoint"]: m for m in e["external_mounts"]}
    assert sorted(mounts) == ["/dev/shm", "/etc/hosts", "/proc/keys", "/sys/fs/cgroup/cpu"]
    assert mounts["/proc/keys"]["masked"] is True and "masked" not in mounts["/etc/hosts"]
    assert mounts["/etc/hosts"]["source"] == "/run/ctr/hosts" and mounts["/sys/fs/cgroup/cpu"]["fstype"] == "cgroup"
    assert plan.net_keys == {"extRootNetNS": "warmstart-net"} and plan.mount_keys == {"/proc/keys": "/proc/keys"}
    assert plan.deleted == {"deleted": ["/etc/motd"], "opaque": []}
    assert arc.plan(out, "server").entry["path"] == "containers/server"


def test_a_cri_archive_names_its_image_by_reference(tmp_path: Path) -> None:
    """CRI-O's and containerd's config.dump (the kubelet's archives) say rootfsImageRef where podman says
    rootfsImageID."""
    config = {"id": "c0ffee", "name": "server", "rootfsImageName": "registry.local/embed:1",
              "rootfsImageRef": "sha256:" + "cd" * 32, "runtime": "crun"}
    out = arc.read(str(write_archive(tmp_path / "a.tar", members(config_dump=json.dumps(config).encode()))), None)
    container = arc.plan(out, None).entry["container"]
    assert container["image_id"] == "cd" * 32 and container["runtime"] == "crun"


@pytest.mark.parametrize("mode,compression", [("w:gz", "gzip"), ("w", "none")])
def test_compression_is_told_by_its_magic_and_the_digest_covers_the_file(tmp_path: Path, mode: str,
                                                                         compression: str) -> None:
    path = write_archive(tmp_path / "a.tar", members(), mode)
    out = arc.read(str(path), None)
    assert out.compression == compression and out.size == path.stat().st_size
    assert out.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_zstd_archive_is_read(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    plain = write_archive(tmp_path / "a.tar", members())
    path = tmp_path / "a.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    out = arc.read(str(path), None)
    assert out.compression == "zstd" and "pstree.img" in out.images


def _info(name: str, kind: bytes, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


def test_every_reason_an_archive_is_refused_is_listed_at_once(tmp_path: Path) -> None:
    bad_spec = spec(process={"args": ["sh"], "terminal": True},
                    linux={"namespaces": [{"type": "pid", "path": "/proc/1/ns/pid"}, {"type": "user"}]})
    files = members(spec_dump=json.dumps(bad_spec).encode(), checkpoint__pstree_img=None,
                    checkpoint__netns__10_img=None)
    files["checkpoint/netns-10.img"] = image("netns_entry", {"ext_key": "other"})
    odd = {"fstype": 0, "root": "/", "mountpoint": "/x", "ext_key": "weird"}
    files["checkpoint/mountpoints-13.img"] = image("mnt_entry", *MOUNTS, odd)
    path = write_archive(tmp_path / "a.tar", files, extra=(
        _info("checkpoint/evil.img", tarfile.SYMTYPE, link="/etc/shadow"), _info("/abs", tarfile.REGTYPE, 1),
        _info("dev", tarfile.CHRTYPE), _info("checkpoint/pages-1.img", tarfile.REGTYPE, 3)))
    out = arc.read(str(path), None)
    with pytest.raises(arc.ArchiveError) as err:
        arc.plan(out, None)
    reasons = "\n".join(err.value.reasons)
    for fragment in ("'checkpoint/evil.img': a symlink", "'/abs': not a plain relative name", "'dev': a device node",
                     "'checkpoint/pages-1.img': listed twice", "checkpoint/pstree.img: missing", "has a terminal",
                     "user namespace", "joined another PID namespace", "are ['other']", "/x (weird)",
                     "the host's network"):
        assert fragment in reasons, fragment
    assert "(11 reasons)" in str(err.value)


@pytest.mark.parametrize("change,fragment", [
    ({"config_dump": None}, "config.dump: missing"),
    ({"config_dump": b"{"}, "config.dump: not JSON"),
    ({"config_dump": json.dumps({"name": "../etc"}).encode()}, "'../etc' is not a safe name"),
    ({"spec_dump": json.dumps(spec(linux={"namespaces": [{"type": "pid"}]})).encode()}, "the host's network"),
    ({"checkpoint__descriptors_json": b'{"a": 1}'}, "descriptors.json: not a JSON list"),
    ({"deleted_files": json.dumps(["../x"]).encode()}, "deleted.files: not a list of absolute paths"),
    ({"checkpoint__pstree_img": image("pstree_entry", dict(pid=40, ppid=1, pgid=40, sid=40))}, "not PID 1"),
    ({"checkpoint__inventory_img": image("inventory_entry", {"img_version": 2, "plugins_entry": {
        "plugins": ["cuda_plugin"]}})}, "CRIU's plugins cuda_plugin took part in the dump"),
])
def test_a_bad_member_is_refused_naming_it(tmp_path: Path, change: Dict[str, Optional[bytes]], fragment: str) -> None:
    out = arc.read(str(write_archive(tmp_path / "a.tar", members(**change))), None)
    with pytest.raises(arc.ArchiveError, match="cannot be imported") as err:
        arc.plan(out, None)
    assert fragment in err.value.full_message()


def test_what_is_not_an_archive_is_said(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x1f\x8bnot gzip at all" * 40)
    with pytest.raises(arc.ArchiveError, match="not a readable gzip-compressed tar archive"):
        arc.read(str(tmp_path / "junk"), None)
    with pytest.raises(arc.ArchiveError, match="cannot be opened"):
        arc.read(str(tmp_path / "missing.tar"), None)


def fake_criu(tmp_path: Path) -> str:
    path = tmp_path / "criu"
    path.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Version: 4.2.1'\n")
    path.chmod(0o755)
    return str(path)


def published(store: st.FsStore) -> List[Dict[str, Any]]:
    return store.list()


def test_an_import_publishes_a_snapshot_a_restore_reads_and_a_second_changes_nothing(tmp_path: Path,
                                                                                     store: st.FsStore) -> None:
    path = str(write_archive(tmp_path / "a.tar.gz", members(), "w:gz"))
    criu = fake_criu(tmp_path)
    preview = ai.import_archive(store, path, criu_path=criu, check_mode=True)
    assert preview["changed"] is True and preview["snapshot"] is None and published(store) == []
    assert os.listdir(os.path.join(store.root, "tmp")) == []
    res = ai.import_archive(store, path, labels={"model": "m"}, criu_path=criu)
    assert res["changed"] is True and res["container"]["name"] == "embed"
    doc = store.load(res["snapshot"]["id"])  # validated against the schema
    assert doc["imported"]["sha256"] == res["archive"]["sha256"] and doc["imported"]["compression"] == "gzip"
    assert doc["labels"] == {"model": "m"} and doc["name"] == "embed"
    top = Path(store.snapshot_dir(doc["id"]))
    files = sorted(f["path"] for f in doc["files"])
    assert files == ["containers/embed/criu/inventory.img", "containers/embed/criu/mountpoints-13.img",
                     "containers/embed/criu/netns-10.img", "containers/embed/criu/pages-1.img",
                     "containers/embed/criu/pstree.img", "containers/embed/criu/stats-dump",
                     "containers/embed/deleted-files.json", "containers/embed/rootfs-diff.tar",
                     "containers/embed/volumes/0.tar"]
    assert store.verify(doc) == []
    images = top / "containers/embed/criu"
    keys = im.external_keys({n: (images / n).read_bytes() for n in ("netns-10.img", "mountpoints-13.img")})
    assert keys["net"] == ["warmstart-net"]
    assert {m["mountpoint"]: m["key"] for m in keys["mounts"]}["/proc/keys"] == "/proc/keys"
    target = doc["targets"][0]
    assert target["volumes"] == [{"mountpoint": "/dev/shm", "archive": "volumes/0.tar", "entries": 1, "bytes": 6,
                                  "fstype": "tmpfs"}]
    assert json.loads((top / "containers/embed/deleted-files.json").read_text())["deleted"] == ["/etc/motd"]
    for entry in top.rglob("*"):
        assert entry.stat().st_mode & 0o077 == 0, entry
    again = ai.import_archive(store, path, labels={"model": "m"}, criu_path=criu)
    assert again["changed"] is False and again["snapshot"]["id"] == doc["id"] and len(published(store)) == 1
    assert ai.import_archive(store, path, criu_path=criu, check_mode=True)["changed"] is False


def test_a_refused_import_publishes_nothing_and_leaves_no_staging(tmp_path: Path, store: st.FsStore) -> None:
    path = str(write_archive(tmp_path / "a.tar", members(spec_dump=json.dumps(spec(process={"terminal": True})).encode())))
    with pytest.raises(arc.ArchiveError, match="has a terminal"):
        ai.import_archive(store, path, criu_path=fake_criu(tmp_path))
    assert published(store) == [] and os.listdir(os.path.join(store.root, "tmp")) == []


def test_the_schema_checks_what_an_import_adds() -> None:
    doc = mf.new_manifest(mf.new_id(), "embed", {}, {"arch": "x86_64"})
    doc["imported"] = {"format": "checkpoint-archive", "sha256": "xyz", "size": -1, "compression": 3}
    doc["targets"] = [{"name": "embed", "path": "containers/embed", "kind": "container",
                       "external_mounts": [{"mountpoint": "/proc/keys", "masked": "yes"}]}]
    found = "\n".join(schema.problems(doc, mf.SCHEMA_VERSION))
    for fragment in ("imported.sha256", "imported.size", "imported.compression", "masked is not a boolean"):
        assert fragment in found


def test_without_the_zstandard_library_the_zstd_program_decompresses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module interpreter of a node may lack python3-zstandard (podman's archives are zstd by default)."""
    zstandard = pytest.importorskip("zstandard")
    plain = write_archive(tmp_path / "a.tar", members())
    path = tmp_path / "a.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)  # import zstandard raises ImportError
    out = arc.read(str(path), None)
    assert out.compression == "zstd" and "pstree.img" in out.images
    assert out.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(path.read_bytes()[:600])
    with pytest.raises(arc.ArchiveError, match="zstd could not decompress it|not a readable zstd-compressed tar"):
        arc.read(str(path), None)
    monkeypatch.setenv("PATH", str(tmp_path))  # neither the library nor the program
    with pytest.raises(arc.ArchiveError, match="neither the Python zstandard library nor the zstd program"):
        arc.read(str(path), None)


def test_a_signing_node_signs_what_it_imports_and_a_trusting_one_refuses_it_altered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kid = keys_dir(tmp_path / "keys")
    monkeypatch.setenv(paths.KEYS_DIR_ENV, str(tmp_path / "keys"))
    store = stores.open_store(str(tmp_path / "store"), {"cache_dir": str(tmp_path / "cache")})
    path = str(write_archive(tmp_path / "a.tar", members()))
    res = ai.import_archive(store, path, criu_path=fake_criu(tmp_path))
    top = Path(store.snapshot_dir(res["snapshot"]["id"]))
    raw = json.loads((top / mf.MANIFEST).read_text())
    assert raw["signature"]["key_id"] == kid and store.load(raw["id"])["imported"]["sha256"] == res["archive"]["sha256"]
    raw["labels"] = {"model": "other"}  # any change to the signed manifest
    (top / mf.MANIFEST).chmod(0o600)
    (top / mf.MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(WarmstartError, match="signature"):
        store.load(raw["id"])


def test_progress_counts_the_bytes_of_the_file_read(tmp_path: Path) -> None:
    path = write_archive(tmp_path / "a.tar.gz", members(), "w:gz")
    seen: List[int] = []
    arc.read(str(path), None, seen.append)
    assert sum(seen) == path.stat().st_size


def test_what_an_archive_cannot_hold_is_every_reason_an_export_refuses() -> None:
    from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _archiveexport as ae

    whole = {"name": "embed", "kind": "container", "pid_namespace": True, "volumes": [{"mountpoint": "/dev/shm"}],
             "rootfs_diff": {"opaque": 0}}
    assert ae.exportable({"targets": [whole]}) == []
    assert "of kind(s) process" in ae.exportable({"targets": [dict(whole, kind="process")]})[0]
    assert "2 target(s)" in ae.exportable({"targets": [whole, whole]})[0]
    found = ae.exportable({"gpu": {"gpus": [{}]}, "targets": [dict(
        whole, pid_namespace=False, volumes=[{"mountpoint": "/cache"}], rootfs_diff={"opaque": 2})]})
    assert len(found) == 4
    for fragment, reason in zip(("beside the container's init", "GPU state", "volumes /cache", "whole directories"),
                                found):
        assert fragment in reason
