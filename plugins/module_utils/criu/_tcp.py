# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Established TCP connections on restore: re-created (``keep``) or closed (``close``).

A snapshot taken with ``tcp: established`` (the checkpoint default) holds the state of every established
connection of the tree. Restoring it re-creates them (CRIU's ``tcp_established``), which is right only
where their addresses still lead to the same peers: on the node that took the snapshot, in the host's
network namespace. Anywhere else - a placeholder container's or pod's network namespace, another node -
the peers know nothing of them, so there the default is ``close`` (CRIU's ``tcp_close``, as GKE does on
restore): each connected socket comes back closed (a read returns end of file, a write fails), and a peer
that still writes to the old connection gets a reset. Listening sockets are restored either way.

A connection whose both ends are in the snapshot over loopback (two processes of one container or pod talking
over 127.0.0.1 or ::1: a torch.distributed store of tensor-parallel workers, an engine behind its API server)
is the exception: both ends come back together at addresses every network namespace has, so a placeholder
restore keeps it. The checkpoint lists the snapshot's connections from its fresh images (``connections``: each
with ``local``, ``remote`` and ``internal`` - its reverse is in the snapshot as well) into the signed manifest.
A placeholder restore keeps every such connection and closes the others (``mixed``): CRIU restores all
connections or closes all, so the others are turned into closed sockets in the restore's own copy of
``files.img`` (``close_in_images``) - the process finds them at end of file, as ``close`` leaves every one. A
connection over the source pod's own address is closed too: the placeholder has another. A restore never
parses store images to decide: the plan comes from the manifest, the rewrite reads verified bytes only.

``plan`` decides once per restore and says why; the caller puts ``TcpPlan.criu_tcp`` into its
``CriuOptions.tcp`` and ``TcpPlan.result()`` into its result, which names each connection and what was done.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import shutil
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _files as cimg

MODES = ("keep", "close")  # asked for; a placeholder's default may also be "mixed" (some kept, the others closed)
TCP_ESTABLISHED = 1
TCP_CLOSE = 7
SHUTDOWN_BOTH = 3      # sk-opts.proto: sk_shutdown BOTH
OWN_IMAGES = "tcp-images"  # a mixed restore's images, in its work dir, when they are not its own copy already
IPPROTO_TCP = 6
MAX_CONNECTIONS = 256  # listed in a manifest; more are counted, not listed


def _address(words: Any, port: int) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    addr = ipaddress.ip_address(raw) if len(raw) in (4, 16) else None
    if addr is None:
        return f"?:{port}"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


def _tcp_ends(entry: Any) -> Optional[Tuple[str, str]]:
    """(local, remote) of a connected TCP socket's entry (any state); None for any other file."""
    sk = entry.isk if entry.HasField("isk") else None
    if sk is None or sk.proto != IPPROTO_TCP or not sk.dst_port:
        return None
    return _address(sk.src_addr, sk.src_port), _address(sk.dst_addr, sk.dst_port)


def connections(images_dir: str) -> List[Dict[str, Any]]:
    """The established TCP connections of a dump (its ``files.img``), each ``{local, remote, internal}``:
    ``internal`` when the other end is in the dump too. Read at checkpoint time, from images just written."""
    try:
        data, path = cimg.read(images_dir)
    except FileNotFoundError:
        return []
    found = [ends for _raw, entry in cimg.entries(data, path)
             for ends in [_tcp_ends(entry)] if ends and entry.isk.state == TCP_ESTABLISHED]
    pairs = set(found)
    return [{"local": local, "remote": remote, "internal": (remote, local) in pairs} for local, remote in found]


def listed(images_dir: str) -> Optional[List[Dict[str, Any]]]:
    """``connections`` for the manifest, or None when they cannot be listed (too many, or an image pycriu cannot
    decode): a restore then closes them in a placeholder, as without a list."""
    try:
        conns = connections(images_dir)
    except Exception:  # pylint: disable=broad-except  # pycriu's and protobuf's decoder errors: no list, no harm
        return None
    return conns if len(conns) <= MAX_CONNECTIONS else None


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def stays_inside(conn: Dict[str, Any]) -> bool:
    """A connection a placeholder keeps: both ends in the snapshot, over loopback (the pod's own address changes)."""
    return bool(conn.get("internal")) and _loopback(str(conn.get("local"))) and _loopback(str(conn.get("remote")))


def _key(conn: Dict[str, Any]) -> Tuple[str, str]:
    return str(conn.get("local")), str(conn.get("remote"))


@dataclass(frozen=True)
class TcpPlan:
    """What a restore does with the snapshot's established TCP connections, and why."""

    mode: str       # keep | close | mixed (the connections in ``kept`` kept, every other one closed)
    reason: str
    connections: List[Dict[str, Any]] = field(default_factory=list)  # as the manifest lists them
    kept: Tuple[Tuple[str, str], ...] = ()  # mixed: (local, remote) of each connection kept

    @property
    def criu_tcp(self) -> str:
        """The restore's ``CriuOptions.tcp``: ``established`` re-creates the connections (``mixed``: those left in
        the rewritten ``files.img``), ``close`` closes them."""
        return "close" if self.mode == "close" else "established"

    def keeps(self, conn: Dict[str, Any]) -> bool:
        return self.mode == "keep" or (self.mode == "mixed" and _key(conn) in self.kept)

    def result(self) -> Dict[str, Any]:
        """``mode`` and ``reason``; with the connections the checkpoint listed, each and what was done to it."""
        out: Dict[str, Any] = {"mode": self.mode, "reason": self.reason}
        if self.connections:
            out["connections"] = [dict(c, done="kept" if self.keeps(c) else "closed") for c in self.connections]
        return out


