"""Node facts (_node) from fake /proc and /etc files."""
from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import FEATURES, CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._node import (
    CpuInfo,
    cgroup_version,
    cgroup_version_from_mounts,
    collect,
    container_runtimes,
    describe_node,
    disk_space,
    fingerprint,
    flags_hash,
    kernel_facts,
    make_description,
    parse_cpuinfo,
    parse_mounts,
    parse_os_release,
    read_cpuinfo,
    read_os_release,
    tool_version,
)

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: sse2 fpu avx512f avx2 sse2 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu only_on_cpu1

"""

ARM64_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0

processor\t: 1
BogoMIPS\t: 2000.00
Features\t: fp
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""

S390X_CPUINFO = """\
vendor_id       : IBM/S390
# processors    : 2
bogomips per cpu: 3241.00
features\t: esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx
facilities      : 0 1 2 3

processor 0: version = FF,  identification = 0133E8,  machine = 3906
"""

UNIFIED_MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0
"""

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
"""

LEGACY_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
"""

UBUNTU_OS_RELEASE = """\
# comment
PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
ID=ubuntu
ID_LIKE=debian

BROKEN LINE
"""


def make_root(tmp_path: Path, cpuinfo: str = X86_CPUINFO, mounts: str = UNIFIED_MOUNTS,
              os_release: str = UBUNTU_OS_RELEASE) -> Path:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "proc/cpuinfo").write_text(cpuinfo)
    (root / "proc/mounts").write_text(mounts)
    (root / "etc/os-release").write_text(os_release)
    return root


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


# --- kernel ---------------------------------------------------------------


def test_kernel_facts() -> None:
    assert kernel_facts("6.18.44-fc-v1045") == {"release": "6.18.44-fc-v1045", "ok": True, "min": "5.12"}
    assert kernel_facts("5.11.0-27-generic", "5.12")["ok"] is False
    assert kernel_facts("6.1.0", "6.1")["ok"] is True
    assert kernel_facts("weird", "5.12")["ok"] is False


# --- CPU ------------------------------------------------------------------


def test_x86_cpuinfo_uses_first_processor() -> None:
    cpu = parse_cpuinfo(X86_CPUINFO)
    assert cpu.vendor == "GenuineIntel"
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu.flags == ["amx_tile", "avx2", "avx512f", "fpu", "sse2"]  # sorted, de-duplicated
    assert cpu.flags_hash == hashlib.sha256(b"amx_tile avx2 avx512f fpu sse2").hexdigest()


def test_arm64_cpuinfo_features_and_implementer() -> None:
    cpu = parse_cpuinfo(ARM64_CPUINFO)
    assert cpu.vendor == "ARM"
    assert cpu.model == "ARM part 0xd4f"
    assert cpu.flags == sorted("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve".split())
    assert cpu.flags_hash == flags_hash(cpu.flags)


def test_arm64_unknown_implementer_is_kept_raw() -> None:
    cpu = parse_cpuinfo(ARM64_CPUINFO.replace("0x41", "0x99"))
    assert cpu.vendor == "0x99"
    assert cpu.model == "0x99 part 0xd4f"


def test_s390x_cpuinfo() -> None:
    cpu = parse_cpuinfo(S390X_CPUINFO)
    assert cpu.vendor == "IBM/S390"
    assert "zarch" in cpu.flags and cpu.flags == sorted(cpu.flags)


def test_empty_or_missing_cpuinfo(tmp_path: Path) -> None:
    empty = parse_cpuinfo("")
    assert (empty.vendor, empty.model, empty.flags) == (None, None, [])
    assert empty.flags_hash == hashlib.sha256(b"").hexdigest()
    assert read_cpuinfo(tmp_path / "missing") == empty


def test_flags_hash_ignores_order_and_duplicates() -> None:
    assert flags_hash(["b", "a", "a"]) == flags_hash(["a", "b"]) == hashlib.sha256(b"a b").hexdigest()
    assert flags_hash(["a"]) != flags_hash(["a", "b"])


def test_read_cpuinfo_from_file(tmp_path: Path) -> None:
    root = make_root(tmp_path, cpuinfo=ARM64_CPUINFO)
    assert read_cpuinfo(root / "proc/cpuinfo").vendor == "ARM"


# --- cgroup ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mounts", "expected"),
    [
        (UNIFIED_MOUNTS, 2),
        (HYBRID_MOUNTS, "hybrid"),
        (LEGACY_MOUNTS, 1),
        ("proc /proc proc rw 0 0\n", None),
        ("", None),
        # cgroup2 mounted elsewhere only (no /sys/fs/cgroup mount)
        ("cgroup2 /run/cg cgroup2 rw 0 0\n", 2),
        # the last mount on /sys/fs/cgroup wins: tmpfs over-mounted by cgroup2
        (LEGACY_MOUNTS + "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", 2),
    ],
)
def test_cgroup_version(tmp_path: Path, mounts: str, expected: Any) -> None:
    (tmp_path / "mounts").write_text(mounts)
    assert cgroup_version(tmp_path / "mounts") == expected


