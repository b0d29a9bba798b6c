# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CRIU dump and restore through pycriu's RPC (``criu swrk``).

Every failure raises CriuError carrying the tail of CRIU's own log.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils._criu import CriuError

LOG_TAIL_LINES = 25
# criu_network_lock_method in rpc.proto
NETWORK_LOCK = {"iptables": 1, "nftables": 2, "skip": 3}


@dataclass
class CriuOptions:
    """The CRIU options warmstart exposes (names follow the CLI)."""

    tcp: str = "established"            # established | close | none
    ext_unix_sk: bool = True
    file_locks: bool = True
    link_remap: bool = True
    ghost_limit: int = 512 << 20
    timeout: int = 0                    # seconds; 0 = CRIU's default
    shell_job: bool = False
    network_lock: str = "nftables"
    manage_cgroups: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        return {"tcp": self.tcp, "ext_unix_sk": self.ext_unix_sk, "file_locks": self.file_locks,
                "link_remap": self.link_remap, "ghost_limit": self.ghost_limit, "timeout": self.timeout,
                "shell_job": self.shell_job, "network_lock": self.network_lock}


def load_pycriu() -> Any:
    try:
        import pycriu  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise CriuError(
            f"pycriu cannot be imported by this Python ({exc}); prepare the node with "
            "warmstart.snapshot.node_prep (it installs pycriu for the module interpreter)"
        ) from None
    return pycriu


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


# Errors CRIU logs on runs that then succeed (not a cause of anything).
BENIGN_ERRORS = ("rlimit: Can't setup RLIMIT_NOFILE", "cgroupd: recv req error")


def _error_lines(path: str) -> str:
    """CRIU's first real 'Error' line (the cause) and its last one (what failed), joined by ' | '.

    The first is the cause (e.g. ``File x has bad size``, ``Can't dump file 3 of that type``); the lines
    after it are the unwinding (``Unable to open fd``, ``Dumping FAILED.``). Known benign errors are skipped.
    """
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            errs = [ln.strip() for ln in handle if "Error (" in ln and not any(b in ln for b in BENIGN_ERRORS)]
    except OSError:
        return ""
    return " | ".join(errs[:1] + errs[-1:]) if len(errs) > 1 else "".join(errs)


def _apply(opts: Any, o: CriuOptions) -> None:
    if o.tcp == "established":
        opts.tcp_established = True
    elif o.tcp == "close":
        opts.tcp_close = True
    opts.ext_unix_sk = o.ext_unix_sk
    opts.file_locks = o.file_locks
    opts.link_remap = o.link_remap
    opts.ghost_limit = o.ghost_limit
    opts.shell_job = o.shell_job
    if o.timeout:
        opts.timeout = o.timeout
    opts.network_lock = NETWORK_LOCK[o.network_lock]
    opts.log_level = 4


def _client(criu_path: str) -> Any:
    pycriu = load_pycriu()
    client = pycriu.criu()
    client.use_binary(criu_path)
    return client


def _fail(what: str, exc: Exception, log: str, log_kept: bool = True) -> CriuError:
    """CriuError naming CRIU's own cause; pycriu's generic text only when the log has none."""
    cause = _error_lines(log) or str(exc)
    where = f"; log {log}" if log_kept else ""
    return CriuError(f"CRIU {what} failed: {cause}{where}", log_tail=log_tail(log))


Setup = Optional[Callable[[Any], None]]


def dump(criu_path: str, pid: int, images_dir: str, options: CriuOptions, leave_stopped: bool = True,
         setup: Setup = None) -> None:
    """Dump the tree rooted at ``pid`` into ``images_dir``.

    With ``leave_stopped`` the tree stays SIGSTOPped after a successful dump,
    so the caller can finish and publish the snapshot before it decides to
    resume (SIGCONT) or end (SIGKILL) the source. On failure CRIU resumes it.
    ``setup`` gets the RPC options last, for what a target kind adds (root,
    external namespaces and mounts).
    """
    client = _client(criu_path)
    fd = os.open(images_dir, os.O_DIRECTORY)
    try:
        client.opts.images_dir_fd = fd
        client.opts.pid = pid
        client.opts.log_file = "dump.log"
        if leave_stopped:
            client.opts.leave_stopped = True
        else:
            client.opts.leave_running = True
        _apply(client.opts, options)
        if setup is not None:
            setup(client.opts)
        try:
            client.dump()
        except Exception as exc:  # pycriu raises CRIUExceptionExternal / OSError
            # images_dir is a staging dir that the caller removes on failure: cite no path that will be gone
            raise _fail(f"dump of pid {pid}", exc, os.path.join(images_dir, "dump.log"), log_kept=False) from None
    finally:
        os.close(fd)


def restore(criu_path: str, images_dir: str, work_dir: str, options: CriuOptions, setup: Setup = None) -> int:
    """Restore the tree in ``images_dir`` detached (as our sibling); return its host PID.

    ``setup`` gets the RPC options last (see ``dump``); file descriptors it
    hands CRIU (inherit_fd) must be inheritable.
    """
    client = _client(criu_path)
    img = os.open(images_dir, os.O_DIRECTORY)
    work = os.open(work_dir, os.O_DIRECTORY)
    try:
        client.opts.images_dir_fd = img
        client.opts.work_dir_fd = work
        client.opts.log_file = "restore.log"
        client.opts.rst_sibling = True
        _apply(client.opts, options)
        if setup is not None:
            setup(client.opts)
        try:
            resp = client.restore()
        except Exception as exc:
            raise _fail("restore", exc, os.path.join(work_dir, "restore.log")) from None
    finally:
        os.close(img)
        os.close(work)
    return int(resp.pid)


# --- stats images ---------------------------------------------------------
# A stats image is: u32 IMG_SERVICE magic, u32 STATS magic, then one entry
# (u32 size + protobuf stats_entry). Decoded with the generated message only,
# which works across protobuf versions (pycriu's dict decoder does not).

def read_stats(path: str) -> Dict[str, int]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    if len(data) < 12:
        return {}
    try:
        from pycriu.images import stats_pb2  # pylint: disable=import-outside-toplevel
    except ImportError:
        return {}
    (size,) = struct.unpack_from("<I", data, 8)
    entry = stats_pb2.stats_entry()
    entry.ParseFromString(data[12:12 + size])
    out: Dict[str, int] = {}
    for part in ("dump", "restore"):
        if entry.HasField(part):
            msg = getattr(entry, part)
            for desc, value in msg.ListFields():
                out[desc.name] = int(value)
    return out