def close_in_images(images_dir: str, kept: Sequence[Tuple[str, str]]) -> Tuple[bytes, int]:
    """``files.img`` of the dump in ``images_dir`` with every TCP connection but ``kept`` turned into a closed,
    unbound socket shut both ways (what CRIU's ``tcp_close`` makes of each), and how many were; the caller
    writes it into the restore's own images. ``images_dir`` holds verified bytes (the restore's copy or the
    node's verified cache), never a store's files read in place."""
    data, path = cimg.read(images_dir)
    keep = set(kept)
    out, closed = [data[:cimg.HEADER]], 0
    for raw, entry in cimg.entries(data, path):
        ends = _tcp_ends(entry)
        if ends is not None and ends not in keep:
            sk = entry.isk
            sk.state, sk.src_port, sk.dst_port, sk.shutdown = TCP_CLOSE, 0, 0, SHUTDOWN_BOTH
            raw, closed = entry.SerializeToString(), closed + 1
        out.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(out), closed


def own_images(plan: TcpPlan, images_dir: str, work: Optional[str]) -> str:
    """The images dir a restore with a ``mixed`` ``plan`` hands CRIU: ``files.img`` rewritten
    (``close_in_images``) in place when ``work`` is None (``images_dir`` is the restore's own verified copy),
    else in ``work/OWN_IMAGES`` (created 0700) beside hard links - copies across file systems - of the others."""
    data, _closed = close_in_images(images_dir, plan.kept)
    dest = images_dir if work is None else os.path.join(work, OWN_IMAGES)
    if work is not None:
        os.mkdir(dest, 0o700)
        for entry in os.scandir(images_dir):
            if entry.is_file(follow_symlinks=False) and entry.name != "files.img":
                _link_or_copy(entry.path, os.path.join(dest, entry.name))
    tmp = os.path.join(dest, ".files.img.tcp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, os.path.join(dest, "files.img"))
    return dest


def _link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(src, "rb") as source, os.fdopen(fd, "wb") as copy:
            shutil.copyfileobj(source, copy, 1 << 20)


def invalid(requested: Optional[str]) -> Optional[str]:
    """Why ``requested`` is not a tcp mode a restore accepts (None: it is, or it was left to the default)."""
    if requested is None or requested in MODES:
        return None
    return f"tcp: {requested!r} is not one of {', '.join(MODES)}"


def default(placeholder: Optional[str], source_node: Optional[str], this_node: str,
            listed: Optional[List[Dict[str, Any]]] = None) -> TcpPlan:
    """``close`` when the tree comes back in another network namespace or on another node than the dump's,
    ``keep`` when it comes back on the node that took the snapshot, in the host's network namespace. In a
    placeholder: the connections the checkpoint ``listed`` with both ends in the snapshot over loopback kept,
    the others closed (``keep``, ``mixed`` or ``close`` by how many stay inside)."""
    conns = list(listed or [])
    if placeholder:
        where = f"placeholder {placeholder}'s network namespace"
        stay = [c for c in conns if stays_inside(c)]
        if conns and len(stay) == len(conns):
            return TcpPlan("keep", f"every established connection ({len(conns)}) has both ends in the snapshot, over "
                                   f"loopback: they come back together in {where}", conns)
        if stay:
            return TcpPlan("mixed", f"{len(stay)} of the {len(conns)} established connections have both ends in the "
                                    f"snapshot, over loopback, and are kept in {where}; the other "
                                    f"{len(conns) - len(stay)} lead out of it or use the source's own address, and are "
                                    "closed", conns, tuple(_key(c) for c in stay))
        if conns:
            return TcpPlan("close", f"restored into {where}: {len(conns)} of the {len(conns)} established "
                                    "connections lead out of the snapshot or use the source's own address", conns)
        return TcpPlan("close", f"restored into placeholder {placeholder}'s network namespace, not the one the "
                                "connections were dumped in")
    if not source_node:
        return TcpPlan("close", "the snapshot does not record the node that took it", conns)
    if source_node != this_node:
        return TcpPlan("close", f"restored on node {this_node}, the snapshot was taken on node {source_node}", conns)
    return TcpPlan("keep", f"restored on node {this_node}, which took the snapshot, into the host's network namespace",
                   conns)


def plan(requested: Optional[str], recorded: Optional[str], placeholder: Optional[str], source_node: Optional[str],
         this_node: str, listed: Optional[List[Dict[str, Any]]] = None) -> Tuple[TcpPlan, List[str]]:
    """The tcp mode of one restore and every reason it cannot have it (empty: it can).

    ``requested``: the restore's ``tcp`` (None: the default, see ``default``). ``recorded``: the checkpoint's
    ``tcp`` as the manifest recorded it; ``listed``: the connections it recorded (``connections``). A snapshot
    taken with ``tcp: close`` holds no connection state, so its connections can only be closed: ``keep`` is
    refused.
    """
    problem = invalid(requested)
    if problem:
        return default(placeholder, source_node, this_node, listed), [problem]
    if recorded == "close":
        closed = TcpPlan("close", "the snapshot was taken with tcp: close, its connections were not dumped")
        if requested == "keep":
            return closed, ["tcp: keep: the snapshot was taken with tcp: close, so its TCP connections were not "
                            "dumped and cannot be kept; restore with tcp: close, or checkpoint with tcp: established"]
        return closed, []
    chosen = default(placeholder, source_node, this_node, listed)
    if requested is not None:
        also = "also the default" if requested == chosen.mode else f"the default would be {chosen.mode}"
        chosen = TcpPlan(requested, f"tcp: {requested} was asked for ({also}: {chosen.reason})", chosen.connections)
    if recorded == "none":
        chosen = dataclasses.replace(chosen, reason=f"{chosen.reason}; the snapshot holds no established connection "
                                                    "(taken with tcp: none)")
    return chosen, []
