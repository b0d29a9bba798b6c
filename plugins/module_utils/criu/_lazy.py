# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Lazy restore: the restored tree runs at once, CRIU's lazy-pages daemon streams its memory in.

The restore registers the tree's private anonymous memory with userfaultfd and
hands the descriptors to ``criu lazy-pages``, which serves each page on first
touch and pushes the rest in the background; it exits when every page is in.
The pages come from the node-local images, or (``page_server``) straight from
the node that holds them, through ``criu page-server --lazy-pages`` there.

A supervisor (a detached double fork, like the checkpoint guardian) owns the
daemon. It holds duplicates of the tree's userfault descriptors (pidfd_getfd),
so a daemon that dies leaves faulting threads blocked instead of handing them
zero pages; it then kills the restored tree. It also kills the tree (then the
daemon) when memory is not complete within ``timeout`` seconds. A tree that
was killed never ran on missing memory. The outcome is written to
``<work_dir>/lazy-state.json`` (and ``restore-failed`` into the workload's
control directory on failure).

The pages of a restore whose memory comes from a page server are prepared by
``_lazyimages``; the page server on the node holding the images is ``_lazyserver``.
With ``serve_pages`` the supervisor is the page server itself: it listens on
loopback, hands the daemon's connection to ``serve_pages`` (``_pagewire``, over
pages checked as they are read), and when that fails - a page that did not
match - it cuts the connection, so the daemon fails and the tree is killed.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import probe_feature
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import _error_lines, log_tail
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

STATE = "lazy-state.json"
SOCKET = "lazy-pages.socket"
LOG = "lazy-pages.log"
DEFAULT_TIMEOUT = 600.0
START_TIMEOUT = 15.0
REQUIRED_FEATURES = ("uffd", "uffd-noncoop")
ACTIVE_DIR = _paths.LAZY_DIR
_SYS_PIDFD_SEND_SIGNAL = 424
_SYS_PIDFD_OPEN = 434
_SYS_PIDFD_GETFD = 438


class LazyError(WarmstartError):
    """A lazy restore that cannot start or did not complete."""

    def __init__(self, message: str, log_tail_text: Optional[str] = None) -> None:
        super().__init__(message, log_tail=log_tail_text)


SUPPORT_CACHE = _paths.LAZY_SUPPORT_CACHE


def _support_key(criu: str) -> str:
    """This CRIU binary on this kernel boot: what the probe's answer depends on."""
    try:
        st = os.stat(criu)
        with open("/proc/sys/kernel/random/boot_id", "r", encoding="ascii") as handle:
            boot = handle.read().strip()
    except OSError:
        return ""
    return f"{os.path.realpath(criu)}:{st.st_size}:{st.st_mtime_ns}:{boot}"


def support(criu: str, cache: str = SUPPORT_CACHE) -> Tuple[bool, str]:
    """Whether this node's kernel and CRIU can restore lazily (``criu check --feature uffd, uffd-noncoop``).

    A yes is remembered per CRIU binary and boot (in /run, a tmpfs): the two probes cost two CRIU runs
    (~70 ms) on the path to the first answer.
    """
    key = _support_key(criu)
    try:
        with open(cache, "r", encoding="utf-8") as handle:
            if key and json.load(handle).get(key):
                return True, "uffd and uffd-noncoop available"
    except (OSError, ValueError, AttributeError):
        pass
    missing = [f for f in REQUIRED_FEATURES if not probe_feature(criu, f)]
    if not missing and key:
        try:
            os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
            safefs.write_file(cache, json.dumps({key: True}).encode("utf-8"), 0o600)
        except OSError:
            pass
    if missing:
        return False, (f"this node lacks {' and '.join(missing)} (criu check --feature): the kernel has no "
                       "usable userfaultfd for CRIU (needs CONFIG_USERFAULTFD and vm.unprivileged_userfaultfd or root)")
    return True, "uffd and uffd-noncoop available"


