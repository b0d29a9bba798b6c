# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Restorable workloads: processes started so that CRIU can move them.

A workload runs as the init of its own PID namespace (restored PIDs cannot
collide with the node's), leads its own session, reads /dev/null and writes
stdout/stderr to files that only it holds. By default it also has a mount
namespace of its own: every mount a slave of the node's (the node's mounts and
unmounts still reach it) and a /proc that shows its PID namespace - CUDA
refuses to initialise where /proc/self is another process (see _mountns for
what a snapshot keeps of it). Its state lives in
``<root>/<name>/``: ``pid``, ``spec.json``, ``stdout.log``, ``stderr.log`` and
``control/`` (exported as SNAPSHOT_CONTROL_DIR).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _iouring as iou
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _namespaces as nsu
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _appsteps as aps
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._manifest import check_name

DEFAULT_ROOT = _paths.WORKLOADS_DIR
CLONE_NEWPID = 0x20000000


class WorkloadError(WarmstartError):
    pass


def paths(root: str, name: str) -> Dict[str, str]:
    base = os.path.join(root, check_name(name, "workload name"))
    return {
        "dir": base,
        "pidfile": os.path.join(base, "pid"),
        "spec": os.path.join(base, "spec.json"),
        "stdout": os.path.join(base, "stdout.log"),
        "stderr": os.path.join(base, "stderr.log"),
        "control": os.path.join(base, "control"),
    }


def running_pid(root: str, name: str) -> Optional[int]:
    """Host PID of the running workload ``name``, or None (stale pidfiles ignored)."""
    pid = proc.read_pidfile(paths(root, name)["pidfile"])
    if pid is None or not proc.alive(pid):
        return None
    try:
        if not proc.is_ns_init(pid):
            return None
    except OSError:
        return None
    return pid


def info(root: str, name: str) -> Dict[str, Any]:
    p = paths(root, name)
    pid = running_pid(root, name)
    out: Dict[str, Any] = {"name": name, "running": pid is not None, "pid": pid, **p}
    if os.path.exists(p["spec"]):
        with open(p["spec"], "r", encoding="utf-8") as handle:
            out["spec"] = json.load(handle)
    return out


def _unshare_pid() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def start(root: str, name: str, command: List[str], env: Optional[Dict[str, str]] = None,
          chdir: Optional[str] = None, inherit_env: bool = True, mount_namespace: bool = True,
          profile: Optional[pf.Profile] = None) -> Dict[str, Any]:
    """Start ``command`` as a restorable workload; returns its info.

    ``mount_namespace``: in a mount namespace of its own with its own /proc (else the node's, whose /proc shows
    the node's PIDs). ``profile``: its application profile, kept in spec.json for the checkpoint to use."""
    if not command:
        raise WorkloadError("command is empty")
    if chdir and not os.path.isdir(chdir):
        raise WorkloadError(f"chdir {chdir} is not a directory")
    p = paths(root, name)
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.makedirs(p["dir"], mode=0o700, exist_ok=True)
    os.makedirs(p["control"], mode=0o755, exist_ok=True)
    # a new process: an earlier one's hooks (checkpoint-hooks: the stages warmstart would drive) are not its own
    ctl.clear(p["control"], ctl.READY, ctl.RESTORE_COMPLETE, ctl.RESTORE_FAILED, ctl.CHECKPOINT_HOOKS,
              *ctl.CHECKPOINT_SENTINELS)
    full_env = dict(os.environ) if inherit_env else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for key in [k for k in full_env if k.startswith("ANSIBLE_") or k.startswith("_ANSIBLE")]:
        del full_env[key]
    full_env.update(env or {})
    full_env[ctl.ENV_VAR] = p["control"]
    spec = {"command": command, "env": env or {}, "chdir": chdir, "mount_namespace": mount_namespace,
            "app_profile": profile.record() if profile else None}
    safefs.write_file(os.path.abspath(p["spec"]), json.dumps(spec, indent=2).encode("utf-8"), 0o600)

    rfd, wfd = os.pipe()
    first = os.fork()
    if first == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(rfd)
            _unshare_pid()
            if mount_namespace:
                nsu.slave_mount_ns()
            second = os.fork()
            if second == 0:
                _exec_workload(command, full_env, chdir, p, wfd, mount_namespace)
            os.write(wfd, f"pid {second}\n".encode())
        except BaseException as exc:  # report anything to the parent, never return into Ansible
            os.write(wfd, f"error {exc}\n".encode())
        finally:
            os._exit(0)
    os.close(wfd)
    os.waitpid(first, 0)
    with os.fdopen(rfd, "r") as reader:
        lines = reader.read().splitlines()
    pid = None
    for line in lines:
        if line.startswith("error "):
            raise WorkloadError(f"cannot start workload {name}: {line[6:]}")
        if line.startswith("pid "):
            pid = int(line[4:])
    if pid is None:
        raise WorkloadError(f"cannot start workload {name}: the launcher reported nothing")
    proc.write_pidfile(p["pidfile"], pid)
    return info(root, name)


