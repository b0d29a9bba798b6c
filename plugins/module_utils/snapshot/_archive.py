# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The standard checkpoint archive, read: what ``podman container checkpoint --export`` and the kubelet's
checkpoint API (CRI-O, containerd) write, streamed once, checked, and mapped onto a container snapshot.

The archive (tar; gzip or zstd compressed, or not) holds ``checkpoint/`` - CRIU's images of the whole
container as runc dumped it: its PID 1 with its PID namespace, the network namespace external as
``extRootNetNS``, each bind and cgroup mount external under its destination, masked files (``/proc/keys``
...) external as ``/dev/null`` - and beside it ``config.dump`` (the runtime's container config: name, id,
image), ``spec.dump`` (the OCI spec), ``rootfs-diff.tar`` and ``deleted.files`` (the root file system's
changes), ``devshm-checkpoint.tar`` (what ``/dev/shm`` held) and ``stats-dump``.

``read`` is the one pass over the archive: every member is checked (a regular file or a directory, a
relative name, each name once, only the names above and CRIU images), hashed, and handed to a sink (the
snapshot's staging, or nothing in check mode); the small members whose contents decide the mapping are
kept. ``plan`` turns those into the container's manifest entry, or lists every reason the archive cannot
become one (``_archiveimport`` publishes it). Nothing in the archive names a place outside its snapshot:
names are mapped, never joined.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import threading
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Set

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _images as im
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _container as ctr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as schema

IMAGES = "checkpoint/"
CONFIG, SPEC, DIFF, DELETED, DEVSHM, STATS = ("config.dump", "spec.dump", "rootfs-diff.tar", "deleted.files",
                                              "devshm-checkpoint.tar", "stats-dump")
TAKEN = (DIFF, DEVSHM, STATS)                  # copied into the snapshot
READ = (CONFIG, SPEC, DELETED)                 # read, mapped into the manifest
PASSED_OVER = ("network.status", "dump.log", "restore.log", "ctr.log", "bind.mounts", "pod.options", "pod.dump",
               "checkpoint/dump.log", "checkpoint/stats-dump", "checkpoint/restore.log")
SMALL_LIMIT = 16 << 20                         # the most a member read into memory may hold
NET_KEY = "extRootNetNS"                       # runc's key of the container's network namespace
MASKED_KEY = "/dev/null"                       # runc's key of a masked file
INVENTORY_HEADER = 4                           # inventory.img: its own magic only
FSTYPES = {1: "proc", 2: "sysfs", 3: "devtmpfs", 5: "tmpfs", 6: "devpts", 12: "cgroup", 14: "mqueue", 17: "overlay",
           23: "cgroup2"}                 # CRIU's numbers (images/mnt.proto) of the file systems a container mounts
_IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}
Sink = Callable[[str, IO[bytes], int], None]   # (archive member name, its data, its size)


class ArchiveError(WarmstartError):
    """An archive that cannot be read or imported; ``reasons`` lists every cause."""


@dataclass
class Archive:
    """What one pass over an archive found."""

    path: str
    compression: str = "none"
    sha256: str = ""
    size: int = 0
    small: Dict[str, bytes] = field(default_factory=dict)   # READ, checkpoint/descriptors.json, pstree, key images
    images: List[str] = field(default_factory=list)         # CRIU image files, by their name in checkpoint/
    taken: List[str] = field(default_factory=list)          # members of TAKEN present
    passed_over: List[str] = field(default_factory=list)    # members known and not needed
    problems: List[str] = field(default_factory=list)
    seen: Set[str] = field(default_factory=set)             # every regular member's name, once


class _Hashing(io.RawIOBase):
    """A file read through, hashed and counted as it passes."""

    def __init__(self, raw: IO[bytes], progress: Optional[Callable[[int], None]]) -> None:
        super().__init__()
        self.raw, self.digest, self.count, self.progress = raw, hashlib.sha256(), 0, progress

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self.raw.read(len(buf))
        n = len(data)
        buf[:n] = data
        self.digest.update(data)
        self.count += n
        if self.progress is not None:
            self.progress(n)
        return n