def plan(criu: str, gpu_state: bool, wanted: bool) -> Dict[str, Any]:
    """Whether a restore runs lazily, and why (or why not): ``{used, reason}``."""
    if not wanted:
        return {"used": False, "reason": "lazy: false - every page is loaded before the tree resumes"}
    if gpu_state:
        return {"used": False, "reason": "the snapshot holds GPU state: restored eagerly (the CUDA restore needs "
                                         "the process's whole memory)"}
    ok, why = support(criu)
    if not ok:
        return {"used": False, "reason": f"{why}; restored eagerly instead"}
    return {"used": True, "reason": why}


def parse_address(spec: str) -> Tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) of a page server."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LazyError(f"page_server: {spec!r} is not host:port")
    return host.strip("[]"), int(port)


# --- state file -----------------------------------------------------------------

def _write_state(work: str, **fields: Any) -> Dict[str, Any]:
    path = os.path.join(work, STATE)
    state = read_state(work)
    state.update(fields)
    safefs.write_file(path, json.dumps(state).encode("utf-8"), 0o600)
    return state


def read_state(work: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(work, STATE), "r", encoding="utf-8") as handle:
            return dict(json.load(handle))
    except (OSError, ValueError):
        return {}


def wait(work: str, timeout: float) -> Dict[str, Any]:
    """The final state of the lazy restore in ``work``: complete or failed (or streaming at ``timeout``)."""
    end = time.monotonic() + timeout
    while True:
        state = read_state(work)
        if state.get("state") in ("complete", "failed") or time.monotonic() >= end:
            return state
        time.sleep(0.02)


def active(pids: List[int], active_dir: str = ACTIVE_DIR) -> Optional[Dict[str, Any]]:
    """The lazy restore still streaming memory into one of ``pids`` (its state), if any."""
    for pid in pids:
        path = os.path.join(active_dir, f"{pid}.json")
        try:
            with open(path, "r", encoding="utf-8") as handle:
                state: Dict[str, Any] = json.load(handle)
        except (OSError, ValueError):
            continue
        if proc.alive(int(state.get("supervisor_pid") or 0)):
            state["pid"] = pid
            return state
    return None


# --- the daemon and its supervisor --------------------------------------------------

@dataclass
class Session:
    """A started lazy-pages daemon under its supervisor; ``attach`` or ``abort`` it after the restore."""

    work: str
    wfd: int
    daemon_pid: int
    started_at: float

    def attach(self, pid: int, placeholder: Optional[int] = None) -> None:
        """The restore succeeded: the supervisor now watches tree ``pid``; should memory not be complete it
        kills the tree, then ``placeholder`` (the PID 1 of the container the tree was restored into, so that
        its supervisor replaces it; held by a pidfd from now on, never a recycled PID)."""
        try:
            os.write(self.wfd, f"pid {pid}{f' {placeholder}' if placeholder else ''}\n".encode())
        finally:
            os.close(self.wfd)

    def abort(self) -> None:
        """The restore failed (CRIU killed its half-restored tree): stop the daemon."""
        try:
            os.write(self.wfd, b"abort\n")
        finally:
            os.close(self.wfd)

    def failure(self) -> str:
        """Why a restore against the daemon failed: CRIU's first error in its log, else its last line."""
        errors = _log_error(self.work)
        if errors or proc.alive(self.daemon_pid):
            return errors
        last = log_tail(os.path.join(self.work, LOG), 1).strip()  # a daemon that gave up without an "Error" line
        return last.split(") ", 1)[-1]


@contextlib.contextmanager
def guard(session: Optional[Session], grace: float = 3.0) -> Iterator[None]:
    """Bound a CRIU restore that runs against ``session``'s daemon.

    If the daemon dies while CRIU restores (e.g. it cannot reach the page server), CRIU kills the tree it
    was restoring and then waits for it forever: the tree is our child (a sibling restore), not CRIU's, and
    we are blocked on CRIU's answer. When the daemon is gone and CRIU has not answered ``grace`` seconds
    later, stop our CRIU child; the restore then fails with the daemon's cause instead of hanging.
    """
    if session is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            if proc.alive(session.daemon_pid):
                continue
            if done.wait(grace):
                return
            for pid in proc.descendants(os.getpid())[1:]:
                try:
                    with open(f"/proc/{pid}/comm", "r", encoding="utf-8", errors="replace") as handle:
                        is_criu = handle.read().strip() == "criu"
                    if is_criu:
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
            return

    watcher = threading.Thread(target=watch, name="lazy-guard", daemon=True)
    watcher.start()
    try:
        yield
    except BaseException:
        done.set()
        for pid in proc.descendants(os.getpid())[1:]:  # reap what CRIU killed of the failed restore (our children)
            if not proc.alive(pid):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass
        raise
    finally:
        done.set()
        watcher.join(5)


