# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The manifest schema: every field a node reads from a store, checked before any use.

A store is written by many nodes, so a manifest is untrusted input. ``problems(doc)`` returns one
sentence per bad field (all of them, not the first), naming the field by its JSON path. Invariants
that hold for a manifest with no problems:

- ``id``, ``name``, target names and workload names match their patterns in full (no trailing
  newline, no empty string, no '/' or '..');
- every path (``files[].path``, ``targets[].workload_files[].path``) is relative, normalised, free of
  '.', '..', empty components and control characters; ``targets[].path`` is exactly
  ``containers/<target name>``: nothing in a manifest can name a place outside its snapshot;
- modes are permission bits only (no setuid, setgid or sticky bit);
- every field the engine reads has the type it expects, so a hostile manifest fails here, with its
  reasons, instead of raising inside the engine.

Pure, stdlib only. Node-side locations (workload dirs, control dirs, pidfiles) are never taken from
a manifest: ``workloads_root`` and ``control_dir`` are only compared with the node's own.
"""
from __future__ import annotations

import datetime
import re
from typing import Any, Dict, List, Optional

MAX_DEPTH = 32
MAX_FILES = 100_000
MAX_TCP = 256           # listed TCP connections of one target (criu/_tcp.MAX_CONNECTIONS)
MAX_VOLUMES = 64        # volumes one container snapshot takes along (a pod's emptyDir volumes)
MAX_TARGETS = 64
MAX_PATH = 4096
MIN_CHUNK, MAX_CHUNK = 1 << 20, 1 << 30   # chunk digests (_digest)
ZSTD_ALG = "zstd-frames-v1"                # the compression block (_zstd)
MIN_FRAME, MAX_FRAME = 1 << 16, 1 << 26
MAX_PLAIN = 1 << 44                        # 16 TiB: a compressed file's declared plaintext size

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ID_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_KEY_ID_RE = re.compile(r"[0-9a-f]{16}")
_B64_RE = re.compile(r"[A-Za-z0-9+/]{1,1020}={0,2}")
TCP_MODES = ("established", "close", "none")
NETWORK_LOCKS = ("nftables", "iptables", "skip")
KINDS = ("process", "container")


def is_name(value: Any) -> bool:
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None and ".." not in value


def is_id(value: Any) -> bool:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def is_label_key(value: Any) -> bool:
    return isinstance(value, str) and _LABEL_KEY_RE.fullmatch(value) is not None


def relpath_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a safe relative path inside a snapshot (None when it is)."""
    if not isinstance(value, str) or not value:
        return "is not a non-empty string"
    if len(value) > MAX_PATH:
        return f"is longer than {MAX_PATH} characters"
    if _CONTROL_RE.search(value):
        return "contains a control character"
    if value.startswith("/"):
        return "is absolute"
    if any(part in ("", ".", "..") for part in value.split("/")):
        return "has an empty, '.' or '..' component"
    return None