def read(path: str, sink: Optional[Sink], progress: Optional[Callable[[int], None]] = None) -> Archive:
    """One pass over the archive at ``path``: members checked, hashed, handed to ``sink`` (None: read only);
    ``progress`` is told the bytes of the file read."""
    out = Archive(path=path)
    try:
        raw = open(path, "rb")  # pylint: disable=consider-using-with  # closed below, after the stream
    except OSError as exc:
        raise ArchiveError(f"archive {path}: cannot be opened ({exc.strerror or exc})") from None
    with raw:
        head = raw.read(4)
        raw.seek(0)
        out.compression = _MAGIC.get(head, _MAGIC.get(head[:2], "none"))
        hashing = _Hashing(raw, progress)
        stream: IO[bytes] = io.BufferedReader(hashing, 1 << 20)
        with contextlib.ExitStack() as stack:
            if out.compression == "zstd":
                stream = stack.enter_context(_unzstd(stream, path))
            try:
                with tarfile.open(fileobj=stream, mode="r|gz" if out.compression == "gzip" else "r|") as tar:
                    for member in tar:
                        _member(out, tar, member, sink)
                while stream.read(1 << 20):
                    pass  # the rest (tar padding), so that the digest covers the whole file
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                kind = "tar" if out.compression == "none" else f"{out.compression}-compressed tar"
                raise ArchiveError(f"archive {path}: not a readable {kind} archive ({exc})") from None
        out.sha256, out.size = hashing.digest.hexdigest(), hashing.count
    return out