def start(criu: str, images: str, work: str, timeout: float = DEFAULT_TIMEOUT, control: Optional[str] = None,
          page_server: Optional[Tuple[str, int]] = None, snapshot_id: str = "", env: Optional[Dict[str, str]] = None,
          active_dir: str = ACTIVE_DIR, tls_args: Sequence[str] = (), tidy: Sequence[str] = (),
          serve_pages: Optional[PageService] = None) -> Session:
    """Start ``criu lazy-pages`` for ``images`` in ``work`` under a supervisor; return once its socket listens.

    ``tls_args``: CRIU's TLS options (``_tls.TlsFiles.criu_args``) for the connection to ``page_server``.
    ``tidy``: directories the supervisor removes with ``work/images`` once the daemon no longer reads them (a
    verified copy of the images it serves).
    ``serve_pages``: the supervisor serves the pages itself, on a loopback port of its own, by calling it with the
    daemon's connection (it runs in the supervisor, a forked process without this one's descriptors: it must
    open what it reads); what it raises is the restore's failure.
    """
    listener: Optional[socket.socket] = None
    if serve_pages is not None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        page_server = ("127.0.0.1", int(listener.getsockname()[1]))
    argv = [criu, "lazy-pages", "-D", images, "-W", work, "-o", LOG, "-v4"]
    if page_server:
        argv += ["--page-server", "--address", page_server[0], "--port", str(page_server[1]), *tls_args]
    rfd, wfd = os.pipe()
    ready_r, ready_w = os.pipe()
    started_at = time.time()
    job = _Job(work, timeout, control, snapshot_id, active_dir, list(tidy))
    keep = (rfd, ready_w) + ((listener.fileno(),) if listener is not None else ())
    try:
        proc.detach(lambda: _supervise(argv, rfd, ready_w, job, env, listener, serve_pages), keep=keep)
    finally:
        if listener is not None:
            listener.close()
    os.close(rfd)
    os.close(ready_w)
    answer = b""
    end = time.monotonic() + START_TIMEOUT + 1
    while time.monotonic() < end:
        chunk = os.read(ready_r, 256)
        if not chunk:
            break
        answer += chunk
        if answer.endswith(b"\n"):
            break
    os.close(ready_r)
    word, _sep, rest = answer.decode("utf-8", "replace").strip().partition(" ")
    if word != "ready":
        os.close(wfd)
        raise LazyError(f"the lazy-pages daemon did not start: {rest or 'no answer from its supervisor'}",
                        log_tail(os.path.join(work, LOG)))
    return Session(work, wfd, int(rest), started_at)


PageService = Callable[[socket.socket], None]  # serves the daemon's page-server connection until it closes


@dataclass
class _Job:
    """What a supervisor watches over (its phases share it)."""

    work: str
    timeout: float
    control: Optional[str]
    snapshot_id: str
    active_dir: str
    tidy: List[str]
    placeholder_fd: int = -1    # pidfd of the placeholder the tree was restored into (-1: none)
    page_error: str = ""        # why the supervisor's own page server stopped serving ("" while it serves)


def _serve_pages(job: _Job, listener: socket.socket, serve_pages: PageService) -> None:  # pragma: no cover - forked
    """The supervisor's page server: the daemon's one connection, served; a failure cuts it (the daemon fails)."""
    listener.settimeout(job.timeout)
    try:
        conn, _peer = listener.accept()
    except OSError as exc:
        job.page_error = f"the lazy-pages daemon never asked for pages ({exc})"
        return
    finally:
        listener.close()
    try:
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each answer goes out whole, at once
        serve_pages(conn)
    except Exception as exc:  # pylint: disable=broad-exception-caught  # whatever stops serving is the cause
        job.page_error = exc.full_message() if isinstance(exc, WarmstartError) else f"{type(exc).__name__}: {exc}"
    finally:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()