def test_cgroup_version_missing_mounts_file(tmp_path: Path) -> None:
    assert cgroup_version(tmp_path / "missing") is None


def test_parse_mounts_unescapes_paths() -> None:
    mounts = parse_mounts("cgroup2 /sys/fs/my\\040cgroup cgroup2 rw 0 0\nshort line\n")
    assert mounts == [{"source": "cgroup2", "mountpoint": "/sys/fs/my cgroup", "fstype": "cgroup2", "options": "rw"}]
    assert cgroup_version_from_mounts(mounts, "/sys/fs/my cgroup") == 2


# --- runtimes -------------------------------------------------------------


def test_container_runtimes_from_fake_path(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    write_script(bindir / "podman", "echo 'podman version 5.2.1'\n")
    write_script(bindir / "docker", "echo 'Docker version 27.3.1, build ce12230'\n")
    write_script(bindir / "crictl", "echo 'crictl version v1.31.1'\n")
    write_script(bindir / "runc", "echo 'runc: broken' >&2; exit 1\n")
    write_script(bindir / "crun", "echo 'no numbers here'\n")
    (bindir / "crio").write_text("not executable")

    found = container_runtimes(search_path=str(bindir))
    assert found == [
        {"name": "podman", "path": str(bindir / "podman"), "version": "5.2.1"},
        {"name": "docker", "path": str(bindir / "docker"), "version": "27.3.1"},
        {"name": "crictl", "path": str(bindir / "crictl"), "version": "1.31.1"},
        {"name": "runc", "path": str(bindir / "runc"), "version": None},
        {"name": "crun", "path": str(bindir / "crun"), "version": None},
    ]
    assert container_runtimes(search_path=str(bindir), versions=False)[0]["version"] is None
    assert container_runtimes(search_path=str(tmp_path / "empty")) == []


def test_tool_version_timeout_and_missing(tmp_path: Path) -> None:
    slow = write_script(tmp_path / "slow", "sleep 5\necho 'slow version 1.0'\n")
    assert tool_version(str(slow), timeout=0.3) is None
    assert tool_version(str(tmp_path / "absent")) is None
    multi = write_script(tmp_path / "crio", "echo 'crio version'\necho 'Version:        1.31.0'\n")
    assert tool_version(str(multi)) == "1.31.0"


# --- storage --------------------------------------------------------------


def test_disk_space_existing(tmp_path: Path) -> None:
    space = disk_space(str(tmp_path))
    st = os.statvfs(tmp_path)
    assert space["exists"] is True
    assert space["path"] == space["measured_path"] == str(tmp_path)
    assert space["total_bytes"] == st.f_blocks * st.f_frsize
    assert 0 <= space["free_bytes"] <= space["total_bytes"]


def test_disk_space_missing_path_measures_nearest_parent(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet" / "there"
    space = disk_space(str(missing))
    assert space["exists"] is False
    assert space["path"] == str(missing)
    assert space["measured_path"] == str(tmp_path)
    assert space["total_bytes"] > 0


# --- OS -------------------------------------------------------------------


def test_parse_os_release() -> None:
    assert parse_os_release(UBUNTU_OS_RELEASE) == {
        "id": "ubuntu",
        "id_like": "debian",
        "version_id": "24.04",
        "name": "Ubuntu",
        "pretty_name": "Ubuntu 24.04.1 LTS",
    }


def test_parse_os_release_odd_quoting() -> None:
    info = parse_os_release("ID='rhel'\nNAME=\"Red Hat \\\"Enterprise\\\" Linux\"\nVERSION_ID=\"9.4\n")
    assert info["id"] == "rhel"
    assert info["name"] == 'Red Hat "Enterprise" Linux'
    assert info["version_id"] == "9.4"  # unbalanced quote: stripped, not fatal
    assert info["pretty_name"] is None


def test_read_os_release_falls_back_to_usr_lib(tmp_path: Path) -> None:
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_text("ID=fedora\nVERSION_ID=41\n")
    assert read_os_release(tmp_path)["id"] == "fedora"
    assert read_os_release(tmp_path / "nothing") == parse_os_release("")


# --- fingerprint and collect ----------------------------------------------


def fake_criu(tmp_path: Path) -> Path:
    return write_script(
        tmp_path / "criu-bin" / "criu",
        'case "$1" in\n'
        "  --version) echo 'Version: 4.2.1' ;;\n"
        '  check) [ "$2" = "--feature" ] && exit 1; echo "Looks good." >&2 ;;\n'
        "esac\n",
    )


def test_make_description_and_its_fingerprint() -> None:
    cpu = CpuInfo(vendor="AuthenticAMD", model="AMD EPYC", flags=["a"], flags_hash=flags_hash(["a"]))
    desc = make_description("x86_64", "6.8.0", cpu, "4.2.1", {"id": "debian", "version_id": "12"}, "node-a")
    assert fingerprint(desc) == {
        "arch": "x86_64",
        "kernel": "6.8.0",
        "cpu_vendor": "AuthenticAMD",
        "cpu_model": "AMD EPYC",
        "cpu_flags_hash": flags_hash(["a"]),
        "criu_version": "4.2.1",
        "os_id": "debian",
        "os_version_id": "12",
    }
    assert desc == dict(fingerprint(desc), hostname="node-a", cpu_flags=["a"])


def test_describe_node_from_fake_root(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    fp = describe_node(criu_path=str(fake_criu(tmp_path)), root=root)
    assert fp["hostname"] == socket.gethostname()
    assert fp["arch"] == os.uname().machine
    assert fp["kernel"] == os.uname().release
    assert fp["cpu_vendor"] == "GenuineIntel"
    assert fp["cpu_flags"] == list(parse_cpuinfo(X86_CPUINFO).flags)
    assert fp["cpu_flags_hash"] == parse_cpuinfo(X86_CPUINFO).flags_hash
    assert fp["criu_version"] == "4.2.1"
    assert (fp["os_id"], fp["os_version_id"]) == ("ubuntu", "24.04")


class NoGpuNvml:
    def nvmlInit(self) -> None:
        raise RuntimeError("Driver Not Loaded")


def test_collect_from_fake_root(tmp_path: Path) -> None:
    root = make_root(tmp_path, mounts=HYBRID_MOUNTS)
    criu = fake_criu(tmp_path)
    node: Dict[str, Any] = collect(
        snapshot_root=str(tmp_path / "store"),
        criu_path=str(criu),
        kernel_min_version="99.0",
        root=root,
        nvml=NoGpuNvml(),
    )
    assert set(node) == {
        "hostname", "kernel", "arch", "cpu", "criu", "cgroup_version", "runtimes",
        "gpus", "gpu_reason", "npus", "npu_driver_version", "npu_reason", "snapshot_root", "os", "fingerprint",
    }
    assert node["kernel"] == {"release": os.uname().release, "ok": False, "min": "99.0"}
    assert node["arch"] == os.uname().machine
    assert node["cpu"]["vendor"] == "GenuineIntel"
    assert node["cpu"]["flags"] == ["amx_tile", "avx2", "avx512f", "fpu", "sse2"]
    assert node["criu"]["path"] == str(criu)
    assert node["criu"]["check_ok"] is True
    assert node["criu"]["features"] == {name: False for name in FEATURES}
    assert node["cgroup_version"] == "hybrid"
    assert node["gpus"] == [] and node["gpu_reason"] == "NVML unavailable: Driver Not Loaded"
    assert node["snapshot_root"]["exists"] is False
    assert node["snapshot_root"]["measured_path"] == str(tmp_path)
    assert node["os"]["id"] == "ubuntu"
    assert node["fingerprint"]["criu_version"] == "4.2.1"
    assert node["fingerprint"]["cpu_flags_hash"] == node["cpu"]["flags_hash"]


def test_collect_skips_feature_probes(tmp_path: Path) -> None:
    node = collect(criu_path=str(fake_criu(tmp_path)), probe_features=False, root=make_root(tmp_path),
                   nvml=NoGpuNvml(), snapshot_root=str(tmp_path))
    assert node["criu"]["features"] == {}
    assert node["snapshot_root"]["exists"] is True


def test_collect_reports_ascend_npus_from_the_root(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    (root / "dev").mkdir(exist_ok=True)
    for name in ("davinci0", "davinci1", "davinci_manager"):
        (root / "dev" / name).write_text("")
    version = root / "usr/local/Ascend/driver/version.info"
    version.parent.mkdir(parents=True)
    version.write_text("Version=24.1.rc2\n")
    node = collect(criu_path=str(fake_criu(tmp_path)), probe_features=False, root=root, nvml=NoGpuNvml(),
                   snapshot_root=str(tmp_path))
    assert node["npus"] == [{"index": 0, "path": "/dev/davinci0"}, {"index": 1, "path": "/dev/davinci1"}]
    assert node["npu_driver_version"] == "24.1.rc2"
    assert node["npu_reason"] is None


def test_collect_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kernel_min_version: not a version string: 'latest'"):
        collect(kernel_min_version="latest", root=make_root(tmp_path))
    with pytest.raises(CriuError, match="is not an executable file"):
        collect(criu_path=str(tmp_path / "nope"), root=tmp_path, nvml=NoGpuNvml())