def abspath_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a normalised absolute path (None when it is)."""
    if not isinstance(value, str) or not value.startswith("/"):
        return "is not an absolute path"
    if len(value) > MAX_PATH or _CONTROL_RE.search(value):
        return "is too long or contains a control character"
    if value != "/" and any(part in ("", ".", "..") for part in value[1:].split("/")):
        return "is not normalised (empty, '.' or '..' component)"
    return None


def depth(doc: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value, counted without recursion; stops counting past ``limit``."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, level + 1) for child in children)
    return deepest


def _typed(doc: Dict[str, Any], key: str, kind: Any, where: str, out: List[str], required: bool = True) -> Any:
    value = doc.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        out.append(f"{where}{key}: {'missing' if key not in doc else 'not a ' + name}")
        return None
    return value


def _created_at(value: Any, out: List[str]) -> None:
    try:
        datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except (TypeError, ValueError):
        out.append(f"created_at: {value!r} is not a UTC timestamp like 2026-12-03T10:00:00.000000Z")


def _labels(value: Any, out: List[str]) -> None:
    if not isinstance(value, dict):
        out.append("labels: not a mapping of strings")
        return
    for key, val in value.items():
        if not is_label_key(key):
            out.append(f"labels: key {key!r} is not allowed")
        if not isinstance(val, str) or len(val) > 256:
            out.append(f"labels.{key}: not a string of at most 256 characters")


def _files(value: List[Any], out: List[str]) -> None:
    if len(value) > MAX_FILES:
        out.append(f"files: {len(value)} entries, more than {MAX_FILES}")
        return
    seen = set()
    for n, entry in enumerate(value):
        where = f"files[{n}]."
        if not isinstance(entry, dict):
            out.append(f"files[{n}]: not a mapping")
            continue
        path = entry.get("path")
        why = relpath_problem(path)
        if why:
            out.append(f"{where}path {path!r} {why}")
        elif path in seen:
            out.append(f"{where}path {path!r} is listed twice")
        elif path == "manifest.json":
            out.append(f"{where}path: the manifest cannot list itself")
        if isinstance(path, str):
            seen.add(path)
        size = _typed(entry, "size", int, where, out)
        if size is not None and size < 0:
            out.append(f"{where}size: negative")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256_RE.fullmatch(digest):
            out.append(f"{where}sha256: not 64 lowercase hex digits")
        if "chunks" in entry:
            _chunks(entry["chunks"], size, where, out)


def _chunks(value: Any, size: Optional[int], where: str, out: List[str]) -> None:
    """A file's chunk digests (``_digest``): a power-of-two chunk size of 1 MiB-1 GiB and exactly one SHA256 per
    chunk of the file's ``size``, so that the chunks cover every byte of it."""
    if not isinstance(value, dict) or not isinstance(value.get("sha256"), list):
        out.append(f"{where}chunks: not a mapping with a list sha256")
        return
    step = value.get("size")
    if not isinstance(step, int) or isinstance(step, bool) or not MIN_CHUNK <= step <= MAX_CHUNK or step & (step - 1):
        out.append(f"{where}chunks.size: not a power of two from {MIN_CHUNK} to {MAX_CHUNK}")
        return
    digests = value["sha256"]
    if size is not None and size >= 0 and len(digests) != -(-size // step):
        out.append(f"{where}chunks.sha256: {len(digests)} digests for {-(-size // step)} chunks of {step} bytes")
    if not all(isinstance(d, str) and _SHA256_RE.fullmatch(d) for d in digests):
        out.append(f"{where}chunks.sha256: not a list of 64 lowercase hex digits each")


def _workload_files(value: Any, where: str, out: List[str]) -> None:
    if not isinstance(value, list):
        out.append(f"{where}workload_files: not a list")
        return
    for n, entry in enumerate(value):
        at = f"{where}workload_files[{n}]."
        if not isinstance(entry, dict):
            out.append(f"{at[:-1]}: not a mapping")
            continue
        why = relpath_problem(entry.get("path"))
        if why:
            out.append(f"{at}path {entry.get('path')!r} {why}")
        mode = entry.get("mode", 0o600)
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
            out.append(f"{at}mode {mode!r} is not permission bits 0-0o777 (setuid, setgid and sticky are refused)")


def _criu_options(value: Any, where: str, out: List[str]) -> None:
    opts = value.get("options") if isinstance(value, dict) else None
    if value is None:
        return
    if not isinstance(opts, dict):
        out.append(f"{where}criu.options: missing or not a mapping")
        return
    for key in ("ext_unix_sk", "file_locks", "link_remap", "shell_job", "manage_cgroups"):
        if key in opts and not isinstance(opts[key], bool):
            out.append(f"{where}criu.options.{key}: not a boolean")
    for key in ("ghost_limit", "timeout"):
        if key in opts and (not isinstance(opts[key], int) or isinstance(opts[key], bool) or opts[key] < 0):
            out.append(f"{where}criu.options.{key}: not a non-negative integer")
    if "tcp" in opts and opts["tcp"] not in TCP_MODES:
        out.append(f"{where}criu.options.tcp: {opts['tcp']!r} is not one of {', '.join(TCP_MODES)}")
    if "network_lock" in opts and opts["network_lock"] not in NETWORK_LOCKS:
        out.append(f"{where}criu.options.network_lock: {opts['network_lock']!r} is not one of {', '.join(NETWORK_LOCKS)}")


def _target(entry: Any, n: int, out: List[str]) -> None:
    where = f"targets[{n}]."
    if not isinstance(entry, dict):
        out.append(f"targets[{n}]: not a mapping")
        return
    name = entry.get("name")
    if not is_name(name):
        out.append(f"{where}name {name!r} is not a safe name")
    elif entry.get("path") != f"containers/{name}":
        out.append(f"{where}path {entry.get('path')!r} is not 'containers/{name}'")
    if entry.get("kind") not in KINDS:
        out.append(f"{where}kind {entry.get('kind')!r} is not one of {', '.join(KINDS)}")
    workload = entry.get("workload")
    if workload is not None and not is_name(workload):
        out.append(f"{where}workload {workload!r} is not a safe name")
    for key in ("workloads_root", "control_dir"):
        if entry.get(key) is not None:
            why = abspath_problem(entry[key])
            if why:
                out.append(f"{where}{key} {entry[key]!r} {why}")
    _workload_files(entry.get("workload_files", []), where, out)
    in_use = entry.get("files_in_use", {})
    if not isinstance(in_use, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in in_use.items()):
        out.append(f"{where}files_in_use: not a mapping of paths to sizes")
    for key, kind in (("stdio", list), ("container", dict), ("rootfs_diff", dict), ("cmdline", list)):
        _typed(entry, key, kind, where, out, required=False)
    ns_pids = entry.get("ns_pids", [])
    if not isinstance(ns_pids, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0
                                                for p in ns_pids):
        out.append(f"{where}ns_pids: not a list of positive integers")
    mounts = entry.get("external_mounts", [])
    if not isinstance(mounts, list) or not all(isinstance(m, dict) and abspath_problem(m.get("mountpoint")) is None
                                               for m in mounts):
        out.append(f"{where}external_mounts: not a list of {{mountpoint: absolute path, ...}}")
    elif not all(isinstance(m.get("masked", False), bool) for m in mounts):
        out.append(f"{where}external_mounts: masked is not a boolean")
    if isinstance(entry.get("stdio"), list) and not all(isinstance(s, str) for s in entry["stdio"]):
        out.append(f"{where}stdio: not a list of strings")
    if entry.get("mount_namespace") is not None:
        _mount_namespace(entry["mount_namespace"], where, out)
    if entry.get("app_profile") is not None:
        _profile(entry["app_profile"], where, out)
    if entry.get("tcp_connections") is not None:
        _tcp_connections(entry["tcp_connections"], where, out)
    if entry.get("volumes") is not None:
        _volumes(entry["volumes"], where, out)
    _criu_options(entry.get("criu"), where, out)


def _volumes(value: Any, where: str, out: List[str]) -> None:
    """The volumes whose contents a container snapshot took along (``_volumes.capture``): each ``{mountpoint:
    absolute path, archive: volumes/<n>.tar (n its index), entries, bytes: counts, fstype}``, mountpoints unique."""
    if not isinstance(value, list) or len(value) > MAX_VOLUMES:
        out.append(f"{where}volumes: not a list of at most {MAX_VOLUMES} volumes")
        return
    seen = set()
    for n, v in enumerate(value):
        at = f"{where}volumes[{n}]"
        if not isinstance(v, dict) or set(v) != {"mountpoint", "archive", "entries", "bytes", "fstype"}:
            out.append(f"{at}: not {{mountpoint, archive, entries, bytes, fstype}}")
            continue
        why = abspath_problem(v["mountpoint"])
        if why or v["mountpoint"] == "/" or v["mountpoint"] in seen:
            out.append(f"{at}.mountpoint {v['mountpoint']!r} {why or 'is / or named twice'}")
        if not why:
            seen.add(v["mountpoint"])
        if v["archive"] != f"volumes/{n}.tar":
            out.append(f"{at}.archive {v['archive']!r} is not 'volumes/{n}.tar'")
        for key in ("entries", "bytes"):
            if not isinstance(v[key], int) or isinstance(v[key], bool) or v[key] < 0:
                out.append(f"{at}.{key}: not a non-negative integer")
        if not isinstance(v["fstype"], str) or not 0 < len(v["fstype"]) <= 64 or _CONTROL_RE.search(v["fstype"]):
            out.append(f"{at}.fstype: not a short string")


def _tcp_connections(value: Any, where: str, out: List[str]) -> None:
    """The established TCP connections the checkpoint listed (``_tcp.connections``): at most ``MAX_TCP``, each
    ``{local, remote: "address:port" of at most 64 characters, internal: bool}``; a restore decides on them."""
    if not isinstance(value, list) or len(value) > MAX_TCP:
        out.append(f"{where}tcp_connections: not a list of at most {MAX_TCP} connections")
        return
    for n, conn in enumerate(value):
        ok = isinstance(conn, dict) and set(conn) == {"local", "remote", "internal"} and \
            isinstance(conn["internal"], bool) and \
            all(isinstance(conn[k], str) and 0 < len(conn[k]) <= 64 for k in ("local", "remote"))
        if not ok:
            out.append(f"{where}tcp_connections[{n}]: not {{local, remote: address:port, internal: bool}}")


def _profile(value: Any, where: str, out: List[str]) -> None:
    """The target's application profile (``_profile.Profile.record``): its shape here; the restore checks the
    definition itself again (``_profile.from_record``) before it runs any step."""
    at = f"{where}app_profile"
    if not isinstance(value, dict):
        out.append(f"{at}: not a mapping")
        return
    if not isinstance(value.get("name"), str) or len(value["name"]) > 64 or _CONTROL_RE.search(value["name"]):
        out.append(f"{at}.name: not a short string")
    for key in ("definition", "vars"):
        if not isinstance(value.get(key), dict):
            out.append(f"{at}.{key}: not a mapping")
    quiesced = value.get("quiesced", [])
    if not isinstance(quiesced, list) or not all(isinstance(q, str) for q in quiesced):
        out.append(f"{at}.quiesced: not a list of strings")


def _mount_namespace(value: Any, where: str, out: List[str]) -> None:
    """A process target's own mount namespace (``_mountns``): the mounts kept (absolute paths, a file system type,
    slave or not), the mountpoints left out, whether its /proc was its own."""
    at = f"{where}mount_namespace"
    if not isinstance(value, dict):
        out.append(f"{at}: not a mapping")
        return
    if not isinstance(value.get("own_proc"), bool):
        out.append(f"{at}.own_proc: not a boolean")
    mounts = value.get("mounts")
    if not isinstance(mounts, list) or len(mounts) > MAX_FILES:
        out.append(f"{at}.mounts: not a list (of at most {MAX_FILES})")
    else:
        for n, m in enumerate(mounts):
            ok = (isinstance(m, dict) and abspath_problem(m.get("path")) is None and isinstance(m.get("fstype"), str)
                  and len(m["fstype"]) <= 64 and not _CONTROL_RE.search(m["fstype"]) and isinstance(m.get("slave"), bool))
            if not ok:
                out.append(f"{at}.mounts[{n}]: not {{path: absolute path, fstype: string, slave: boolean}}")
    skipped = value.get("skipped")
    if not isinstance(skipped, list) or len(skipped) > MAX_FILES or \
            not all(abspath_problem(p) is None for p in skipped):
        out.append(f"{at}.skipped: not a list of absolute paths")


def _source(value: Any, out: List[str]) -> None:
    if not isinstance(value, dict):
        out.append("source: missing or not a mapping")
        return
    for key in ("arch", "kernel", "criu_version", "cpu_vendor", "hostname"):
        if value.get(key) is not None and not isinstance(value[key], str):
            out.append(f"source.{key}: not a string")
    flags = value.get("cpu_flags")
    if flags is not None and (not isinstance(flags, list) or not all(isinstance(f, str) for f in flags)):
        out.append("source.cpu_flags: not a list of strings")


def _imported(value: Any, out: List[str]) -> None:
    """Where an imported snapshot came from (``_archiveimport``): the archive's format, SHA256, size, compression."""
    if value is None:
        return
    if not isinstance(value, dict):
        out.append("imported: not a mapping")
        return
    if not isinstance(value.get("sha256"), str) or not _SHA256_RE.fullmatch(value["sha256"]):
        out.append("imported.sha256: not 64 lowercase hex digits")
    for key in ("format", "compression"):
        if not isinstance(value.get(key), str):
            out.append(f"imported.{key}: not a string")
    if not isinstance(value.get("size"), int) or isinstance(value.get("size"), bool) or value["size"] < 0:
        out.append("imported.size: not a non-negative integer")


def _gpu(value: Any, out: List[str]) -> None:
    """The GPU section: what the restore preflight and the CUDA restore read from it."""
    if value is None:
        return
    if not isinstance(value, dict):
        out.append("gpu: not a mapping")
        return
    for key in ("cuda_version", "driver_version"):
        if value.get(key) is not None and not isinstance(value[key], (str, int)):
            out.append(f"gpu.{key}: not a string")
    pids = value.get("pids", [])
    if not isinstance(pids, list) or not all(
            isinstance(p, dict) and isinstance(p.get("ns_pid"), int) and not isinstance(p.get("ns_pid"), bool)
            and p["ns_pid"] > 0 for p in pids):
        out.append("gpu.pids: not a list of {ns_pid: positive integer, ...}")
    gpus = value.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, dict) and isinstance(g.get("uuid"), (str, type(None)))
                                             for g in gpus):
        out.append("gpu.gpus: not a list of {uuid: string, ...}")