def _supervise(argv: List[str], rfd: int, ready_w: int, job: _Job, env: Optional[Dict[str, str]],
               listener: Optional[socket.socket] = None,
               serve_pages: Optional[PageService] = None) -> None:  # pragma: no cover - forked
    """The supervisor (a detached child): start the daemon and say ``ready PID`` (or ``failed WHY``) on
    ``ready_w``; wait for the restore's ``pid ROOT [PLACEHOLDER]`` on ``rfd``; watch the daemon until memory is
    complete.

    Invariant: a restored tree never runs on missing memory. Whenever memory cannot be complete (restore
    aborted, daemon failed, ``timeout`` passed) the daemon is stopped, after the restored tree (and the
    placeholder it runs in) is killed.
    """
    if listener is not None and serve_pages is not None:
        threading.Thread(target=_serve_pages, args=(job, listener, serve_pages), name="pages", daemon=True).start()
    daemon = _start_daemon(job, argv, env, ready_w)
    if daemon is None:
        return
    deadline = time.monotonic() + job.timeout
    word, _sep, arg = _read_line(rfd, deadline).partition(" ")
    if word != "pid":
        # the restore failed (CRIU killed its tree) or the restoring process died: no tree of ours to watch
        _stop(daemon)
        _write_state(job.work, state="failed", error="the restore did not complete" if word == "abort"
                     else "the restoring process went away before the restore completed")
        return
    root, _sep, placeholder = arg.partition(" ")
    if placeholder:
        job.placeholder_fd = ctypes.CDLL(None, use_errno=True).syscall(_SYS_PIDFD_OPEN, int(placeholder), 0)
    _stream(job, daemon, int(root), deadline)


def _start_daemon(job: _Job, argv: List[str], env: Optional[Dict[str, str]],
                  ready_w: int) -> "Optional[subprocess.Popen[bytes]]":  # pragma: no cover - forked
    """The daemon, listening on its socket, and ``ready PID`` said; None (and ``failed WHY`` said) if not."""
    started_at = time.time()
    try:
        daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=env, close_fds=True)
    except OSError as exc:
        os.write(ready_w, f"failed cannot run {argv[0]}: {exc}\n".encode())
        return None
    _write_state(job.work, state="starting", daemon_pid=daemon.pid, supervisor_pid=os.getpid(),
                 started_at=started_at, snapshot=job.snapshot_id, timeout=job.timeout)
    sock = os.path.join(job.work, SOCKET)
    end = time.monotonic() + START_TIMEOUT
    while not os.path.exists(sock) and daemon.poll() is None and time.monotonic() < end:
        time.sleep(0.005)
    if not os.path.exists(sock) or daemon.poll() is not None:
        why = _log_error(job.work) or (f"exited with {daemon.returncode}" if daemon.poll() is not None
                                       else f"no socket within {START_TIMEOUT:.0f} s")
        _stop(daemon)
        _write_state(job.work, state="failed", error=f"lazy-pages daemon did not start: {why}")
        os.write(ready_w, f"failed {why}\n".encode())
        return None
    os.write(ready_w, f"ready {daemon.pid}\n".encode())
    os.close(ready_w)
    return daemon


def _read_line(rfd: int, deadline: float) -> str:  # pragma: no cover - forked
    """One line from ``rfd`` (stripped), or what came before EOF or ``deadline``."""
    said = b""
    while not said.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if select.select([rfd], [], [], min(left, 0.5))[0]:
            chunk = os.read(rfd, 256)
            if not chunk:
                break
            said += chunk
    return said.decode("ascii", "replace").strip()


