#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: node_info
short_description: Report whether a node can checkpoint and restore with CRIU
version_added: 0.1.0
description:
  - Gathers the facts that decide whether this node can take and restore warmstart snapshots.
  - Kernel release checked against a minimum, architecture, CPU vendor, model and flags (with a hash),
    CRIU location and version, the C(criu check) verdict and CRIU feature probes, cgroup version,
    container runtimes, NVIDIA GPUs through NVML, free space under the snapshot root, and the OS release.
  - Also returns a compact RV(node.fingerprint) that snapshots record and restores are checked against.
  - Read-only; never changes the node. Results are returned as RV(node) (register the task; an C(_info) module sets no host facts).
  - A missing CRIU, missing NVML bindings or a node without GPUs are reported in the result, not as failures.
author:
  - warmstart developers (!UNKNOWN)
requirements:
  - Python module C(pynvml) (package C(nvidia-ml-py)) on the node, only for the GPU inventory.
notes:
  - C(criu check) needs root. Without privilege escalation (C(become)) RV(node.criu.check_ok) is false
    and RV(node.criu.check_output) says why.
  - Each container runtime found is asked for C(--version) with a five second limit.
extends_documentation_fragment:
  - warmstart.snapshot.attributes.info
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes
options:
  snapshot_root:
    description:
      - Directory that holds (or will hold) local snapshots; its filesystem's free and total space is reported.
      - If it does not exist yet, the nearest existing parent directory is measured.
    type: path
    default: /var/lib/warmstart
  criu_path:
    description:
      - CRIU binary to use.
      - If not set, V(/opt/warmstart/criu/current/bin/criu), then V(/usr/local/bin/criu), then C(PATH)
        (plus the sbin directories) are tried.
      - When set to a path that is not an executable file, the module fails.
    type: path
  kernel_min_version:
    description:
      - Lowest kernel release that RV(node.kernel.ok) accepts. Only the leading numeric part is compared.
    type: str
    default: "5.12"
  probe_features:
    description:
      - Probe CRIU features with C(criu check --feature NAME) (uffd, uffd-noncoop, mem_dirty_track,
        pidfd_store, timens, network_lock_nftables).
      - If V(false), RV(node.criu.features) is empty.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Gather warmstart node facts
  become: true
  warmstart.snapshot.node_info:
  register: result

- name: Refuse nodes that cannot checkpoint
  ansible.builtin.assert:
    that:
      - result.node.kernel.ok
      - result.node.criu.check_ok
    fail_msg: "{{ result.node.criu.check_output }}"

- name: Use a CRIU build outside the usual places and skip the feature probes
  become: true
  warmstart.snapshot.node_info:
    criu_path: /opt/criu-4.2.1/bin/criu
    probe_features: false
    snapshot_root: /mnt/nfs/warmstart

- name: Read the node, CRIU's features probed
  become: true
  warmstart.snapshot.node_info:
  register: node

- name: Pre-dump needs soft-dirty tracking
  ansible.builtin.debug:
    msg: Iterative pre-dump is not available on {{ inventory_hostname }}
  when: not node.node.criu.features.mem_dirty_track