def frame_bound(plain: int) -> int:
    """The most stored bytes a zstd frame of ``plain`` bytes may take (zstd's compress bound, plus its header
    and checksum)."""
    return plain + (plain >> 8) + ((128 << 10) - plain >> 11 if plain < 128 << 10 else 0) + 32


def _stored_frame_ok(stored: Any, plain: int) -> bool:
    return isinstance(stored, int) and not isinstance(stored, bool) and 0 < stored <= frame_bound(plain)


def _compression(value: Any, files: Any, encrypted: bool, out: List[str]) -> None:
    """The compression block (``_zstd``): every file it names is listed in ``files``, with a plaintext size of at
    most ``MAX_PLAIN``, a plaintext SHA256, and exactly one stored size per frame, each within zstd's bound for
    its frame; without encryption the frames add up to the stored size (with it, the decrypted size is checked
    when read). A reader then never expects more plaintext than the block declares."""
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("files"), dict):
        out.append("compression: not a mapping with a mapping files")
        return
    if value.get("alg") != ZSTD_ALG:
        out.append(f"compression.alg: {str(value.get('alg'))[:40]!r} is not {ZSTD_ALG}")
    frame = value.get("frame")
    if not isinstance(frame, int) or isinstance(frame, bool) or not MIN_FRAME <= frame <= MAX_FRAME:
        out.append(f"compression.frame: not an integer from {MIN_FRAME} to {MAX_FRAME}")
        return
    stored = {e["path"]: e.get("size") for e in files if isinstance(e, dict) and isinstance(e.get("path"), str)} \
        if isinstance(files, list) else {}
    if len(value["files"]) > len(stored):
        out.append(f"compression.files: {len(value['files'])} entries, more than files has")
        return
    for rel, entry in value["files"].items():
        where = f"compression.files[{str(rel)[:200]!r}]"
        if rel not in stored:
            out.append(f"{where}: not listed in files")
            continue
        size = entry.get("size") if isinstance(entry, dict) else None
        frames = entry.get("frames") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_PLAIN:
            out.append(f"{where}.size: not an integer from 0 to {MAX_PLAIN}")
            continue
        if not isinstance(entry.get("sha256"), str) or not _SHA256_RE.fullmatch(entry["sha256"]):
            out.append(f"{where}.sha256: not 64 lowercase hex digits")
        count = -(-size // frame)
        if not isinstance(frames, list) or len(frames) != count:
            out.append(f"{where}.frames: not a list of {count} stored frame sizes for {size} bytes in {frame}-byte "
                       "frames")
        elif not all(_stored_frame_ok(n, min(frame, size - i * frame)) for i, n in enumerate(frames)):
            out.append(f"{where}.frames: a stored frame size is not a positive integer within zstd's bound")
        elif not encrypted and sum(frames) != stored[rel]:
            out.append(f"{where}.frames: add up to {sum(frames)} bytes, files says {stored[rel]} are stored")


def _signature(value: Any, out: List[str]) -> None:
    """The signature block (``_signing``): its shape only; whether it verifies is the trust set's business."""
    if value is None:
        return
    if not isinstance(value, dict):
        out.append("signature: not a mapping")
        return
    if not isinstance(value.get("alg"), str) or len(value["alg"]) > 32:
        out.append("signature.alg: missing or not a short string")
    if not isinstance(value.get("key_id"), str) or _KEY_ID_RE.fullmatch(value["key_id"]) is None:
        out.append("signature.key_id: not 16 lowercase hex digits")
    if not isinstance(value.get("value"), str) or _B64_RE.fullmatch(value["value"]) is None:
        out.append("signature.value: not base64 of at most 1024 characters")
    extra = sorted(set(value) - {"alg", "key_id", "value"})
    if extra:
        out.append(f"signature: unknown field(s) {', '.join(map(str, extra))}")


def problems(doc: Any, schema_version: int) -> List[str]:
    """Every reason ``doc`` is not a usable manifest of at most ``schema_version`` (empty = usable)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    if depth(doc) > MAX_DEPTH:
        return [f"nested deeper than {MAX_DEPTH} levels"]
    out: List[str] = []
    schema = doc.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        return ["schema: missing or not a positive integer"]
    if schema > schema_version:
        return [f"schema {schema} is newer than this warmstart understands ({schema_version}); "
                "upgrade the collection on this node"]
    if not is_id(doc.get("id")):
        out.append(f"id {doc.get('id')!r} is malformed (expected e.g. 20261202T120000Z-1a2b3c4d)")
    if not is_name(doc.get("name")):
        out.append(f"name {doc.get('name')!r} is not a safe name")
    _labels(doc.get("labels", {}), out)
    _created_at(doc.get("created_at"), out)
    _source(doc.get("source"), out)
    targets = _typed(doc, "targets", list, "", out)
    if targets is not None:
        if len(targets) > MAX_TARGETS:
            out.append(f"targets: {len(targets)} entries, more than {MAX_TARGETS}")
        else:
            for n, entry in enumerate(targets):
                _target(entry, n, out)
    files = _typed(doc, "files", list, "", out)
    if files is not None:
        _files(files, out)
    for key, kind in (("size", int), ("timings", dict), ("pod", dict)):
        _typed(doc, key, kind, "", out, required=False)
    _gpu(doc.get("gpu"), out)
    _imported(doc.get("imported"), out)
    _compression(doc.get("compression"), files, doc.get("encryption") is not None, out)
    _signature(doc.get("signature"), out)
    return out