@contextlib.contextmanager
def _unzstd(src: IO[bytes], path: str) -> Iterator[IO[bytes]]:
    """``src`` decompressed: by the Python zstandard library, else by the ``zstd`` program (fed from a thread,
    so that every byte still passes through ``src``)."""
    decompressor: Any = None
    try:
        import zstandard  # pylint: disable=import-outside-toplevel
        decompressor = zstandard.ZstdDecompressor()
    except ImportError:
        pass
    if decompressor is not None:
        yield decompressor.stream_reader(src)
        return
    binary = shutil.which("zstd")
    if not binary:
        raise ArchiveError(f"archive {path} is zstd-compressed and this node has neither the Python zstandard "
                           "library nor the zstd program (node_prep installs python3-zstandard)")
    proc = subprocess.Popen([binary, "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                            stderr=subprocess.DEVNULL)
    if proc.stdin is None or proc.stdout is None:
        raise ArchiveError(f"archive {path}: zstd could not be started with pipes")

    def feed(sink: IO[bytes]) -> None:
        try:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                sink.write(chunk)
        except OSError:
            pass  # the reader stopped early (a refused archive): it is killed below
        finally:
            with contextlib.suppress(OSError):
                sink.close()

    feeder = threading.Thread(target=feed, args=(proc.stdin,), daemon=True)
    feeder.start()
    try:
        yield proc.stdout
    finally:
        if proc.poll() is None and feeder.is_alive():
            proc.kill()
        proc.stdout.close()
        feeder.join()
        if proc.wait() not in (0, -9):
            raise ArchiveError(f"archive {path}: zstd could not decompress it (exit {proc.returncode})")


def _member(out: Archive, tar: tarfile.TarFile, member: tarfile.TarInfo, sink: Optional[Sink]) -> None:
    name = member.name[2:] if member.name.startswith("./") else member.name
    name = name.rstrip("/") + ("/" if member.isdir() else "")
    where = f"archive member {member.name!r}"
    if name.startswith("/") or ".." in name.split("/") or not name or schema.relpath_problem(name.rstrip("/")):
        if name not in ("", "/"):
            out.problems.append(f"{where}: not a plain relative name")
        return
    if member.isdir():
        return
    if not member.isreg():
        out.problems.append(f"{where}: a {_kind(member)}, only regular files and directories are read")
        return
    if name in out.seen:
        out.problems.append(f"{where}: listed twice")
        return
    out.seen.add(name)
    data = tar.extractfile(member)
    if data is None:
        return
    if name.startswith(IMAGES) and name.count("/") == 1 and name not in PASSED_OVER:
        base = name[len(IMAGES):]
        if base == "descriptors.json":
            out.small[name] = _small(data, member, where, out)
        elif _IMAGE_RE.fullmatch(base) and ".." not in base:
            out.images.append(base)
            if base == "pstree.img" or base == "inventory.img" or im.is_key_image(base):
                out.small[name] = _small(data, member, where, out)
                data = io.BytesIO(out.small[name])
            if sink is not None:
                sink(name, data, member.size)
        else:
            out.problems.append(f"{where}: not a CRIU image name")
    elif name in READ:
        out.small[name] = _small(data, member, where, out)
    elif name in TAKEN:
        out.taken.append(name)
        if sink is not None:
            sink(name, data, member.size)
    else:  # network.status, logs, artifacts/, and what a newer runtime adds: not needed for a restore
        out.passed_over.append(name)


def _small(data: IO[bytes], member: tarfile.TarInfo, where: str, out: Archive) -> bytes:
    if member.size > SMALL_LIMIT:
        out.problems.append(f"{where}: {member.size} bytes, more than {SMALL_LIMIT >> 20} MiB")
        return b""
    return data.read()


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hard link"
    if member.isfifo():
        return "fifo"
    return "device node" if member.ischr() or member.isblk() else "special file"


def _json(out: Archive, name: str, kind: type) -> Any:
    data = out.small.get(name)
    if data is None:
        out.problems.append(f"{name}: missing from the archive")
        return kind()
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        out.problems.append(f"{name}: not JSON ({exc})")
        return kind()
    if not isinstance(doc, kind):
        out.problems.append(f"{name}: not a JSON {'object' if kind is dict else 'list'}")
        return kind()
    return doc


@dataclass
class Plan:
    """An archive mapped onto a container snapshot: its manifest entry, and what the images need renamed."""

    entry: Dict[str, Any]
    net_keys: Dict[str, str]
    mount_keys: Dict[str, str]
    deleted: Dict[str, List[str]]


def plan(out: Archive, container_name: Optional[str]) -> Plan:
    """The container's manifest entry (``containers/<name>``); ArchiveError listing every reason it cannot be."""
    config, spec = _json(out, CONFIG, dict), _json(out, SPEC, dict)
    stdio = _json(out, IMAGES + "descriptors.json", list)
    deleted = _json(out, DELETED, list) if DELETED in out.small else []
    problems = list(out.problems)
    for need in ("inventory.img", "pstree.img"):
        if need not in out.images:
            problems.append(f"checkpoint/{need}: missing from the archive (no CRIU dump in it)")
    name = container_name or config.get("name")
    if not schema.is_name(name):
        problems.append(f"config.dump: container name {name!r} is not a safe name (give container_name)")
    problems += _spec_problems(spec)
    ns_pids = _ns_pids(out, problems)
    problems += _plugin_problems(out)
    keys = _keys(out, problems)
    if not all(isinstance(s, str) for s in stdio) or len(stdio) > 3:
        problems.append("checkpoint/descriptors.json: not a list of at most 3 strings")
    if not all(isinstance(p, str) and schema.abspath_problem(p) is None for p in deleted):
        problems.append("deleted.files: not a list of absolute paths")
    problems = list(dict.fromkeys(problems))
    if problems:
        raise ArchiveError(f"archive {out.path} cannot be imported as a container snapshot"
                           + (f": {problems[0]}" if len(problems) == 1 else f" ({len(problems)} reasons)"),
                           problems if len(problems) > 1 else None)
    sources = {m.get("destination"): m.get("source") for m in _list(spec.get("mounts")) if isinstance(m, dict)}
    external, net_keys, mount_keys = [], {NET_KEY: ctr.EXT_NET}, {}
    for m in keys["mounts"]:
        masked = m["key"] == MASKED_KEY and m["mountpoint"] != MASKED_KEY
        if masked:
            mount_keys[m["mountpoint"]] = m["mountpoint"]
        source = sources.get(m["mountpoint"])
        external.append({"mountpoint": m["mountpoint"], "fstype": FSTYPES.get(m["fstype"], ""), "source": source if isinstance(source, str)
                         else "", **({"masked": True} if masked else {})})
    process, linux = _dict(spec.get("process")), _dict(spec.get("linux"))
    entry: Dict[str, Any] = {
        "name": name, "kind": "container", "ns_pid": 1, "ns_pids": ns_pids, "pid_namespace": True,
        "cmdline": [a for a in _list(process.get("args")) if isinstance(a, str)][:64],
        "workload": None, "workload_files": [], "control_dir": None, "files_in_use": {},
        "path": f"containers/{name}",
        "container": {"runtime": str(config.get("runtime") or ""), "id": str(config.get("id") or ""),
                      "name": str(config.get("name") or name), "image": str(config.get("rootfsImageName") or ""),
                      "image_id": _image_id(config), "hostname": str(spec.get("hostname") or ""),
                      "cgroup_path": str(linux.get("cgroupsPath") or "")},
        "external_mounts": external, "stdio": [str(s) for s in stdio], "ready_for_snapshot": False,
        "session": {"own_session": True, "moved_from": {}},
    }
    return Plan(entry=entry, net_keys=net_keys, mount_keys=mount_keys,
                deleted={"deleted": [str(p) for p in deleted], "opaque": []})


def _image_id(config: Dict[str, Any]) -> str:
    """The image id a placeholder must run: podman's ``rootfsImageID``, CRI-O's and containerd's
    ``rootfsImageRef`` (``sha256:`` dropped from a bare id, as runtimes report ids)."""
    ref = str(config.get("rootfsImageID") or config.get("rootfsImageRef") or "")
    return ref[len("sha256:"):] if re.fullmatch(r"sha256:[0-9a-f]{64}", ref) else ref


def _spec_problems(spec: Dict[str, Any]) -> List[str]:
    """What of the OCI spec a restore into a placeholder cannot give the workload."""
    problems = []
    process = _dict(spec.get("process"))
    if process.get("terminal"):
        problems.append("spec.dump: the container has a terminal (podman run -t, tty: true); its restore needs "
                        "that console, which no placeholder hands over - checkpoint a container without one")
    namespaces = _dict(spec.get("linux")).get("namespaces")
    kinds = {n.get("type"): n for n in namespaces if isinstance(n, dict)} if isinstance(namespaces, list) else {}
    if "user" in kinds:
        problems.append("spec.dump: the container runs in a user namespace (rootless or --userns); warmstart "
                        "restores containers of rootful runtimes")
    if "pid" in kinds and kinds["pid"].get("path"):
        problems.append("spec.dump: the container joined another PID namespace (a pod sharing one); its dump "
                        "is not a whole PID namespace")
    if "network" not in kinds:
        problems.append("spec.dump: the container uses the host's network; its restore would take the node's")
    return problems


def _dict(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def _ns_pids(out: Archive, problems: List[str]) -> List[int]:
    data = out.small.get(IMAGES + "pstree.img")
    if not data:
        return []
    try:
        entries = im.decode(data, im.message("pstree_pb2", "pstree_entry"), "checkpoint/pstree.img")[1]
    except im.ImageError as exc:
        problems.append(str(exc))
        return []
    if not entries or entries[0].pid != 1:
        problems.append("checkpoint/pstree.img: its root task is not PID 1 of its namespace (not a whole "
                        "container's dump)")
    return [int(e.pid) for e in entries]


def _plugin_problems(out: Archive) -> List[str]:
    """A dump that CRIU plugins took part in (CRIU's CUDA or AMD GPU plugin: GPU state) needs them at restore,
    which a restore into a placeholder does not run."""
    data = out.small.get(IMAGES + "inventory.img")
    if not data:
        return []
    try:
        entries = im.decode(data, im.message("inventory_pb2", "inventory_entry"), "checkpoint/inventory.img",
                            header=INVENTORY_HEADER)[1]
    except im.ImageError as exc:
        return [str(exc)]
    plugins = sorted({str(p) for e in entries if e.HasField("plugins_entry") for p in e.plugins_entry.plugins})
    if not plugins:
        return []
    return [f"checkpoint/inventory.img: CRIU's plugins {', '.join(plugins)} took part in the dump (GPU state); "
            "warmstart restores GPU containers from its own snapshots only (checkpoint with accelerator: cuda)"]


def _keys(out: Archive, problems: List[str]) -> Dict[str, Any]:
    small = {n[len(IMAGES):]: d for n, d in out.small.items() if n.startswith(IMAGES)}
    try:
        keys = im.external_keys({n: d for n, d in small.items() if im.is_key_image(n)})
    except im.ImageError as exc:
        problems.append(str(exc))
        return {"net": [], "mounts": []}
    if keys["net"] != [NET_KEY]:
        problems.append(f"checkpoint: the dump's external network namespaces are {keys['net'] or 'none'}, not "
                        f"the container's own ({NET_KEY}): not a runc dump of a container with its own network")
    odd = [f"{m['mountpoint']} ({m['key']})" for m in keys["mounts"]
           if m["key"] not in (m["mountpoint"], MASKED_KEY) or schema.abspath_problem(m["mountpoint"])]
    if odd:
        problems.append(f"checkpoint: external mounts under keys warmstart cannot map: {', '.join(odd)}")
    return keys


def summary(out: Archive) -> Dict[str, Any]:
    """The archive as a result and the manifest's ``imported`` record say it."""
    return {"path": out.path, "sha256": out.sha256, "size": out.size, "compression": out.compression,
            "images": len(out.images), "passed_over": sorted(out.passed_over)}
