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

A standby-aware entrypoint (restore pods built with ``entrypoint: standby``) calls ``control.standby()`` first:
in a restore pod it blocks until the restore's outcome is known and returns only to start cold (the
cold-start fallback); anywhere else it returns at once.

    def refresh(info):                  # info: RestoreInfo (pid, snapshot, ...)
        me = ws.instance()              # this copy's hostname, IPs, and env from the placeholder
        reseed_rng(); reconnect(me.env.get("DB_URL"))

A restored copy wakes up where the source was when it was dumped: inside
``serve()``, with the source's hostname cached, its environment, its seeds.
``restore-complete`` tells it that it is a copy; ``instance()`` re-reads what
belongs to this copy. warmstart's restore writes ``env.json`` (the
placeholder's environment, mode 0600) into the control dir before
``restore-complete``.

The six lifecycle stages (CANN's names), registered with ``control.on(stage, callback)`` and
unregistered with ``control.off(stage, callback)``, run in this order around warmstart's steps::

    lock_pre      checkpoint-requested: before the accelerator lock and the freeze; quiesce here
                  [warmstart locks the accelerator (CUDA lock + device memory to host)]
    backup_pre    after the lock, just before CRIU dumps (freezes) the tree: do not call the accelerator
                  [CRIU dump: the backup]
    backup_post   a source that keeps running, resumed after the dump, the accelerator still locked
    restore_pre   before the device state is restored: in that source, and in a restored copy after
                  CRIU's restore (RestoreInfo)
                  [device restore + unlock]
    restore_post  after the device state is back (source and copy); the accelerator is usable again
    unlock_post   checkpoint-done in the source (on_post_checkpoint), restore-complete in a copy (on_restore)

Without an accelerator every stage still runs at the same point (the lock and the device restore are
empty steps). A callback that raises, or does not return before the stage's deadline, refuses the stage:
warmstart rolls back (unlocks, resumes the source, kills a copy) and its error names the stage and the
callback; ``unlock_post`` callbacks only report (``control.errors``), nothing is left to undo.
``on_pre_checkpoint`` = ``on("lock_pre")``; ``on_post_checkpoint`` = ``unlock_post`` in the source;
``on_restore`` / ``on_post_restore`` = ``unlock_post`` in a restored copy.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

ENV_VAR = "SNAPSHOT_CONTROL_DIR"
READY = "ready-for-snapshot"
RESTORE_COMPLETE = "restore-complete"
RESTORE_FAILED = "restore-failed"
CHECKPOINT_REQUESTED = "checkpoint-requested"
CHECKPOINT_REFUSED = "checkpoint-refused"
CHECKPOINT_DONE = "checkpoint-done"
CHECKPOINT_HOOKS = "checkpoint-hooks"
CHECKPOINT_STAGE = "checkpoint-stage"
CHECKPOINT_STAGE_DONE = "checkpoint-stage-done"
STAGES = ("lock_pre", "backup_pre", "backup_post", "restore_pre", "restore_post", "unlock_post")
ENV_FILE = "env.json"
COLD_START = "cold-start"
STANDBY_VAR = "SNAPSHOT_RESTORE_STANDBY"
SIOCGIFADDR = 0x8915


class RestoreInfo:
    """What ``restore-complete`` said: ``pid`` (in the container), ``snapshot`` id, and any other key=value."""

    def __init__(self, fields: Dict[str, str], stage: str = "unlock_post") -> None:
        self.fields = fields
        self.stage = stage
        self.pid = int(fields["pid"]) if fields.get("pid", "").isdigit() else None
        self.snapshot = fields.get("snapshot")

    def __repr__(self) -> str:
        return f"RestoreInfo({self.fields!r})"


class CheckpointRequest:
    """A ``checkpoint-requested`` (``request`` id, ``deadline``), and after it ``result``: ok, failed, timeout, refused."""

    def __init__(self, fields: Dict[str, str], result: Optional[str] = None, stage: Optional[str] = None) -> None:
        self.fields = fields
        self.stage = stage or fields.get("stage")
        self.request = fields.get("request")
        try:
            self.deadline: Optional[float] = float(fields["deadline"])
        except (KeyError, ValueError):
            self.deadline = None
        self.result = result

    def remaining(self) -> Optional[float]:
        """Seconds left before warmstart stops waiting for ``ready-for-snapshot`` (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.time()

    def __repr__(self) -> str:
        return f"CheckpointRequest({self.fields!r}, result={self.result!r})"


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


def _check_stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"{stage!r} is not a stage: use one of {', '.join(STAGES)}")
    return stage


def _name(callback: Callable) -> str:
    return str(getattr(callback, "__name__", callback))


def _call(callback: Callable, arg: object, outcome: List[BaseException]) -> None:
    try:
        callback(arg)
    except Exception as exc:  # pylint: disable=broad-except
        outcome.append(exc)


class Control:
    """The control directory of this workload (``SNAPSHOT_CONTROL_DIR``)."""

    def __init__(self, path: Optional[str] = None, poll: float = 0.05, watch: bool = True) -> None:
        """``watch=False``: registering callbacks starts no thread; call ``check()`` from your own loop."""
        self.path = path if path is not None else os.environ.get(ENV_VAR) or None
        self.poll = poll
        self._seen = self._current()
        # stage -> [(callback, where)]: where is "any", "source" (on_post_checkpoint) or "copy" (on_restore)
        self._hooks: Dict[str, List[Tuple[Callable, str]]] = {stage: [] for stage in STAGES}
        self._seen_stage = _signature(self._file(CHECKPOINT_STAGE)) if self.path else None
        self._seen_request: Optional[tuple] = None  # a request already waiting at start is answered (unless expired)
        self._seen_done = _signature(self._file(CHECKPOINT_DONE)) if self.path else None
        self._answered: Optional[str] = None
        self._check_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self.watch = watch
        self._watcher: Optional[threading.Thread] = None
        self.errors: List[str] = []

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
        self._write(READY, note or f"pid={os.getpid()}\n")

    def standby(self) -> bool:
        """For a standby-aware entrypoint: call it first, before initialising anything.

        With ``SNAPSHOT_RESTORE_STANDBY=1`` (a restore pod built with ``entrypoint: standby``) this process is a
        placeholder: it blocks, holding nothing, until the node agent writes ``cold-start`` into the control dir
        (the pod's restore failed or was refused and it asked for a cold-start fallback); then it returns True
        and the caller initialises as usual. A successful restore runs the warm copy beside this process, and
        this call keeps blocking. Without the variable (or the control dir) it returns False at once.
        """
        if os.environ.get(STANDBY_VAR, "").strip().lower() not in ("1", "true", "yes") or not self.path:
            return False
        while not os.path.exists(self._file(COLD_START)):
            time.sleep(max(self.poll, 0.2))
        return True

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

    def on(self, stage: str, callback: Callable[[object], None]) -> Optional[threading.Thread]:
        """Register ``callback`` for one of the six ``STAGES`` (see the module docs for when each runs).

        In a source the callback gets a ``CheckpointRequest``, in a restored copy (``restore_pre``,
        ``restore_post``, ``unlock_post`` after a restore) a ``RestoreInfo``; ``.stage`` names the stage.
        Callbacks of a stage run in registration order; one that raises or does not return before the
        stage's deadline refuses the stage: warmstart rolls back and names the stage and the callback.
        """
        return self._add(stage, callback, "any")

    def off(self, stage: str, callback: Callable[[object], None]) -> bool:
        """Unregister ``callback`` from ``stage`` (every registration of it, aliases included); True if it was there."""
        hooks = self._hooks[_check_stage(stage)]
        kept = [entry for entry in hooks if entry[0] != callback]
        removed = len(kept) != len(hooks)
        hooks[:] = kept
        self._advertise()
        return removed

    def stages(self) -> List[str]:
        """The stages warmstart must drive for this process (the ones it advertises in ``checkpoint-hooks``)."""
        return [stage for stage in STAGES if any(where != "copy" for _cb, where in self._hooks[stage])]

    def on_restore(self, callback: Callable[[RestoreInfo], None]) -> Optional[threading.Thread]:
        """Call ``callback(info)`` in the watcher thread after every restore of this process (``unlock_post`` in a copy)."""
        return self._add("unlock_post", callback, "copy")

    on_post_restore = on_restore

    def on_pre_checkpoint(self, callback: Callable[[CheckpointRequest], None]) -> Optional[threading.Thread]:
        """``lock_pre``: called when warmstart asks for a snapshot, before ``ready-for-snapshot`` is written.

        Quiesce here: finish in-flight requests, drop what need not be in the
        snapshot (KV cache, allocator caches), close external connections.
        Callbacks run in registration order; one that raises refuses the
        checkpoint (``checkpoint-refused`` with its text) and the
        post-checkpoint callbacks run with ``result="refused"``.
        """
        return self._add("lock_pre", callback, "any")

    def on_post_checkpoint(self, callback: Callable[[CheckpointRequest], None]) -> Optional[threading.Thread]:
        """``unlock_post`` in the source: called when a checkpoint this process quiesced for is over.

        ``request.result``: ok, failed, timeout (warmstart gave up waiting) or
        refused. Undo the pre-checkpoint work: reopen connections, resume
        serving. Not called in a restored copy (that gets post-restore).
        """
        return self._add("unlock_post", callback, "source")

    def _add(self, stage: str, callback: Callable, where: str) -> Optional[threading.Thread]:
        hooks = self._hooks[_check_stage(stage)]
        if not self.path:
            return None
        hooks.append((callback, where))
        self._advertise()
        if not self.watch:
            return None
        with self._start_lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="warmstart-control-watch", daemon=True)
                self._watcher.start()
        return self._watcher

    def _advertise(self) -> None:
        """``checkpoint-hooks``: tells warmstart which stages to drive (it asks only workloads that have hooks)."""
        if not self.path:
            return
        stages = self.stages()
        if stages:
            self._write(CHECKPOINT_HOOKS, f"pid={os.getpid()}\nstages={','.join(stages)}\n")
        else:
            try:
                os.unlink(self._file(CHECKPOINT_HOOKS))
            except FileNotFoundError:
                pass

    def _watch(self) -> None:
        while True:
            try:
                self.check()
            except OSError as exc:  # e.g. the control dir went away: keep watching, say why
                self._error(f"control dir {self.path}: {exc}")
            time.sleep(self.poll)

    def _callbacks(self, stage: str, copy: bool) -> List[Callable]:
        skip = "source" if copy else "copy"
        return [callback for callback, where in self._hooks[stage] if where != skip]

    def _run(self, stage: str, copy: bool, arg: object) -> None:
        """Callbacks whose failure changes nothing (``unlock_post``): every one runs, failures are recorded."""
        for callback in self._callbacks(stage, copy):
            try:
                callback(arg)
            except Exception as exc:  # pylint: disable=broad-except
                self._error(f"{stage} callback {_name(callback)} failed: {type(exc).__name__}: {exc}")

    def _run_bounded(self, stage: str, copy: bool, arg: object, deadline: Optional[float]) -> Optional[tuple]:
        """A stage warmstart waits for: its callbacks in order until one fails; (callback name, error) or None.

        With a ``deadline`` each callback runs in its own thread and one still running shortly before the
        deadline fails the stage (it hangs: warmstart rolls back; the thread is left to finish on its own).
        """
        for callback in self._callbacks(stage, copy):
            outcome: List[BaseException] = []
            if deadline is None:
                _call(callback, arg, outcome)
            else:
                left = deadline - time.time()
                worker = threading.Thread(target=_call, args=(callback, arg, outcome), daemon=True,
                                          name=f"warmstart-{stage}-{_name(callback)}")
                worker.start()
                worker.join(max(0.0, left - min(1.0, left * 0.1)))
                if worker.is_alive():
                    return _name(callback), f"TimeoutError: {stage} callback {_name(callback)} did not return " \
                                            f"within {max(0.0, left):.1f} s"
            if outcome:
                self._error(f"{stage} callback {_name(callback)} failed: {type(outcome[0]).__name__}: {outcome[0]}")
                return _name(callback), " ".join(f"{type(outcome[0]).__name__}: {outcome[0]}".split())
        return None

    def _error(self, text: str) -> None:
        self.errors.append(text)
        sys.stderr.write(f"warmstart_workload: {text}\n")

    def check(self) -> None:
        """Handle what is new in the control dir now: a restore, a checkpoint request or stage, a checkpoint's end.

        The watcher thread calls this every ``poll`` s once a callback is
        registered; a server with its own loop may call it instead.
        """
        if not self.path:
            return
        with self._check_lock:
            info = self.restored()
            if info is not None:
                # A copy: whatever the source was doing for a checkpoint is over for us.
                self._answered = None
                self._seen_done = _signature(self._file(CHECKPOINT_DONE))
                self._advertise()  # the copy's control dir may be a new one
                info.stage = "unlock_post"
                self._run("unlock_post", True, info)
            self._check_request()
            self._check_stage()
            self._check_done()

    def _check_request(self) -> None:
        sig = _signature(self._file(CHECKPOINT_REQUESTED))
        if sig is None or sig == self._seen_request:
            return
        self._seen_request = sig
        try:
            with open(self._file(CHECKPOINT_REQUESTED), "r", encoding="utf-8") as handle:
                request = CheckpointRequest(_parse(handle.read()), stage="lock_pre")
        except FileNotFoundError:
            return
        left = request.remaining()
        if left is not None and left <= 0:
            return  # warmstart stopped waiting for this one
        note = f"request={request.request or ''}\npid={os.getpid()}\n"
        failed = self._run_bounded("lock_pre", False, request, request.deadline)
        if failed is not None:
            self._write(CHECKPOINT_REFUSED, f"{note}error={failed[1]}\nstage=lock_pre\ncallback={failed[0]}\n")
            self._run("unlock_post", False, CheckpointRequest(request.fields, "refused", "unlock_post"))
            return
        self._answered = request.request or ""
        self.ready(note)

    def _check_stage(self) -> None:
        """``checkpoint-stage``: backup_pre, backup_post, restore_pre, restore_post; answered in ``checkpoint-stage-done``."""
        sig = _signature(self._file(CHECKPOINT_STAGE))
        if sig is None or sig == self._seen_stage:
            return
        self._seen_stage = sig
        try:
            with open(self._file(CHECKPOINT_STAGE), "r", encoding="utf-8") as handle:
                fields = _parse(handle.read())
        except FileNotFoundError:
            return
        stage = fields.get("stage", "")
        copy = fields.get("copy") == "1"
        if stage not in STAGES:
            return
        if copy:  # a restored copy: the source's checkpoint is over for it
            self._answered = None
            self._seen_done = _signature(self._file(CHECKPOINT_DONE))
        elif (self._answered is None or fields.get("request") != self._answered):
            return  # a checkpoint this process did not quiesce for
        arg: object = RestoreInfo(fields, stage) if copy else CheckpointRequest(fields, stage=stage)
        deadline = CheckpointRequest(fields).deadline
        if deadline is not None and deadline <= time.time():
            return
        failed = self._run_bounded(stage, copy, arg, deadline)
        answer = f"request={fields.get('request', '')}\nstage={stage}\npid={os.getpid()}\n"
        answer += "result=ok\n" if failed is None else f"result=refused\nerror={failed[1]}\ncallback={failed[0]}\n"
        self._write(CHECKPOINT_STAGE_DONE, answer)

    def _check_done(self) -> None:
        sig = _signature(self._file(CHECKPOINT_DONE))
        if sig == self._seen_done:
            return
        self._seen_done = sig
        if sig is None or self._answered is None:
            return
        try:
            with open(self._file(CHECKPOINT_DONE), "r", encoding="utf-8") as handle:
                fields = _parse(handle.read())
        except FileNotFoundError:
            return
        if fields.get("request", self._answered) != self._answered:
            return  # the end of a checkpoint we did not quiesce for
        self._answered = None
        self._run("unlock_post", False, CheckpointRequest(fields, fields.get("result", "ok"), "unlock_post"))

    def _write(self, name: str, text: str) -> None:
        target = self._file(name)
        tmp = f"{target}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, target)

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
