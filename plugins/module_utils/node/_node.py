# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Node facts: kernel, arch, CPU, cgroup, container runtimes, store space, OS.

Plain Python (stdlib only). File locations hang off ``root`` (default "/") so
tests can feed fake /proc/cpuinfo, /proc/mounts and /etc/os-release.
``collect()`` is the single entry point of the node_info module;
``describe_node()`` is the node description a snapshot records and a restore compares
(``_compat.incompatibilities``); node_info shows its ``fingerprint()``.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._ascend import npu_inventory
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import criu_info, criu_version, find_criu
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpu import gpu_inventory
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._version import parse_version, version_at_least

DEFAULT_KERNEL_MIN = "5.12"
DEFAULT_SNAPSHOT_ROOT = _paths.STATE_DIR
CGROUP_ROOT = "/sys/fs/cgroup"
RUNTIMES = ("podman", "docker", "containerd", "ctr", "crictl", "runc", "crun", "crio")
RUNTIME_VERSION_TIMEOUT = 5.0

# /proc/cpuinfo "CPU implementer" on arm64 -> vendor.
ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x43": "Cavium",
    "0x46": "Fujitsu",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x50": "APM",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0x6d": "Microsoft",
    "0xc0": "Ampere",
}

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
_TOOL_VERSION = re.compile(r"\bv?(\d+(?:\.\d+)+[^\s,]*)")

CgroupVersion = Union[int, str, None]


@dataclass(frozen=True)
class CpuInfo:
    vendor: Optional[str] = None
    model: Optional[str] = None
    flags: List[str] = field(default_factory=list)
    flags_hash: str = ""


def flags_hash(flags: Iterable[str]) -> str:
    """sha256 hex of the sorted, de-duplicated, space-joined CPU flags."""
    return hashlib.sha256(" ".join(sorted(set(flags))).encode("ascii", "replace")).hexdigest()


def _read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


# --- kernel ---------------------------------------------------------------


def kernel_facts(release: str, minimum: str = DEFAULT_KERNEL_MIN) -> Dict[str, Any]:
    """``{"release", "ok", "min"}``; ok is False when the release cannot be parsed."""
    try:
        ok = version_at_least(release, minimum)
    except ValueError:
        ok = False
    return {"release": release, "ok": ok, "min": minimum}


# --- CPU ------------------------------------------------------------------


def _cpuinfo_blocks(text: str) -> List[Dict[str, str]]:
    blocks: List[Dict[str, str]] = []
    current: Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current.setdefault(key.strip().lower(), value.strip())
    if current:
        blocks.append(current)
    return blocks


def parse_cpuinfo(text: str) -> CpuInfo:
    """First processor of /proc/cpuinfo: x86 (flags), arm64 (Features), s390x (features)."""
    blocks = _cpuinfo_blocks(text)
    if not blocks:
        return CpuInfo(flags_hash=flags_hash([]))
    block = next((b for b in blocks if "flags" in b or "features" in b), blocks[0])
    flags = sorted(set((block.get("flags") or block.get("features") or "").split()))

    vendor = block.get("vendor_id")
    implementer = block.get("cpu implementer")
    if vendor is None and implementer:
        vendor = ARM_IMPLEMENTERS.get(implementer.lower(), implementer)

    model = block.get("model name") or block.get("cpu")  # "cpu": ppc64le
    if model is None and block.get("cpu part"):
        model = f"{vendor or 'unknown'} part {block['cpu part']}"
    return CpuInfo(vendor=vendor, model=model, flags=flags, flags_hash=flags_hash(flags))


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    return parse_cpuinfo(_read_text(path) or "")


# --- cgroup ---------------------------------------------------------------


def _unescape_mount_field(value: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), value)


def parse_mounts(text: str) -> List[Dict[str, str]]:
    """/proc/mounts lines -> ``[{"source", "mountpoint", "fstype", "options"}]``."""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mounts.append(
            {
                "source": _unescape_mount_field(parts[0]),
                "mountpoint": _unescape_mount_field(parts[1]),
                "fstype": parts[2],
                "options": parts[3],
            }
        )
    return mounts


def cgroup_version_from_mounts(mounts: Sequence[Dict[str, str]], cgroup_root: str = CGROUP_ROOT) -> CgroupVersion:
    """2 (unified), 1 (legacy), "hybrid" (v1 controllers + cgroup2), None (no cgroup mounted)."""
    at_root = [m["fstype"] for m in mounts if m["mountpoint"] == cgroup_root]
    if at_root and at_root[-1] == "cgroup2":  # the last mount on a path is the visible one
        return 2
    has_v1 = any(m["fstype"] == "cgroup" for m in mounts)
    has_v2 = any(m["fstype"] == "cgroup2" for m in mounts)
    if has_v1 and has_v2:
        return "hybrid"
    if has_v1:
        return 1
    if has_v2:
        return 2
    return None


def cgroup_version(mounts_path: Path = Path("/proc/mounts"), cgroup_root: str = CGROUP_ROOT) -> CgroupVersion:
    return cgroup_version_from_mounts(parse_mounts(_read_text(mounts_path) or ""), cgroup_root)


# --- container runtimes ---------------------------------------------------


def tool_version(path: str, timeout: float = RUNTIME_VERSION_TIMEOUT) -> Optional[str]:
    """Version number from ``<tool> --version``, or None if it fails or says nothing usable."""
    try:
        proc = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            env=dict(os.environ, LC_ALL="C"),
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    match = _TOOL_VERSION.search(proc.stdout.decode("utf-8", errors="replace"))
    return match.group(1) if match else None


