# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Control-directory sentinels shared by a workload and warmstart.

The workload writes ``ready-for-snapshot`` when warm; a restore writes
``restore-complete`` (``pid=<pid in the workload's pid namespace>``) or
``restore-failed``. Writes are atomic (temp file + rename).

Checkpoint hooks (workloads using ``warmstart_workload``'s ``on_pre_checkpoint``):
``request_checkpoint`` writes ``checkpoint-requested`` (``request=<id>``,
``deadline=<epoch s>``) and waits for the workload to quiesce and answer
``ready-for-snapshot`` (``request=<id>``) or ``checkpoint-refused``
(``request=<id>``, ``error=<text>``). When the source keeps running after the
dump (or the checkpoint gave up), ``finish_checkpoint`` writes
``checkpoint-done`` (``request=<id>``, ``result=ok|failed|timeout``) and the
workload's ``on_post_checkpoint`` callbacks resume it. A workload with
pre-checkpoint callbacks advertises them with ``checkpoint-hooks``
(``has_checkpoint_hooks``): ask only those, the others never answer.

The six lifecycle stages (CANN's names, ``STAGES``): ``checkpoint-hooks``
lists the stages the workload registered (``stages=lock_pre,backup_pre,...``;
an older helper's ``pre_checkpoint`` / ``post_checkpoint`` / ``post_restore``
read as ``lock_pre`` / ``unlock_post``). ``lock_pre`` is the checkpoint
request above and ``unlock_post`` is ``checkpoint-done`` in a source that
keeps running and ``restore-complete`` in a copy; ``run_stage`` drives the
four in between: it writes ``checkpoint-stage`` (``request=<id>``,
``stage=<name>``, ``deadline=<epoch s>``, and for a restored copy
``pid=<its pid>``, ``copy=1``, ``snapshot=<id>``) and waits for
``checkpoint-stage-done`` (``request=<id>``, ``stage=<name>``,
``result=ok`` or ``result=refused`` with ``error=`` and ``callback=``).
"""
from __future__ import annotations

import os
import time
import uuid
from typing import Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

READY = "ready-for-snapshot"
RESTORE_COMPLETE = "restore-complete"
RESTORE_FAILED = "restore-failed"
CHECKPOINT_REQUESTED = "checkpoint-requested"
CHECKPOINT_REFUSED = "checkpoint-refused"
CHECKPOINT_DONE = "checkpoint-done"
CHECKPOINT_HOOKS = "checkpoint-hooks"
CHECKPOINT_STAGE = "checkpoint-stage"
CHECKPOINT_STAGE_DONE = "checkpoint-stage-done"
CHECKPOINT_SENTINELS = (CHECKPOINT_REQUESTED, CHECKPOINT_REFUSED, CHECKPOINT_DONE, CHECKPOINT_STAGE, CHECKPOINT_STAGE_DONE)
STAGES = ("lock_pre", "backup_pre", "backup_post", "restore_pre", "restore_post", "unlock_post")
OLD_STAGES = {"pre_checkpoint": "lock_pre", "post_checkpoint": "unlock_post", "post_restore": "unlock_post"}
STAGE_TIMEOUT = 60.0  # seconds a stage's callbacks may take where no other timeout applies (a restore)
ENV_VAR = "SNAPSHOT_CONTROL_DIR"


class CheckpointRefused(WarmstartError):
    """The workload's pre-checkpoint callbacks refused (message: its error)."""

    def __init__(self, message: str, request: str) -> None:
        super().__init__(message)
        self.request = request


class StageFailed(WarmstartError):
    """A stage's callbacks raised, hung past the timeout, or their process exited (``stage`` names it)."""

    def __init__(self, message: str, stage: str, callback: Optional[str] = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.callback = callback


def write(control_dir: str, name: str, content: str = "") -> str:
    """``control_dir/name`` replaced atomically with ``content`` (0644). The control dir is the workload's: it (or a
    container) may have planted a symlink or a hard link by any name there - ``safefs`` follows none."""
    return safefs.write_file(os.path.join(control_dir, name), content.encode("utf-8"), 0o644, sync=True)


def clear(control_dir: str, *names: str) -> None:
    for name in names:
        safefs.remove(os.path.join(control_dir, name))


def present(control_dir: str, name: str) -> bool:
    return os.path.exists(os.path.join(control_dir, name))


def wait_for(control_dir: str, name: str, timeout: float, alive: Optional[int] = None,
             interval: float = 0.1) -> float:
    """Wait until ``name`` appears; return the seconds waited.

    Raises TimeoutError after ``timeout`` s, or ProcessLookupError when the
    process ``alive`` exits while we wait.
    """
    start = time.monotonic()
    path = os.path.join(control_dir, name)
    while not os.path.exists(path):
        if alive is not None and not proc.alive(alive):
            raise ProcessLookupError(f"process {alive} exited before writing {path}")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{path} did not appear within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - start


def process_control_dir(pid: int) -> Optional[str]:
    """The SNAPSHOT_CONTROL_DIR a process was started with, if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = handle.read().split(b"\0")
    except OSError:
        return None
    prefix = ENV_VAR.encode() + b"="
    for item in env:
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace") or None
    return None


def parse_kv(text: str) -> Dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def read_record(control_dir: str, name: str, limit: int = 4096) -> Dict[str, str]:
    """The ``key=value`` lines of ``control_dir/name`` ({} when it is not there). The control dir is the
    workload's: the file is opened without following a symlink and must be a regular file of one link."""
    try:
        fd = safefs.open_file(os.path.join(control_dir, name), os.O_RDONLY)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as handle:
        return parse_kv(handle.read(limit).decode("utf-8", "replace"))


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def has_checkpoint_hooks(control_dir: str) -> bool:
    """True when the workload registered pre-checkpoint callbacks (it wrote ``checkpoint-hooks``)."""
    return present(control_dir, CHECKPOINT_HOOKS)


def request_checkpoint(control_dir: str, timeout: float, alive: Optional[int] = None,
                       interval: float = 0.05) -> Dict[str, str]:
    """Ask the workload to quiesce for a snapshot and wait for its answer.

    Clears stale ``ready-for-snapshot`` / ``checkpoint-refused`` /
    ``checkpoint-done`` first, writes ``checkpoint-requested`` and waits up to
    ``timeout`` s for ``ready-for-snapshot`` carrying this request's id (or
    none). Returns ``{"request": id, "waited": seconds as text, ...the
    answer's key=value}``. Raises CheckpointRefused (the workload's error),
    TimeoutError, or ProcessLookupError when process ``alive`` exits; in
    every failure ``checkpoint-requested`` is removed, and on timeout
    ``checkpoint-done`` (``result=timeout``) tells a late workload to resume.
    """
    request = uuid.uuid4().hex[:12]
    clear(control_dir, READY, CHECKPOINT_REFUSED, CHECKPOINT_DONE, CHECKPOINT_REQUESTED)
    start = time.monotonic()
    write(control_dir, CHECKPOINT_REQUESTED,
          f"request={request}\nrequested_by={os.getpid()}\ndeadline={time.time() + timeout:.3f}\n")
    ready_path = os.path.join(control_dir, READY)
    refused_path = os.path.join(control_dir, CHECKPOINT_REFUSED)
    try:
        while True:
            refused = _read(refused_path)
            if refused is not None and parse_kv(refused).get("request", request) == request:
                said = parse_kv(refused)
                error = said.get("error") or refused.strip() or "no reason given"
                where = f" (stage {said.get('stage') or 'lock_pre'}, callback {said['callback']})" if said.get("callback") else ""
                raise CheckpointRefused(f"the workload refused the checkpoint ({refused_path}): {error}{where}", request)
            ready = _read(ready_path)
            if ready is not None and parse_kv(ready).get("request", request) == request:
                answer = parse_kv(ready)
                answer.update(request=request, waited=f"{time.monotonic() - start:.3f}")
                clear(control_dir, CHECKPOINT_REQUESTED)
                return answer
            if alive is not None and not proc.alive(alive):
                raise ProcessLookupError(f"process {alive} exited before answering {os.path.join(control_dir, CHECKPOINT_REQUESTED)}")
            if time.monotonic() - start > timeout:
                finish_checkpoint(control_dir, request, "timeout", f"no answer within {timeout:g} s")
                raise TimeoutError(f"the workload did not answer {os.path.join(control_dir, CHECKPOINT_REQUESTED)} with "
                                   f"{READY} or {CHECKPOINT_REFUSED} within {timeout:g} s (does it use on_pre_checkpoint?)")
            time.sleep(interval)
    except BaseException:
        clear(control_dir, CHECKPOINT_REQUESTED)
        raise


def finish_checkpoint(control_dir: str, request: str, result: str = "ok", detail: str = "") -> str:
    """Tell a source that keeps running that the snapshot is over (``result`` ok / failed / timeout): it resumes."""
    clear(control_dir, CHECKPOINT_REQUESTED)
    body = f"request={request}\nresult={result}\n" + (f"detail={' '.join(detail.split())}\n" if detail else "")
    return write(control_dir, CHECKPOINT_DONE, body)


def hook_stages(control_dir: Optional[str]) -> List[str]:
    """The stages the workload registered callbacks for (``checkpoint-hooks``), in lifecycle order; [] without."""
    text = _read(os.path.join(control_dir, CHECKPOINT_HOOKS)) if control_dir else None
    if text is None:
        return []
    named = {OLD_STAGES.get(item.strip(), item.strip()) for item in parse_kv(text).get("stages", "").split(",")}
    return [stage for stage in STAGES if stage in named] or ["lock_pre"]


def run_stage(control_dir: str, stage: str, request: str, timeout: float, alive: Optional[int] = None,
              extra: Optional[Dict[str, str]] = None, interval: float = 0.02) -> float:
    """Run the workload's ``stage`` callbacks (``checkpoint-stage``) and wait for their answer; the seconds taken.

    Raises StageFailed naming the stage (and the callback, when the workload said which) when a callback
    raised or did not return within ``timeout`` s, or the process ``alive`` exited. ``checkpoint-stage`` is
    removed whatever happens.
    """
    if stage not in STAGES:
        raise ValueError(f"{stage!r} is not one of {', '.join(STAGES)}")
    clear(control_dir, CHECKPOINT_STAGE_DONE)
    start = time.monotonic()
    body = f"request={request}\nstage={stage}\ndeadline={time.time() + timeout:.3f}\n"
    write(control_dir, CHECKPOINT_STAGE, body + "".join(f"{k}={v}\n" for k, v in (extra or {}).items()))
    done_path = os.path.join(control_dir, CHECKPOINT_STAGE_DONE)
    try:
        while True:
            text = _read(done_path)
            answer = parse_kv(text) if text is not None else {}
            if answer.get("request") == request and answer.get("stage") == stage:
                if answer.get("result", "ok") == "ok":
                    return time.monotonic() - start
                callback = answer.get("callback") or None
                raise StageFailed(f"the workload's {stage} callback{f' {callback}' if callback else 's'} "
                                  f"failed: {answer.get('error') or 'no reason given'}", stage, callback)
            if alive is not None and not proc.alive(alive):
                raise StageFailed(f"process {alive} exited during its {stage} callbacks", stage)
            if time.monotonic() - start > timeout:
                raise StageFailed(f"the workload's {stage} callbacks did not answer {os.path.join(control_dir, CHECKPOINT_STAGE)}"
                                  f" within {timeout:g} s (a callback hangs?)", stage)
            time.sleep(interval)
    finally:
        clear(control_dir, CHECKPOINT_STAGE, CHECKPOINT_STAGE_DONE)
