# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Find and verify CRIU: binary lookup, version, ``criu check`` and feature probes.

Plain Python (stdlib only). A missing CRIU is a normal answer (``found: False``),
not an exception; ``CriuError`` is for callers that need CRIU to act.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

# Where node_prep installs the bundled CRIU, then the usual manual install.
DEFAULT_CANDIDATES = (
    "/opt/warmstart/criu/current/bin/criu",
    "/usr/local/bin/criu",
)
# Searched after $PATH: distro packages install criu into sbin, which a
# non-login PATH often lacks.
EXTRA_SEARCH_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")

FEATURES = (
    "uffd",
    "uffd-noncoop",
    "mem_dirty_track",
    "pidfd_store",
    "timens",
    "network_lock_nftables",
)

VERSION_TIMEOUT = 10.0
CHECK_TIMEOUT = 60.0
FEATURE_TIMEOUT = 20.0

_CHECK_GOOD = "Looks good."
_VERSION_LINE = re.compile(r"^\s*Version:\s*(\S+)", re.MULTILINE)
_GITID_LINE = re.compile(r"^\s*GitID:\s*(\S+)", re.MULTILINE)
_ANY_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)*)\b")


class CriuError(WarmstartError):
    """A CRIU operation failed. ``log_tail`` holds the end of CRIU's own log, if any."""

    def __init__(self, message: str, log_tail: Optional[str] = None) -> None:
        super().__init__(message, log_tail=log_tail)


@dataclass(frozen=True)
class RunResult:
    rc: int
    output: str  # stdout and stderr together: CRIU reports on stderr


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    output: str


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_criu(
    explicit: Optional[str] = None,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    search_path: Optional[str] = None,
) -> Optional[str]:
    """Return the CRIU binary to use, or None when there is none.

    Order: ``explicit`` -> ``candidates`` -> ``search_path`` (default: $PATH
    plus the sbin directories). An ``explicit`` path that is not an executable
    file raises CriuError: the caller asked for that binary, so silently
    using another one would hide a mistake.
    """
    if explicit:
        if not _is_executable(explicit):
            raise CriuError(f"criu_path {explicit!r} is not an executable file")
        return explicit
    for candidate in candidates:
        if _is_executable(candidate):
            return candidate
    if search_path is None:
        dirs = os.environ.get("PATH", os.defpath).split(os.pathsep)
        dirs += [d for d in EXTRA_SEARCH_DIRS if d not in dirs]
        search_path = os.pathsep.join(dirs)
    return shutil.which("criu", path=search_path)


def run_criu(criu: str, args: Iterable[str], timeout: float) -> RunResult:
    """Run ``criu ARGS``; return rc and combined output. Raises CriuError on timeout or exec failure."""
    argv: List[str] = [criu, *args]
    env = dict(os.environ, LC_ALL="C")
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        tail = _decode(exc.output) if exc.output else None
        raise CriuError(f"'{' '.join(argv)}' did not finish within {timeout:g}s", log_tail=tail) from exc
    except OSError as exc:
        raise CriuError(f"cannot run {criu!r}: {exc.strerror or exc}") from exc
    return RunResult(rc=proc.returncode, output=_decode(proc.stdout))


def _decode(data: Any) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return str(data or "")


def parse_version_output(text: str) -> Dict[str, Optional[str]]:
    """Parse ``criu --version``: ``{"version": "4.2.1", "gitid": "v4.2-3-gabc" or None}``."""
    version_match = _VERSION_LINE.search(text) or _ANY_VERSION.search(text)
    gitid_match = _GITID_LINE.search(text)
    return {
        "version": version_match.group(1) if version_match else None,
        "gitid": gitid_match.group(1) if gitid_match else None,
    }


def criu_version(criu: str, timeout: float = VERSION_TIMEOUT) -> Dict[str, Optional[str]]:
    """Version and GitID of ``criu``. Raises CriuError when it cannot be determined."""
    result = run_criu(criu, ["--version"], timeout)
    parsed = parse_version_output(result.output)
    if result.rc != 0 or parsed["version"] is None:
        raise CriuError(
            f"'{criu} --version' failed (rc={result.rc}): {result.output.strip() or 'no output'}",
            log_tail=result.output or None,
        )
    return parsed


def criu_check(criu: str, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Run ``criu check``. ok only on rc 0 and "Looks good."; output is CRIU's own text."""
    try:
        result = run_criu(criu, ["check"], timeout)
    except CriuError as exc:
        return CheckResult(ok=False, output=str(exc) + (f"\n{exc.log_tail}" if exc.log_tail else ""))
    output = result.output.strip()
    ok = result.rc == 0 and _CHECK_GOOD in output
    if result.rc != 0 and not output:
        output = f"criu check failed with rc={result.rc} and no output"
    return CheckResult(ok=ok, output=output)


def probe_feature(criu: str, feature: str, timeout: float = FEATURE_TIMEOUT) -> bool:
    """``criu check --feature NAME`` exits 0 when the feature is usable."""
    try:
        return run_criu(criu, ["check", "--feature", feature], timeout).rc == 0
    except CriuError:
        return False


def probe_features(
    criu: str, features: Sequence[str] = FEATURES, timeout: float = FEATURE_TIMEOUT
) -> Dict[str, bool]:
    return {name: probe_feature(criu, name, timeout) for name in features}


def criu_info(
    explicit: Optional[str] = None,
    features: bool = True,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    search_path: Optional[str] = None,
) -> Dict[str, Any]:
    """Everything node_info reports about CRIU, as a plain dict.

    Raises CriuError only for an ``explicit`` path that is not executable.
    """
    path = find_criu(explicit, candidates, search_path)
    info: Dict[str, Any] = {
        "found": path is not None,
        "path": path,
        "version": None,
        "gitid": None,
        "check_ok": False,
        "check_output": "",
        "features": {name: False for name in FEATURES} if features else {},
    }
    if path is None:
        info["check_output"] = f"criu not found (looked in {', '.join(candidates)} and on PATH)"
        return info
    try:
        info.update(criu_version(path))
    except CriuError as exc:
        info["check_output"] = str(exc)
        return info
    check = criu_check(path)
    info["check_ok"] = check.ok
    info["check_output"] = check.output
    if features:
        info["features"] = probe_features(path)
    return info
