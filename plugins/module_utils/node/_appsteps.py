# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Running an application profile's probes and steps (``_profile``) against a server's process.

Everything is done as the server sees it: HTTP and TCP from inside its network namespace (a forked child
joins it where it is not ours: a container's 127.0.0.1 is its own), files and log paths through its root
(``/proc/<pid>/root``), commands through ``nsenter`` into its namespaces. Nothing here writes anything.

``wait_probe`` polls until the probe passes, the process is gone or the timeout ends; the error says which
probe and what it saw last. ``run_steps`` runs a phase's steps in order and stops at the first failure, whose
error names the phase, the step and the cause (``AppStepError.step``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Sequence

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._profile import Probe, Step

LOG_WINDOW = 1 << 16  # bytes of a log kept between polls, so a line split across two reads still matches


class AppStepError(WarmstartError):
    """A profile's probe or step failed; ``step`` says which (``phase[index]: what``)."""

    def __init__(self, message: str, step: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.step = step


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _own_netns(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return True


def in_netns(pid: int, call: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """``call()`` run in ``pid``'s network namespace (here when it is ours, else in a forked child that joins it;
    ``call`` bounds its own time)."""
    if _own_netns(pid):
        return call()
    try:
        return dict(json.loads(nsu.run_in(pid, ("net",), lambda: json.dumps(call()))))
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}


def _http_call(spec: Dict[str, Any], default_method: str, timeout: float) -> Callable[[], Dict[str, Any]]:
    def call() -> Dict[str, Any]:
        body = None
        headers = {str(k): str(v) for k, v in (spec.get("headers") or {}).items()}
        if "json" in spec:
            body = json.dumps(spec["json"]).encode()
            headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(spec["url"], data=body, method=spec.get("method", default_method).upper(),
                                         headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        try:
            with opener.open(request, timeout=timeout) as answer:
                return {"status": answer.status, "body": answer.read(1 << 16).decode("utf-8", "replace")}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": exc.read(1 << 16).decode("utf-8", "replace")}
        except (OSError, ValueError) as exc:
            return {"error": str(getattr(exc, "reason", exc))}
    return call


def _http_ok(spec: Dict[str, Any], answer: Dict[str, Any]) -> Optional[str]:
    """None when the answer is what the spec expects, else what it was."""
    if "error" in answer:
        return f"no answer ({answer['error']})"
    if answer.get("status") not in spec.get("status", [200]):
        return f"status {answer.get('status')}: {str(answer.get('body', ''))[:200]!r}"
    if spec.get("body") and not re.search(spec["body"], str(answer.get("body", ""))):
        return f"status {answer.get('status')}, but the body does not match /{spec['body']}/: " \
               f"{str(answer.get('body', ''))[:200]!r}"
    return None


def _tcp_call(spec: Dict[str, Any], timeout: float) -> Callable[[], Dict[str, Any]]:
    def call() -> Dict[str, Any]:
        try:
            with socket.create_connection((spec.get("host", "127.0.0.1"), int(spec["port"])), timeout=timeout):
                return {"ok": True}
        except OSError as exc:
            return {"error": exc.strerror or str(exc)}
    return call


def _tcp_ok(answer: Dict[str, Any]) -> Optional[str]:
    return None if answer.get("ok") else f"cannot connect ({answer.get('error')})"


def log_paths(pid: int, spec: Dict[str, Any]) -> List[str]:
    """The files a log probe reads: a ``path`` as the server sees it, or its stdout/stderr where they are files."""
    if spec.get("path"):
        return [f"/proc/{pid}/root{spec['path']}"]
    fds = {"stdout": [1], "stderr": [2]}.get(spec.get("stream", "any"), [1, 2])
    out = []
    for fd in fds:
        try:
            if stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode):
                out.append(os.path.realpath(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def log_sizes(pid: int, probe: Probe) -> Dict[str, int]:
    """Where each log a probe reads ends now: a restored copy's probe looks only at what it writes afterwards."""
    if probe.kind != "log":
        return {}
    sizes = {}
    for path in log_paths(pid, probe.spec):
        try:
            sizes[path] = os.stat(path).st_size
        except OSError:
            continue
    return sizes


class _LogScan:
    """Reads the new part of each log on every poll and searches it (a window of the previous part kept)."""

    def __init__(self, pid: int, spec: Dict[str, Any], since: Optional[Dict[str, int]]) -> None:
        self.pid, self.spec = pid, spec
        self.regex = re.compile(spec["regex"].encode(), re.MULTILINE)
        self.offsets: Dict[str, int] = dict(since or {})
        self.windows: Dict[str, bytes] = {}

    def __call__(self) -> Optional[str]:
        paths = log_paths(self.pid, self.spec)
        if not paths:
            return "its stdout and stderr are not files (give the log's path)"
        for path in paths:
            try:
                with open(path, "rb") as handle:
                    handle.seek(self.offsets.get(path, 0))
                    new = handle.read(64 << 20)
                    self.offsets[path] = handle.tell()
            except OSError as exc:
                return f"cannot read {path}: {exc.strerror}"
            text = self.windows.get(path, b"") + new
            if self.regex.search(text):
                return None
            self.windows[path] = text[-LOG_WINDOW:]
        return f"no line matches /{self.spec['regex']}/ yet in {', '.join(paths)}"


def _checker(probe: Probe, pid: int, since: Optional[Dict[str, int]]) -> Callable[[], Optional[str]]:
    """A function that returns None when the probe passes, else what it saw."""
    if probe.kind == "http":
        timeout = min(10.0, probe.timeout)
        return lambda: _http_ok(probe.spec, in_netns(pid, _http_call(probe.spec, "GET", timeout)))
    if probe.kind == "tcp":
        return lambda: _tcp_ok(in_netns(pid, _tcp_call(probe.spec, 5.0)))
    if probe.kind == "log":
        return _LogScan(pid, probe.spec, since)
    if probe.kind == "file":
        path = f"/proc/{pid}/root{probe.spec['path']}"
        return lambda: None if os.path.lexists(path) else f"{probe.spec['path']} does not exist yet"

    def control() -> Optional[str]:
        directory = ctl.process_control_dir(pid)
        if not directory:
            return "the process has no SNAPSHOT_CONTROL_DIR"
        return None if ctl.present(directory, ctl.READY) else f"no {ctl.READY} in {directory} yet"
    return control


def wait_probe(probe: Probe, pid: int, what: str, timeout: Optional[float] = None,
               since: Optional[Dict[str, int]] = None) -> float:
    """Seconds until ``probe`` passed for the server ``pid``; AppStepError when it does not in time or the
    server is gone (``what``: the probe's role, e.g. ``profile vllm: ready``)."""
    check = _checker(probe, pid, since)
    limit = probe.timeout if timeout is None else timeout
    start = time.monotonic()
    seen = "never checked"
    while True:
        if not _alive(pid):
            raise AppStepError(f"{what}: the server (pid {pid}) exited before {probe.describe()} passed "
                               f"(last: {seen})", step=what)
        seen = check() or ""
        if not seen:
            return time.monotonic() - start
        if time.monotonic() - start > limit:
            raise AppStepError(f"{what}: {probe.describe()} did not pass within {limit:g} s (last: {seen})",
                               step=what)
        time.sleep(probe.interval)


def _command(step: Step, pid: int) -> Optional[str]:
    argv = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", *step.spec]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=step.timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"did not finish within {step.timeout:g} s"
    except OSError as exc:
        return f"cannot run nsenter: {exc.strerror}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-300:]
        return f"exited {done.returncode}: {tail!r}"
    return None


def run_step(step: Step, pid: int) -> Optional[str]:
    """None when ``step`` succeeded on the server ``pid``, else why not."""
    if step.kind == "http":
        return _http_ok(step.spec, in_netns(pid, _http_call(step.spec, "POST", step.timeout)))
    if step.kind == "signal":
        try:
            os.kill(pid, getattr(signal, step.spec))
        except OSError as exc:
            return f"cannot signal pid {pid}: {exc.strerror}"
        return None
    return _command(step, pid)


def run_steps(steps: Sequence[Step], pid: int, what: str) -> List[Dict[str, Any]]:
    """Run ``steps`` in order on the server ``pid``; what each did; AppStepError at the first that fails
    (``what``: the phase, e.g. ``profile vllm-sleep: quiesce``)."""
    done: List[Dict[str, Any]] = []
    for index, step in enumerate(steps):
        started = time.monotonic()
        problem = run_step(step, pid)
        name = f"{what}[{index}] ({step.describe()})"
        if problem:
            raise AppStepError(f"{name} failed: {problem}", step=name, steps_done=done)
        done.append({"step": step.describe(), "seconds": round(time.monotonic() - started, 3)})
    return done