def container_runtimes(
    names: Sequence[str] = RUNTIMES, search_path: Optional[str] = None, versions: bool = True
) -> List[Dict[str, Optional[str]]]:
    """``[{"name", "path", "version"}]`` for each runtime tool found on PATH."""
    found = []
    for name in names:
        path = shutil.which(name, path=search_path)
        if path:
            found.append({"name": name, "path": path, "version": tool_version(path) if versions else None})
    return found


# --- storage --------------------------------------------------------------


def disk_space(path: str) -> Dict[str, Any]:
    """Free/total bytes of the filesystem that holds (or would hold) ``path``.

    When ``path`` does not exist yet, the nearest existing parent is measured
    (``measured_path``) and ``exists`` is False.
    """
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    free: Optional[int] = None
    total: Optional[int] = None
    try:
        st = os.statvfs(probe)
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        pass
    return {
        "path": path,
        "exists": os.path.exists(path),
        "measured_path": probe,
        "free_bytes": free,
        "total_bytes": total,
    }


# --- OS -------------------------------------------------------------------

_OS_KEYS = ("ID", "ID_LIKE", "VERSION_ID", "NAME", "PRETTY_NAME")


def parse_os_release(text: str) -> Dict[str, Optional[str]]:
    """os-release text -> ``{"id", "id_like", "version_id", "name", "pretty_name"}`` (missing = None)."""
    values: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, raw = line.split("=", 1)
        try:
            words = shlex.split(raw)
            value = words[0] if len(words) == 1 else " ".join(words)
        except ValueError:
            value = raw.strip("\"'")
        values[key.strip()] = value
    return {key.lower(): values.get(key) for key in _OS_KEYS}


def read_os_release(root: Path = Path("/")) -> Dict[str, Optional[str]]:
    for candidate in (root / "etc/os-release", root / "usr/lib/os-release"):
        text = _read_text(candidate)
        if text is not None:
            return parse_os_release(text)
    return parse_os_release("")


# --- the node description ---------------------------------------------------


def make_description(
    arch: str, kernel: str, cpu: CpuInfo, criu_version_str: Optional[str], os_info: Dict[str, Optional[str]],
    hostname: Optional[str] = None,
) -> Dict[str, Any]:
    """The one description of a node: what a snapshot records about its source and what a restore target offers.

    ``_compat.incompatibilities`` compares two of them; node_info's ``fingerprint`` is ``fingerprint(it)``.
    """
    return {
        "hostname": hostname,
        "arch": arch,
        "kernel": kernel,
        "cpu_vendor": cpu.vendor,
        "cpu_model": cpu.model,
        "cpu_flags": list(cpu.flags),
        "cpu_flags_hash": cpu.flags_hash,
        "criu_version": criu_version_str,
        "os_id": os_info.get("id"),
        "os_version_id": os_info.get("version_id"),
    }


def fingerprint(description: Dict[str, Any]) -> Dict[str, Any]:
    """A description without what differs between identical nodes (hostname) or is long (the CPU flags: their hash
    stays)."""
    return {k: v for k, v in description.items() if k not in ("hostname", "cpu_flags")}


def describe_node(criu_path: Optional[str] = None, root: Path = Path("/")) -> Dict[str, Any]:
    """This node's description (cheap: no ``criu check``).

    ``criu_version`` is None when no CRIU is installed; raises CriuError when
    ``criu_path`` is not executable or CRIU cannot report its version.
    """
    uname = os.uname()
    path = find_criu(criu_path)
    version = criu_version(path)["version"] if path else None
    return make_description(uname.machine, uname.release, read_cpuinfo(root / "proc/cpuinfo"), version,
                            read_os_release(root), socket.gethostname())


# --- everything -----------------------------------------------------------


def collect(
    snapshot_root: str = DEFAULT_SNAPSHOT_ROOT,
    criu_path: Optional[str] = None,
    kernel_min_version: str = DEFAULT_KERNEL_MIN,
    probe_features: bool = True,
    root: Path = Path("/"),
    nvml: Optional[Any] = None,
) -> Dict[str, Any]:
    """All node facts as one JSON-ready dict (the ``node`` result of node_info).

    Raises ValueError for an unparseable ``kernel_min_version`` and CriuError
    for a ``criu_path`` that is not executable; everything else that is
    missing on the node is reported, not raised.
    """
    try:
        parse_version(kernel_min_version)
    except ValueError as exc:
        raise ValueError(f"kernel_min_version: {exc}") from exc
    uname = os.uname()
    cpu = read_cpuinfo(root / "proc/cpuinfo")
    os_info = read_os_release(root)
    criu = criu_info(criu_path, features=probe_features)
    gpus, gpu_reason = gpu_inventory(nvml)
    npus, npu_facts = npu_inventory(root)
    return {
        "hostname": socket.gethostname(),
        "kernel": kernel_facts(uname.release, kernel_min_version),
        "arch": uname.machine,
        "cpu": asdict(cpu),
        "criu": criu,
        "cgroup_version": cgroup_version(root / "proc/mounts"),
        "runtimes": container_runtimes(),
        "gpus": gpus,
        "gpu_reason": gpu_reason,
        "npus": npus,
        "npu_driver_version": npu_facts["driver_version"],
        "npu_reason": npu_facts["reason"],
        "snapshot_root": disk_space(snapshot_root),
        "os": os_info,
        "fingerprint": fingerprint(make_description(uname.machine, uname.release, cpu, criu["version"], os_info)),
    }
