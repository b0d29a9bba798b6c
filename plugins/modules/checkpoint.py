#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: checkpoint
short_description: Snapshot a running process tree or container into a snapshot store with CRIU
version_added: 0.1.0
description:
  - Dumps the process tree rooted at a target (O(pid), O(pidfile) or a O(workload) started by
    M(warmstart.snapshot.workload)) with CRIU through pycriu's RPC, into a staging directory of the store.
  - With O(container), dumps a container's workload - the process tree under the container's init
    (C(podman run --init)), or, when the app itself is PID 1 (an ordinary Kubernetes pod's container), the whole
    tree with its PID namespace - with the container's network namespace and its bind and cgroup mounts declared
    external, plus its root file system changes (overlay upper dir) as
    C(rootfs-diff.tar) and C(deleted-files.json), and its image in the manifest. Restore it into a placeholder
    container with M(warmstart.snapshot.restore) O(warmstart.snapshot.restore#module:into).
  - The tree stays stopped while the snapshot is finished - the workload's own files copied, every file's size
    and SHA256 recorded in C(manifest.json) with the source node's fingerprint - and is published by an atomic
    rename. Only then is the source ended (O(leave_running=false)); with O(leave_running=true) it resumes right
    after the dump.
  - Any failure resumes the source and removes the staging directory; if this module itself is killed, a
    detached guard resumes the source and the staging directory is left for M(warmstart.snapshot.cleanup).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.store.criu
  - warmstart.snapshot.store.progress
  - warmstart.snapshot.metrics
  - warmstart.snapshot.attributes.progress
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Checks the target and the store, takes no snapshot and reports C(changed=true).
  platform:
    description: Linux with CRIU >= 4.2 (see P(warmstart.snapshot.node_prep#role)).
options:
  pid:
    description: Host PID of the root of the tree to snapshot.
    type: int
  pidfile:
    description: File holding that PID.
    type: path
  workload:
    description: Name of a workload started with M(warmstart.snapshot.workload).
    type: str
  container:
    description:
      - Name or id of a running container whose workload to snapshot (see O(runtime)).
      - The snapshot holds it under C(containers/<container name>/); its name defaults to the container name.
    type: str
  pod:
    description:
      - A container of a Kubernetes pod on this node. It is found through the container runtime by the labels the
        kubelet's CRI runtimes set (C(io.kubernetes.pod.namespace), C(io.kubernetes.pod.name),
        C(io.kubernetes.container.name)); the node needs no API access. Then it is snapshotted like O(container).
      - The snapshot holds it under the pod's container name, and the manifest records the pod (namespace, name,
        uid, container, spec hash).
      - The playbook C(warmstart.snapshot.k8s_snapshot) reads the pod from the API and passes it here.
    type: dict
    suboptions:
      namespace:
        description: Namespace of the pod.
        type: str
        default: default
      name:
        description: Name of the pod.
        type: str
        required: true
      container:
        description: Name of the container in the pod.
        type: str
        required: true
      container_id:
        description:
          - The container's id from the pod's status (C(status.containerStatuses[].containerID), V(podman://<id>) or V(containerd://<id>)).
            When given, the container found on this node must be that one (a pod re-created under the same name
            has new containers).
        type: str
      uid:
        description: The pod's uid, recorded in the manifest.
        type: str
      spec_hash:
        description: The pod's condensed spec hash, recorded in the manifest.
        type: str
  volumes:
    description:
      - Mountpoints in the O(container) (or O(pod) container) whose contents the snapshot takes along - a pod's
        C(emptyDir) volumes, where a server writes at start-up (a compile cache) or holds files open. Each must be
        one of the container's bind mounts, not its C(snapshot-control) dir; every one that is not is named in
        the failure, before anything is stopped.
      - Each is archived while the workload is stopped (C(volumes/<n>.tar) beside the CRIU images, its files
        and bytes in the manifest) and put back into the placeholder's volume at the same mountpoint before
        CRIU restores; a placeholder whose volume lacks the room is refused. Both sides run chrooted into the
        volume, so no symlink another container of the pod plants there leads out of it.
      - The node agent (M(warmstart.snapshot.agent_capture)) and the C(k8s_snapshot) playbook pass every
        C(emptyDir) volume the pod's container mounts, but those the pod's annotation
        C(snapshot.warmstart.io/skip-volumes) names (comma-separated volume names).
    type: list
    elements: str
    default: []
  runtime:
    description:
      - Container runtime of O(container) or O(pod).
      - V(containerd) asks containerd through its C(ctr) CLI. Where containerd lives comes from the environment
        (set it with the task's C(environment)), as C(ctr) reads it - E(CONTAINERD_ADDRESS) (its socket, default
        C(/run/containerd/containerd.sock)), E(CONTAINERD_NAMESPACE) (default V(k8s.io), the kubelet's) - and
        E(WARMSTART_CONTAINERD_STATE), its state dir (default the socket's dir; on k3s the socket is
        C(/run/k3s/containerd/containerd.sock) and the state dir C(/run/k3s/containerd)).
      - V(auto) asks every runtime whose tool is installed on the node; exactly one must know the container. For a
        O(pod) target whose O(pod.container_id) is V(<runtime>://<id>), that runtime is used.
    type: str
    choices: [podman, containerd, auto]
    default: auto
  workloads_root:
    description: State directory root of workloads (as in M(warmstart.snapshot.workload)).
    type: path
    default: /var/lib/warmstart/workloads
  name:
    description: The snapshot's name, the user's handle for it. Defaults to the workload or container name, else C(process).
    type: str
  labels:
    description: Labels (string keys and values) to select the snapshot by later.
    type: dict
    default: {}
  leave_running:
    description: Keep the source running after the snapshot. With V(false) it is ended once the snapshot is published.
    type: bool
    default: true
  tcp:
    description: Established TCP connections - V(established) dumps them, V(close) restores them closed, V(none) refuses them.
    type: str
    choices: [established, close, none]
    default: established
  ext_unix_sk:
    description: Allow unix sockets connected to processes outside the tree.
    type: bool
    default: true
  file_locks:
    description: Dump file locks.
    type: bool
    default: true
  link_remap:
    description: Allow CRIU to link-remap open files that were deleted or replaced.
    type: bool
    default: true
  ghost_limit:
    description: Largest deleted-but-open file CRIU copies into the snapshot, in bytes.
    type: int
    default: 536870912
  timeout:
    description:
      - CRIU's timeout for collecting and freezing the tree, in seconds (V(0) is CRIU's default).
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 0
  wait_ready:
    description:
      - Wait until the target is warm first - its O(app_profile)'s ready probe passes, or, without a profile,
        C(ready-for-snapshot) appears in its control directory (E(SNAPSHOT_CONTROL_DIR)).
    type: bool
    default: false
  ready_timeout:
    description:
      - Seconds to wait for readiness (O(wait_ready)), and for the answer of a workload with checkpoint hooks
        (C(checkpoint-requested)) before a GPU snapshot. Default - the profile's ready timeout, else 300.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
  app_profile:
    description:
      - The application profile of a stock server (see C(docs/profiles.md)) - O(wait_ready) waits for its ready
        probe; its C(quiesce) steps run before the dump (e.g. vLLM's level 1 sleep), its C(resume) steps after
        it on a source that keeps running and on one whose checkpoint failed. The snapshot records it, and
        M(warmstart.snapshot.restore) releases the copy with it.
      - A shipped profile's name, a mapping C({name, vars}), a whole profile, or a JSON or YAML file's absolute
        path, as for M(warmstart.snapshot.workload). Default - the one a O(workload) target was started with.
      - A failed quiesce step fails the checkpoint before anything is stopped, naming the step; a bad profile is
        refused listing every problem.
    type: raw
  accelerator:
    description:
      - Which accelerator's device state to snapshot with the tree. V(auto) when neither this nor O(cuda) is given.
      - V(auto) and V(cuda) - NVIDIA GPUs, as O(cuda=auto) and O(cuda=required).
      - V(ascend) - Huawei Ascend NPUs (CANN's C(aclrtSnapShotProcess*) API). CANN acts on the calling process
        only, so every NPU process of the tree must serve warmstart's snapshot agent (it calls
        C(_ascend.serve) of this collection's module_utils); the agents lock and back up their device state before
        the dump and restore and unlock it afterwards when the source keeps running or anything fails. A process
        that loads C(libascendcl.so) without an agent, or a tree without NPU processes, fails before anything is
        touched. Proven against a fake C(libascendcl.so) only, not on Ascend hardware.
      - V(off) - no accelerator state, as O(cuda=off).
    type: str
    choices: [auto, cuda, ascend, "off"]
  cuda:
    description:
      - GPU state of the tree, through the CUDA checkpoint driver API (NVIDIA driver >= 570, CUDA 12.8) or the
        C(cuda-checkpoint) utility.
      - V(auto) - when the node has the API and processes of the tree are CUDA processes, lock and checkpoint them
        (their GPU memory moves into host memory) before the CRIU dump, and restore and unlock them afterwards
        when the source keeps running or anything fails; otherwise take a CPU-only snapshot and say why in
        RV(snapshot.cuda) (C(reason)).
      - V(required) - the same, but fail before anything is touched when the node has no NVIDIA driver, the driver
        is too old, or no process of the tree is a CUDA process.
      - The older spelling of O(accelerator) (V(required) = O(accelerator=cuda)); V(auto) when neither is given.
        Given both, they must agree.
      - V(off) - never look at GPU state (a CUDA process then fails in CRIU, or is left to CRIU's own cuda plugin).
      - A workload that registered pre-checkpoint hooks (C(checkpoint-hooks) in its control directory) is asked to
        quiesce first (C(checkpoint-requested)), and told C(checkpoint-done) when it keeps running.
      - While warmstart handles GPU state, CRIU runs with no plugin loaded, so CRIU's C(cuda_plugin.so) does not
        act a second time.
    type: str
    choices: [auto, required, "off"]
  cuda_lock_timeout:
    description:
      - Seconds the CUDA lock waits for running GPU work to finish (V(0) waits without limit). When it
        expires the process is left running and the checkpoint fails.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 30
notes:
  - Needs root. A process target should be the init of its own PID namespace (as M(warmstart.snapshot.workload)
    starts it), so that its PIDs cannot collide with other processes on the restoring node.
  - A container's workload keeps its PIDs inside the container's PID namespace; a placeholder container whose
    only process is its PID 1 has them free.
  - GPU snapshots need an NVIDIA driver >= 570 (>= 580 to restore onto other GPUs of the same model), no UVM, IPC
    memory, MIG or MPS in the workload, and the same GPU model and count on the restoring node. A process on a
    MIG instance is refused before anything is locked.
"""

EXAMPLES = r"""
- name: Snapshot a warm workload and stop it
  warmstart.snapshot.checkpoint:
    workload: embed
    store: /mnt/snapshots
    labels:
      model: all-minilm-l6-v2
    wait_ready: true
    leave_running: false
  register: snap

- name: Snapshot the workload of a podman container (started with --init) once it is warm
  warmstart.snapshot.checkpoint:
    container: embed-1
    wait_ready: true
    store: /mnt/snapshots

- name: Snapshot a pod's container on a k3s node (containerd), found by the kubelet's labels
  warmstart.snapshot.checkpoint:
    pod:
      namespace: ml
      name: embed-0
      container: main
      container_id: containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    runtime: containerd
    store: /mnt/snapshots
  environment:
    CONTAINERD_ADDRESS: /run/k3s/containerd/containerd.sock

- name: Snapshot a container with what its server wrote into its cache volume at start-up
  warmstart.snapshot.checkpoint:
    container: embed-1
    volumes: [/root/.cache]
    store: /mnt/snapshots

- name: Snapshot a process by pid, keep it running
  warmstart.snapshot.checkpoint:
    pid: 4242
    name: my-server

- name: Snapshot a GPU inference server with its GPU memory, failing if its GPU state cannot be saved
  warmstart.snapshot.checkpoint:
    workload: vllm
    cuda: required
    cuda_lock_timeout: 60
    leave_running: false
"""

RETURN = r"""
snapshot:
  description: The published snapshot.
  returned: success, not in check mode
  type: dict
  contains:
    id:
      description: Generated snapshot id (sortable by time).
      type: str
      returned: always
      sample: 20261202T124302Z-f6ccdab5
    name:
      description: Snapshot name.
      type: str
      returned: always
      sample: embed
    labels:
      description: Labels.
      type: dict
      returned: always
      sample: {model: all-minilm-l6-v2}
    size:
      description: Bytes in the snapshot.
      type: int
      returned: always
      sample: 3987719
    path:
      description: Directory of the published snapshot.
      type: str
      returned: always
      sample: /var/lib/warmstart/store/snapshots/20261202T124302Z-f6ccdab5
    pid:
      description: Host PID of the source.
      type: int
      returned: always
      sample: 4242
    source_running:
      description: Whether the source still runs.
      type: bool
      returned: always
      sample: false
    timings:
      description:
        - Seconds per phase (wait_ready, dump, checksum, publish, total).
        - With GPU state also quiesce (the workload's hooks), cuda_lock, cuda_checkpoint and, when the source keeps
          running, cuda_resume (its restore and unlock).
        - With O(app_profile) also quiesce (its steps) and, when the source keeps running, resume_source.
      type: dict
      returned: always
      sample: {cuda_lock: 0.002, cuda_checkpoint: 1.9, dump: 0.38, total: 2.4}
    criu_stats:
      description: CRIU's dump statistics - its times (C(*_time)) in seconds, its counts (pages) as they are.
      type: dict
      returned: always
      sample: {frozen_time: 0.045313, pages_written: 954}
    source_node:
      description: The source node as the manifest records it (architecture, kernel, CPU vendor, model and flags hash, CRIU, OS).
      type: dict
      returned: always
      sample: {hostname: gpu-01, arch: x86_64, kernel: 6.12.0, cpu_vendor: GenuineIntel, cpu_flags_hash: 9f2c}
    volumes:
      description:
        - The O(volumes) taken along - C(mountpoint), C(archive), C(entries) (files, directories and links),
          C(bytes) (of its files) and C(fstype) (C(tmpfs) for an C(emptyDir) whose medium is C(Memory)).
      type: list
      elements: dict
      returned: with O(volumes)
      sample: [{mountpoint: /root/.cache, archive: volumes/0.tar, entries: 12, bytes: 73400320, fstype: ext4}]
    pod:
      description: The pod section of the manifest, for O(pod) targets.
      type: dict
      returned: always
      sample: {namespace: default, name: embed-0, uid: 6b1f, container: main, spec_hash: 3a1d}
    cuda:
      description:
        - What O(cuda) decided - C(mode), C(used) (whether GPU state is in the snapshot) and C(reason) (why not, or
          which processes); when used also C(pids) (host PIDs of the CUDA processes), C(backend) and C(hooks)
          (whether the workload's checkpoint hooks were asked).
      type: dict
      returned: always
      sample: {mode: auto, used: false, reason: "no CUDA checkpoint support on this node: libcuda.so.1 not found"}
    gpu:
      description:
        - The manifest's gpu section when GPU state was saved (else null) - C(backend), C(cuda_version) (13000 is
          CUDA 13.0), C(driver_version), C(pids) (C(pid) on the host, C(ns_pid) in its PID namespace), C(gpus)
          (C(index), C(uuid), C(name), C(memory_total) of the source node's GPUs) and C(inventory_error).
      type: dict
      returned: always
      sample: {cuda_version: 13000, driver_version: 580.65.06, pids: [{pid: 4242, ns_pid: 1}],
               gpus: [{index: 0, uuid: GPU-5f1c, name: NVIDIA H100 80GB HBM3, memory_total: 85520809984}]}
    app_profile:
      description:
        - With O(app_profile) - C(name), C(quiesce) and C(resume) (each step run - C(step), C(seconds)), and
          C(warning) when a source that keeps running was not resumed by its profile.
      type: dict
      returned: with an application profile
      sample: {name: vllm-sleep, quiesce: [{step: "HTTP POST http://127.0.0.1:8000/sleep?level=1", seconds: 1.2}]}
target:
  description: The resolved target.
  returned: always
  type: dict
  sample: {pid: 4242, name: embed, workload: embed, container: null,
           control_dir: /var/lib/warmstart/workloads/embed/control}
cuda:
  description: In check mode - what O(cuda) would do (as RV(snapshot.cuda)).
  returned: check mode
  type: dict
  sample: {mode: auto, used: true, reason: "CUDA process(es) 4242 checkpointed through CUDA driver API", pids: [4242]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _checkpoint
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import (
    metrics_argument_spec, pod_argument_spec, progress_argument_spec, runtime_option, store_argument_spec)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            pid=dict(type="int"),
            pidfile=dict(type="path"),
            workload=dict(type="str"),
            container=dict(type="str"),
            pod=pod_argument_spec(uid=dict(type="str"), spec_hash=dict(type="str")),
            volumes=dict(type="list", elements="str", default=[]),
            runtime=runtime_option(),
            workloads_root=dict(type="path", default="/var/lib/warmstart/workloads"),
            **store_argument_spec(),
            **progress_argument_spec(),
            **metrics_argument_spec(),
            criu_path=dict(type="path"),
            name=dict(type="str"),
            labels=dict(type="dict", default={}),
            leave_running=dict(type="bool", default=True),
            tcp=dict(type="str", choices=["established", "close", "none"], default="established"),
            ext_unix_sk=dict(type="bool", default=True),
            file_locks=dict(type="bool", default=True),
            link_remap=dict(type="bool", default=True),
            ghost_limit=dict(type="int", default=512 << 20),
            timeout=dict(type="raw", default=0),
            wait_ready=dict(type="bool", default=False),
            ready_timeout=dict(type="raw"),
            app_profile=dict(type="raw"),
            accelerator=dict(type="str", choices=["auto", "cuda", "ascend", "off"]),
            cuda=dict(type="str", choices=["auto", "required", "off"]),
            cuda_lock_timeout=dict(type="raw", default=30),
        ),
        mutually_exclusive=[("pid", "pidfile", "workload", "container", "pod")],
        required_one_of=[("pid", "pidfile", "workload", "container", "pod")],
        supports_check_mode=True,
    )
    run_module(module, _checkpoint.run, progress=True)


if __name__ == "__main__":
    main()