"""

RETURN = r"""
node:
  description: Facts about the node.
  returned: always
  type: dict
  contains:
    hostname:
      description: Host name of the node.
      returned: always
      type: str
      sample: gpu-node-01
    kernel:
      description: Running kernel and whether it meets O(kernel_min_version).
      returned: always
      type: dict
      contains:
        release:
          description: Kernel release (C(uname -r)).
          returned: always
          type: str
          sample: 6.8.0-45-generic
        ok:
          description: Whether RV(node.kernel.release) is at least O(kernel_min_version).
          returned: always
          type: bool
          sample: true
        min:
          description: The minimum that was applied (O(kernel_min_version)).
          returned: always
          type: str
          sample: "5.12"
    arch:
      description: Machine architecture (C(uname -m)).
      returned: always
      type: str
      sample: x86_64
    cpu:
      description: CPU of the first processor in C(/proc/cpuinfo).
      returned: always
      type: dict
      contains:
        vendor:
          description: C(vendor_id) on x86, the implementer name on arm64; null if unknown.
          returned: always
          type: str
          sample: AuthenticAMD
        model:
          description: C(model name) on x86, C(<vendor> part <part>) on arm64; null if unknown.
          returned: always
          type: str
          sample: AMD EPYC 7763 64-Core Processor
        flags:
          description: Sorted CPU flags (C(flags) on x86, C(Features) on arm64).
          returned: always
          type: list
          elements: str
          sample: [avx, avx2, sse4_2]
        flags_hash:
          description: SHA-256 (hex) of the sorted flags joined by single spaces.
          returned: always
          type: str
          sample: 3b9c5e9c0b6a4f2e8d1f7a6c5b4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e
    criu:
      description: CRIU found on the node.
      returned: always
      type: dict
      contains:
        found:
          description: Whether a CRIU binary was found.
          returned: always
          type: bool
          sample: true
        path:
          description: Path of the CRIU binary; null if none was found.
          returned: always
          type: str
          sample: /opt/warmstart/criu/current/bin/criu
        version:
          description: CRIU version from C(criu --version); null if unknown.
          returned: always
          type: str
          sample: 4.2.1
        gitid:
          description: C(GitID) line of C(criu --version) for builds from git; null otherwise.
          returned: always
          type: str
          sample: v4.2-15-g1a2b3c4
        check_ok:
          description: Whether C(criu check) exited 0 and said C(Looks good.).
          returned: always
          type: bool
          sample: true
        check_output:
          description: What C(criu check) printed (or why it could not run), in CRIU's own words.
          returned: always
          type: str
          sample: Looks good.
        features:
          description:
            - Result of C(criu check --feature NAME) per feature; all false when CRIU was not found.
            - Empty when O(probe_features=false).
          returned: always
          type: dict
          sample:
            uffd: true
            uffd-noncoop: true
            mem_dirty_track: false
            pidfd_store: true
            timens: true
            network_lock_nftables: true
    cgroup_version:
      description: V(2) (unified), V(1) (legacy), V(hybrid) (v1 controllers with a cgroup2 mount) or null if none is mounted.
      returned: always
      type: raw
      sample: 2
    runtimes:
      description: Container runtime tools found on C(PATH) (podman, docker, containerd, ctr, crictl, runc, crun, crio).
      returned: always
      type: list
      elements: dict
      contains:
        name:
          description: Tool name.
          returned: always
          type: str
          sample: podman
        path:
          description: Full path of the tool.
          returned: always
          type: str
          sample: /usr/bin/podman
        version:
          description: Version number from C(<tool> --version); null if it failed.
          returned: always
          type: str
          sample: 4.9.3
    gpus:
      description: NVIDIA GPUs seen by NVML; empty when there are none or NVML is unavailable (see RV(node.gpu_reason)).
      returned: always
      type: list
      elements: dict
      contains:
        index:
          description: NVML device index.
          returned: always
          type: int
          sample: 0
        uuid:
          description: GPU UUID.
          returned: always
          type: str
          sample: GPU-5f2e1c7a-1b2c-3d4e-5f60-718293a4b5c6
        name:
          description: Product name.
          returned: always
          type: str
          sample: NVIDIA H100 80GB HBM3
        memory_total:
          description: Device memory in bytes.
          returned: always
          type: int
          sample: 85520809984
        driver_version:
          description: NVIDIA driver version.
          returned: always
          type: str
          sample: 580.65.06
        cuda_driver_version:
          description: Highest CUDA version the driver supports.
          returned: always
          type: str
          sample: "13.0"
        cuda_checkpoint_api:
          description: Whether C(libcuda.so.1) exports the CUDA checkpoint API (C(cuCheckpointProcessLock)).
          returned: always
          type: bool
          sample: true
    gpu_reason:
      description: Why RV(node.gpus) is empty; null when NVML answered.
      returned: always
      type: str
      sample: "NVML unavailable: NVML Shared Library Not Found"
    npus:
      description:
        - Huawei Ascend NPUs seen as device nodes C(/dev/davinci<N>), without loading any Ascend library; empty when
          there are none (see RV(node.npu_reason)).
      returned: always
      type: list
      elements: dict
      contains:
        index:
          description: The N of C(/dev/davinci<N>).
          returned: always
          type: int
        path:
          description: The device node.
          returned: always
          type: str
      sample: [{index: 0, path: /dev/davinci0}]
    npu_driver_version:
      description: C(Version=) of the Ascend driver's C(/usr/local/Ascend/driver/version.info); null when absent.
      returned: always
      type: str
      sample: 24.1.rc2
    npu_reason:
      description: Why RV(node.npus) is empty or RV(node.npu_driver_version) null; null when both were found.
      returned: always
      type: str
      sample: "no /dev/davinci<N> device nodes; no Ascend driver version file (/usr/local/Ascend/driver/version.info)"
    snapshot_root:
      description: Space on the filesystem of O(snapshot_root).
      returned: always
      type: dict
      contains:
        path:
          description: O(snapshot_root) as given.
          returned: always
          type: str
          sample: /var/lib/warmstart
        exists:
          description: Whether O(snapshot_root) exists.
          returned: always
          type: bool
          sample: false
        measured_path:
          description: The path measured, O(snapshot_root) or its nearest existing parent.
          returned: always
          type: str
          sample: /var/lib
        free_bytes:
          description: Bytes available to unprivileged users; null if the filesystem could not be queried.
          returned: always
          type: int
          sample: 512110190592
        total_bytes:
          description: Size of the filesystem in bytes; null if it could not be queried.
          returned: always
          type: int
          sample: 1081101176832
    os:
      description: Fields of C(/etc/os-release) (null where missing).
      returned: always
      type: dict
      contains:
        id:
          description: C(ID).
          returned: always
          type: str
          sample: ubuntu
        id_like:
          description: C(ID_LIKE).
          returned: always
          type: str
          sample: debian
        version_id:
          description: C(VERSION_ID).
          returned: always
          type: str
          sample: "24.04"
        name:
          description: C(NAME).
          returned: always
          type: str
          sample: Ubuntu
        pretty_name:
          description: C(PRETTY_NAME).
          returned: always
          type: str
          sample: Ubuntu 24.04.1 LTS
    fingerprint:
      description: Node identity that snapshots record and restores are checked against.
      returned: always
      type: dict
      sample:
        arch: x86_64
        kernel: 6.8.0-45-generic
        cpu_vendor: AuthenticAMD
        cpu_model: AMD EPYC 7763 64-Core Processor
        cpu_flags_hash: 3b9c5e9c0b6a4f2e8d1f7a6c5b4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e
        criu_version: 4.2.1
        os_id: ubuntu
        os_version_id: "24.04"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _node_info
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module

ARGUMENT_SPEC = dict(
    snapshot_root=dict(type="path", default="/var/lib/warmstart"),
    criu_path=dict(type="path"),
    kernel_min_version=dict(type="str", default="5.12"),
    probe_features=dict(type="bool", default=True),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, _node_info.run)


if __name__ == "__main__":
    main()