def _exec_workload(command: List[str], env: Dict[str, str], chdir: Optional[str],
                   p: Dict[str, str], report_fd: int, own_proc: bool) -> None:  # pragma: no cover - child
    try:
        if own_proc:  # we are the init of the new PID namespace: a /proc that shows it
            nsu.replace_proc()
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        out = safefs.open_file(os.path.abspath(p["stdout"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err = safefs.open_file(os.path.abspath(p["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        # A daemon's cwd must outlive the module (whose cwd is a temp dir)
        # and exist on the node it is restored on.
        os.chdir(chdir or "/")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.closerange(3, report_fd)
        os.set_inheritable(report_fd, False)
        os.closerange(report_fd + 1, 65536)
        iou.refuse_in_this_process()  # CRIU cannot dump io_uring: the server and its children fall back to epoll
        os.execvpe(command[0], command, env)
    except BaseException as exc:
        os.write(report_fd, f"error {command[0]}: {exc}\n".encode())
        os._exit(127)


def stop(root: str, name: str, timeout: float = 10.0) -> Dict[str, Any]:
    """Stop the workload (SIGTERM, then SIGKILL); returns {'stopped': how, 'pid': pid}."""
    pid = running_pid(root, name)
    if pid is None:
        return {"stopped": "not running", "pid": None}
    how = proc.terminate(pid, timeout)
    try:
        os.unlink(paths(root, name)["pidfile"])
    except FileNotFoundError:
        pass
    return {"stopped": how, "pid": pid}


def ensure(root: str, name: str, state: str, command: List[str], env: Optional[Dict[str, str]] = None,
           chdir: Optional[str] = None, wait_ready: bool = False, ready_timeout: Optional[float] = None,
           stop_timeout: float = 10, check_mode: bool = False,
           mount_namespace: bool = True, profile: Optional[pf.Profile] = None) -> "tuple[bool, Dict[str, Any]]":
    """Bring workload ``name`` to ``state``; returns (changed, info). ``wait_ready``: until the profile's ready
    probe passes (else the control file ``ready-for-snapshot``), ``ready_timeout`` seconds at most (default: the
    profile's, else 300)."""
    pid = running_pid(root, name)
    if state == "stopped":
        if pid is None:
            return False, info(root, name)
        if check_mode:
            return True, info(root, name)
        how = stop(root, name, stop_timeout)
        return True, {**info(root, name), "stopped": how["stopped"]}
    if pid is not None:
        return False, info(root, name)
    if check_mode:
        return True, info(root, name)
    result = start(root, name, command, env=env, chdir=chdir, mount_namespace=mount_namespace, profile=profile)
    if wait_ready:
        result["ready_after"] = round(_wait_ready(result, profile, ready_timeout), 3)
    return True, result


def _wait_ready(result: Dict[str, Any], profile: Optional[pf.Profile], timeout: Optional[float]) -> float:
    """Seconds until the started workload was ready; WorkloadError (pointing at its stderr) when not in time."""
    try:
        if profile:
            return aps.wait_probe(profile.ready, result["pid"], f"profile {profile.name}: ready", timeout)
        return ctl.wait_for(result["control"], ctl.READY, 300.0 if timeout is None else timeout, alive=result["pid"])
    except (TimeoutError, ProcessLookupError, aps.AppStepError) as exc:
        raise WorkloadError(f"{exc}; see {result['stderr']}") from None


def profile_of(root: str, name: str) -> Optional[pf.Profile]:
    """The application profile workload ``name`` was started with (None without one)."""
    try:
        spec = info(root, name).get("spec") or {}
    except (OSError, ValueError):
        return None
    return pf.from_record(spec.get("app_profile")) if isinstance(spec, dict) else None