def _stream(job: _Job, daemon: "subprocess.Popen[bytes]", root: int,
            deadline: float) -> None:  # pragma: no cover - forked
    """The restored tree runs while the daemon streams its memory in; complete, or killed (``_roll_back``)."""
    tree = proc.descendants(root)
    held = _hold_uffds(daemon.pid)
    marker = _mark_active(job, root)
    _write_state(job.work, state="streaming", pid=root, resumed_at=time.time(), held_uffds=len(held))
    try:
        rc: Optional[int] = daemon.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        rc = None
    if rc == 0:
        _close_all(held)
        _tidy(job, marker)  # before the final state: whoever sees it finds no marker and no images left
        _write_state(job.work, state="complete", complete_at=time.time())
    else:
        _roll_back(job, daemon, root, tree, held, rc, marker)


def _tidy(job: _Job, marker: str) -> None:  # pragma: no cover - forked
    """Drop the image links (or sparse pages of a remote restore), the ``tidy`` dirs and the ``active`` marker."""
    for path in [os.path.join(job.work, "images")] + job.tidy:
        shutil.rmtree(path, ignore_errors=True)
    if marker:
        try:
            os.unlink(marker)
        except OSError:
            pass


def _mark_active(job: _Job, root: int) -> str:  # pragma: no cover - forked
    """The marker ``active`` finds (``root`` is streaming, under this supervisor); "" when it cannot be written."""
    marker = os.path.join(job.active_dir, f"{root}.json")
    try:
        os.makedirs(job.active_dir, mode=0o700, exist_ok=True)
        safefs.write_file(marker, json.dumps({"work_dir": job.work, "supervisor_pid": os.getpid(),
                                              "snapshot": job.snapshot_id}).encode("utf-8"), 0o600)
    except OSError:
        return ""
    return marker


def _roll_back(job: _Job, daemon: "subprocess.Popen[bytes]", root: int, tree: List[int], held: List[int],
               rc: Optional[int], marker: str) -> None:  # pragma: no cover - forked
    """Memory will not be complete: kill the tree while its faults still block on our uffd copies, then stop
    the daemon; say why in the state and the workload's control dir."""
    for pid in proc.descendants(root) or tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if job.placeholder_fd >= 0:  # its container exits: its supervisor (the kubelet) replaces it
        ctypes.CDLL(None, use_errno=True).syscall(_SYS_PIDFD_SEND_SIGNAL, job.placeholder_fd, signal.SIGKILL, None, 0)
    _stop(daemon)
    _close_all(held)
    proc.wait_gone(root, 10)
    text = (f"lazy restore of snapshot {job.snapshot_id}: {_why(job, daemon.pid, rc)}; the restored tree "
            f"(pid {root}) was killed{' with its placeholder' if job.placeholder_fd >= 0 else ''} so that it never "
            f"runs on missing memory; log {os.path.join(job.work, LOG)}")
    if job.control and os.path.isdir(job.control):  # before the state: whoever sees "failed" finds the reason
        try:
            ctl.write(job.control, ctl.RESTORE_FAILED, f"{text}\n")
        except OSError:
            pass
    _tidy(job, marker)
    _write_state(job.work, state="failed", error=text, failed_at=time.time())


def _why(job: _Job, daemon_pid: int, rc: Optional[int]) -> str:
    if job.page_error:
        return f"a page was not served: {job.page_error}"
    if rc is None:
        return f"memory was not complete within {job.timeout:g} s (lazy_timeout)"
    if rc < 0:
        return f"the lazy-pages daemon (pid {daemon_pid}) was killed by signal {-rc} before memory was complete"
    return f"the lazy-pages daemon (pid {daemon_pid}) failed with exit code {rc}: {_log_error(job.work) or 'see its log'}"


def _close_all(fds: List[int]) -> None:
    for fd in fds:
        os.close(fd)


def _stop(daemon: "subprocess.Popen[bytes]") -> None:  # pragma: no cover - forked
    if daemon.poll() is None:
        daemon.kill()
    try:
        daemon.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _log_error(work: str) -> str:
    return _error_lines(os.path.join(work, LOG))


def _hold_uffds(pid: int) -> List[int]:  # pragma: no cover - forked
    """Duplicates of the daemon's userfault descriptors (pidfd_getfd); [] where the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return []
    held = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{name}") != "anon_inode:[userfaultfd]":
                    continue
            except OSError:
                continue
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd >= 0:
                held.append(fd)
    except OSError:
        pass
    finally:
        os.close(pidfd)
    return held
