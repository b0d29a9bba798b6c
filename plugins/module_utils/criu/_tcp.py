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

``plan`` decides once per restore and says why; the caller puts ``TcpPlan.criu_tcp`` into its
``CriuOptions.tcp`` and ``TcpPlan.result()`` into its result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

MODES = ("keep", "close")


@dataclass(frozen=True)
class TcpPlan:
    """What a restore does with the snapshot's established TCP connections, and why."""

    mode: str       # keep | close
    reason: str

    @property
    def criu_tcp(self) -> str:
        """The restore's ``CriuOptions.tcp``: ``established`` re-creates the connections, ``close`` closes them."""
        return "established" if self.mode == "keep" else "close"

    def result(self) -> Dict[str, str]:
        return {"mode": self.mode, "reason": self.reason}


def invalid(requested: Optional[str]) -> Optional[str]:
    """Why ``requested`` is not a tcp mode a restore accepts (None: it is, or it was left to the default)."""
    if requested is None or requested in MODES:
        return None
    return f"tcp: {requested!r} is not one of {', '.join(MODES)}"


def default(placeholder: Optional[str], source_node: Optional[str], this_node: str) -> TcpPlan:
    """``close`` when the tree comes back in another network namespace or on another node than the dump's,
    ``keep`` when it comes back on the node that took the snapshot, in the host's network namespace."""
    if placeholder:
        return TcpPlan("close", f"restored into placeholder {placeholder}'s network namespace, not the one the "
                                "connections were dumped in")
    if not source_node:
        return TcpPlan("close", "the snapshot does not record the node that took it")
    if source_node != this_node:
        return TcpPlan("close", f"restored on node {this_node}, the snapshot was taken on node {source_node}")
    return TcpPlan("keep", f"restored on node {this_node}, which took the snapshot, into the host's network namespace")


def plan(requested: Optional[str], recorded: Optional[str], placeholder: Optional[str], source_node: Optional[str],
         this_node: str) -> Tuple[TcpPlan, List[str]]:
    """The tcp mode of one restore and every reason it cannot have it (empty: it can).

    ``requested``: the restore's ``tcp`` (None: the default, see ``default``). ``recorded``: the checkpoint's
    ``tcp`` as the manifest recorded it. A snapshot taken with ``tcp: close`` holds no connection state, so
    its connections can only be closed: ``keep`` is refused.
    """
    problem = invalid(requested)
    if problem:
        return default(placeholder, source_node, this_node), [problem]
    if recorded == "close":
        closed = TcpPlan("close", "the snapshot was taken with tcp: close, its connections were not dumped")
        if requested == "keep":
            return closed, ["tcp: keep: the snapshot was taken with tcp: close, so its TCP connections were not "
                            "dumped and cannot be kept; restore with tcp: close, or checkpoint with tcp: established"]
        return closed, []
    chosen = default(placeholder, source_node, this_node)
    if requested is not None:
        also = "also the default" if requested == chosen.mode else f"the default would be {chosen.mode}"
        chosen = TcpPlan(requested, f"tcp: {requested} was asked for ({also}: {chosen.reason})")
    if recorded == "none":
        chosen = TcpPlan(chosen.mode, f"{chosen.reason}; the snapshot holds no established connection "
                                      "(taken with tcp: none)")
    return chosen, []
