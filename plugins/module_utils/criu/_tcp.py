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

A connection whose both ends are in the snapshot (two processes of one container talking over loopback) is
the exception: both ends come back together, so it can be kept in a placeholder's namespace too. The
checkpoint lists the snapshot's connections from its fresh images (``connections``: each with ``local``,
``remote`` and ``internal`` - its reverse is in the snapshot as well) into the signed manifest, and a
placeholder restore keeps them when every one is internal (CRIU restores all connections or closes all). A
restore never parses store images to decide.

``plan`` decides once per restore and says why; the caller puts ``TcpPlan.criu_tcp`` into its
``CriuOptions.tcp`` and ``TcpPlan.result()`` into its result, which names each connection and what was done.
"""
from __future__ import annotations

import ipaddress
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

MODES = ("keep", "close")
TCP_ESTABLISHED = 1
IPPROTO_TCP = 6
MAX_CONNECTIONS = 256  # listed in a manifest; more are counted, not listed
HEADER = 8             # files.img: u32 IMG_COMMON magic, u32 FILES magic


def _address(words: Any, port: int) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    addr = ipaddress.ip_address(raw) if len(raw) in (4, 16) else None
    if addr is None:
        return f"?:{port}"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


def connections(images_dir: str) -> List[Dict[str, Any]]:
    """The established TCP connections of a dump (its ``files.img``), each ``{local, remote, internal}``:
    ``internal`` when the other end is in the dump too. Read at checkpoint time, from images just written."""
    try:
        with open(os.path.join(images_dir, "files.img"), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    from pycriu.images import fdinfo_pb2  # pylint: disable=import-outside-toplevel  # present wherever CRIU ran
    found: List[Tuple[str, str]] = []
    off = HEADER
    while off + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, off)
        entry = fdinfo_pb2.file_entry()
        entry.ParseFromString(data[off + 4:off + 4 + size])
        off += 4 + size
        if not entry.HasField("isk"):
            continue
        sk = entry.isk
        if sk.proto == IPPROTO_TCP and sk.state == TCP_ESTABLISHED and sk.dst_port:
            found.append((_address(sk.src_addr, sk.src_port), _address(sk.dst_addr, sk.dst_port)))
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


@dataclass(frozen=True)
class TcpPlan:
    """What a restore does with the snapshot's established TCP connections, and why."""

    mode: str       # keep | close
    reason: str
    connections: List[Dict[str, Any]] = field(default_factory=list)  # as the manifest lists them

    @property
    def criu_tcp(self) -> str:
        """The restore's ``CriuOptions.tcp``: ``established`` re-creates the connections, ``close`` closes them."""
        return "established" if self.mode == "keep" else "close"

    def result(self) -> Dict[str, Any]:
        """``mode`` and ``reason``; with the connections the checkpoint listed, each and what was done to it."""
        out: Dict[str, Any] = {"mode": self.mode, "reason": self.reason}
        if self.connections:
            done = "kept" if self.mode == "keep" else "closed"
            out["connections"] = [dict(c, done=done) for c in self.connections]
        return out


def invalid(requested: Optional[str]) -> Optional[str]:
    """Why ``requested`` is not a tcp mode a restore accepts (None: it is, or it was left to the default)."""
    if requested is None or requested in MODES:
        return None
    return f"tcp: {requested!r} is not one of {', '.join(MODES)}"


def default(placeholder: Optional[str], source_node: Optional[str], this_node: str,
            listed: Optional[List[Dict[str, Any]]] = None) -> TcpPlan:
    """``close`` when the tree comes back in another network namespace or on another node than the dump's,
    ``keep`` when it comes back on the node that took the snapshot, in the host's network namespace - or in a
    placeholder when every connection the checkpoint ``listed`` has both ends in the snapshot."""
    conns = list(listed or [])
    if placeholder:
        leaving = [c for c in conns if not c.get("internal")]
        if conns and not leaving:
            return TcpPlan("keep", f"every established connection ({len(conns)}) has both ends in the snapshot: "
                                   f"they come back together in placeholder {placeholder}'s network namespace", conns)
        if leaving:
            return TcpPlan("close", f"restored into placeholder {placeholder}'s network namespace: {len(leaving)} of "
                                    f"the {len(conns)} established connections lead out of the snapshot (CRIU keeps "
                                    "all or closes all)", conns)
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
        chosen = TcpPlan(chosen.mode, f"{chosen.reason}; the snapshot holds no established connection "
                                      "(taken with tcp: none)", chosen.connections)
    return chosen, []
