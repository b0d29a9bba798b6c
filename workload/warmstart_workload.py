# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The workload side of warmstart's control-directory protocol. One file, standard library only.

Copy this file next to your server (or put it on PYTHONPATH) and::

    import warmstart_workload as ws

    control = ws.Control()              # SNAPSHOT_CONTROL_DIR; inactive (all no-ops) when unset
    control.on_restore(refresh)         # called in a background thread after every restore
    load_model(); warm_up()
    control.ready()                     # writes ready-for-snapshot: checkpoint may go ahead
    serve()

    def refresh(info):                  # info: RestoreInfo (pid, snapshot, ...)
        me = ws.instance()              # this copy's hostname, IPs, and env from the placeholder
        reseed_rng(); reconnect(me.env.get("DB_URL"))

A restored copy wakes up where the source was when it was dumped: inside
``serve()``, with the source's hostname cached, its environment, its seeds.
``restore-complete`` tells it that it is a copy; ``instance()`` re-reads what
belongs to this copy. warmstart's restore writes ``env.json`` (the
placeholder's environment, mode 0600) into the control dir before
``restore-complete``.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import threading
import time
from typing import Callable, Dict, List, Optional

ENV_VAR = "SNAPSHOT_CONTROL_DIR"
READY = "ready-for-snapshot"
RESTORE_COMPLETE = "restore-complete"
RESTORE_FAILED = "restore-failed"
ENV_FILE = "env.json"
SIOCGIFADDR = 0x8915


class RestoreInfo:
    """What ``restore-complete`` said: ``pid`` (in the container), ``snapshot`` id, and any other key=value."""

    def __init__(self, fields: Dict[str, str]) -> None:
        self.fields = fields
        self.pid = int(fields["pid"]) if fields.get("pid", "").isdigit() else None
        self.snapshot = fields.get("snapshot")

    def __repr__(self) -> str:
        return f"RestoreInfo({self.fields!r})"


class Instance:
    """Per-instance state of this copy: hostname, IPv4 addresses, environment offered by the restore."""

    def __init__(self, hostname: str, ips: List[str], env: Dict[str, str]) -> None:
        self.hostname = hostname
        self.ips = ips
        self.env = env

    def __repr__(self) -> str:
        return f"Instance(hostname={self.hostname!r}, ips={self.ips!r}, env=<{len(self.env)} vars>)"


def _signature(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _parse(text: str) -> Dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


class Control:
    """The control directory of this workload (``SNAPSHOT_CONTROL_DIR``)."""

    def __init__(self, path: Optional[str] = None, poll: float = 0.05) -> None:
        self.path = path if path is not None else os.environ.get(ENV_VAR) or None
        self.poll = poll
        self._seen = self._current()

    @property
    def active(self) -> bool:
        return bool(self.path)

    def _file(self, name: str) -> str:
        return os.path.join(self.path or "", name)

    def _current(self) -> Optional[tuple]:
        return _signature(self._file(RESTORE_COMPLETE)) if self.path else None

    def ready(self, note: str = "") -> None:
        """Say "warm, snapshot me now": atomically writes ``ready-for-snapshot``."""
        if not self.path:
            return
        self._seen = self._current()
        target = self._file(READY)
        tmp = f"{target}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(note or f"pid={os.getpid()}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, target)

    def restored(self) -> Optional[RestoreInfo]:
        """The restore this copy has not seen yet (``restore-complete`` newer than at ``ready()``), if any."""
        if not self.path:
            return None
        now = self._current()
        if now is None or now == self._seen:
            return None
        try:
            with open(self._file(RESTORE_COMPLETE), "r", encoding="utf-8") as handle:
                fields = _parse(handle.read())
        except FileNotFoundError:
            return None
        self._seen = now
        return RestoreInfo(fields)

    def failed(self) -> Optional[str]:
        """The text of ``restore-failed``, if a restore into this container failed."""
        try:
            with open(self._file(RESTORE_FAILED), "r", encoding="utf-8") as handle:
                return handle.read().strip() or "restore failed"
        except (FileNotFoundError, TypeError):
            return None

    def wait_restored(self, timeout: Optional[float] = None) -> Optional[RestoreInfo]:
        """Block until this process is a restored copy (returns its RestoreInfo) or ``timeout`` s pass (None)."""
        if not self.path:
            return None
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.restored()
            if info is not None:
                return info
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(self.poll)

    def on_restore(self, callback: Callable[[RestoreInfo], None]) -> Optional[threading.Thread]:
        """Call ``callback(info)`` in a daemon thread after every restore of this process."""
        if not self.path:
            return None

        def watch() -> None:
            while True:
                info = self.wait_restored()
                if info is not None:
                    callback(info)

        thread = threading.Thread(target=watch, name="warmstart-restore-watch", daemon=True)
        thread.start()
        return thread

    def env(self) -> Dict[str, str]:
        """The environment the restore offered (``env.json``: the placeholder's), or {}."""
        if not self.path:
            return {}
        try:
            with open(self._file(ENV_FILE), "r", encoding="utf-8") as handle:
                data = json.load(handle)
        except (FileNotFoundError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def ipv4_addresses() -> List[str]:
    """IPv4 addresses of this network namespace's interfaces, loopback excluded."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out.append(socket.inet_ntoa(raw[20:24]))
    return out


def instance(control: Optional[Control] = None, apply_env: bool = False) -> Instance:
    """Re-read this copy's per-instance state; with ``apply_env`` also update ``os.environ`` from env.json."""
    control = control or Control()
    env = control.env()
    if apply_env:
        os.environ.update(env)
    return Instance(socket.gethostname(), ipv4_addresses(), env)
