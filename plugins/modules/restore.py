#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: restore
short_description: Restore a process or container snapshot on this node with CRIU
version_added: 0.1.0
description:
  - Restores a snapshot taken by M(warmstart.snapshot.checkpoint) - by O(snapshot) id, or the newest published
    snapshot matching O(name) and O(labels) that is compatible with this node.
  - Before any process is touched it verifies every file's SHA256 against the manifest (O(verify)) and checks
    compatibility (architecture, kernel and CRIU not older than the source's, CPU vendor, source CPU flags a
    subset of this node's), and refuses with every failing reason.
  - The tree is restored detached, in a new PID namespace when the source was a namespace init (so the same
    snapshot can run twice on one node when nothing else, such as a listening port, collides).
  - Writes C(restore-complete) (C(pid=<pid in its namespace>)) into the workload's control directory, or
    C(restore-failed) on failure; CRIU leaves no half-restored process behind.
  - A container snapshot is restored B(into) running placeholder containers (O(into)) - containers of the same
    image and mounts whose only process is an inert PID 1 such as C(sleep infinity). Each placeholder is checked
    first (running, inert, the PIDs the workload needs free, same image, every mount the workload needs present)
    and pinned by open namespace descriptors; the rootfs diff and deletions are applied to its root file system,
    and the contents of the volumes the snapshot took along
    (M(warmstart.snapshot.checkpoint) O(warmstart.snapshot.checkpoint#module:volumes), a pod's C(emptyDir) volumes)
    are extracted into its volumes at the same mountpoints (a placeholder without the room there is refused before
    anything is touched); CRIU then restores the workload into its network, PID, UTS and IPC namespaces and its
    cgroup, as a sibling of its PID 1 with its original PIDs and its stdio on the placeholder's. Nothing is mounted
    into the placeholder.
  - On success C(restore-complete) (C(pid=<pid in the container>)) is written into the container's control
    directory (the workload's E(SNAPSHOT_CONTROL_DIR) at capture, as mounted in the placeholder); on failure
    C(restore-failed), and the placeholder is killed (O(into.kill_placeholder_on_failure)) so that its supervisor
    replaces it - a half-restored container is never left running.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.store.criu
  - warmstart.snapshot.store.progress
  - warmstart.snapshot.metrics
  - warmstart.snapshot.tls
  - warmstart.snapshot.attributes.progress
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Selects, verifies and checks the snapshot, restores nothing.
  platform:
    description: Linux with CRIU >= 4.2.
options:
  snapshot:
    description: Snapshot id to restore.
    type: str
  name:
    description: Restore the newest compatible snapshot of this name.
    type: str
  labels:
    description: Restore the newest compatible snapshot carrying these labels.
    type: dict
  verify:
    description:
      - Verify every file's size and SHA256 before restoring.
      - A file this node hashed before (when it took the snapshot, or an earlier restore verified it) and whose
        inode has not changed since (same size, mtime and ctime, which any write or chmod changes) is not hashed
        again; the record is C(/var/lib/warmstart/verified/<id>.json), one small file per snapshot.
        M(warmstart.snapshot.snapshot_info) with O(warmstart.snapshot.snapshot_info#module:verify) always hashes
        everything.
    type: bool
    default: true
  skip_compat_check:
    description:
      - Restore even if the node does not match the source (CPU, kernel, CRIU), or has less free host memory
        (C(MemAvailable)) than the snapshot's page images hold (at your own risk).
    type: bool
    default: false
  skip_unreadable:
    description:
      - With O(name) or O(labels) - pass over newer snapshots of the store that cannot be read or trusted (a
        signature that does not verify, a manifest that fails the schema) and restore the newest usable match.
      - By default such a snapshot refuses the restore, naming it - nothing it claims (name, labels) can be
        believed, so it may be a newer version of what was asked for, and whoever can break its signature
        would otherwise choose which version runs. Remove it with
        M(warmstart.snapshot.cleanup) (O(warmstart.snapshot.cleanup#module:remove_broken)), or set this.
      - Every newer snapshot passed over, for whatever reason, is named in RV(restore.passed_over).
    type: bool
    default: false
  if_running:
    description:
      - What a process restore does when the snapshot's workload is already running on this node.
      - V(refuse) - fail, naming the running pid (a restored copy would share its files and ports).
      - V(keep) - when it runs as the restore of this very snapshot (its C(restore-complete) names the snapshot and
        the running pid), do nothing (C(changed=false), RV(restore.already_running)) - re-running a play converges.
        A workload running from anything else - another snapshot (a newer one selected by O(name)), a cold start -
        is still refused.
      - Not for O(into) (placeholders are the targets there).
    type: str
    choices: [refuse, keep]
    default: refuse
  restore_root:
    description: Node-local directory for CRIU's restore work files and logs.
    type: path
    default: /var/lib/warmstart/restore
  workloads_root:
    description:
      - This node's root of workload directories (as M(warmstart.snapshot.workload) uses it). A workload
        snapshot is restored into C(<workloads_root>/<name>), and its pidfile is written there; the paths in the
        manifest are never used to choose where files are written.
      - A workload that ran under another root at checkpoint is refused (its open files are restored at their
        old paths), naming both roots.
      - One restore of a workload at a time on a node; a second one meanwhile is refused.
    type: path
    default: /var/lib/warmstart/workloads
  control_roots:
    description:
      - Directories under which the control directory (C(SNAPSHOT_CONTROL_DIR)) of a plain process snapshot
        (O(warmstart.snapshot.checkpoint#module:pid) / O(warmstart.snapshot.checkpoint#module:pidfile)) may lie
        for C(restore-complete) to be written into it. A control dir elsewhere, or reached through a symlink,
        is left alone and the result's RV(restore.warnings) says so. Workloads and containers do not need this.
    type: list
    elements: path
    default: [/var/lib/warmstart, /run/warmstart, /tmp]
  accelerator:
    description:
      - Which accelerator's device state the snapshot holds. V(auto) when neither this nor O(cuda) is given.
      - V(auto) and V(cuda) - NVIDIA GPUs, as O(cuda=auto) and O(cuda=required).
      - V(ascend) - a snapshot taken with O(warmstart.snapshot.checkpoint#module:accelerator=ascend) - after the CRIU
        restore every NPU process's agent restores and unlocks its device state (CANN restores onto the same device
        ids), then C(restore-complete) is written. Process snapshots only. Proven against a fake C(libascendcl.so)
        only, not on Ascend hardware.
      - V(off) - as O(cuda=off).
    type: str
    choices: [auto, cuda, ascend, "off"]
  cuda:
    description:
      - GPU state of a snapshot that holds some (taken with M(warmstart.snapshot.checkpoint) O(warmstart.snapshot.checkpoint#module:cuda)).
      - V(auto) - restore it when the snapshot holds it. Before anything is touched the node must have the CUDA
        checkpoint API, a CUDA driver not older than the source's, and the same GPU models and count (the
        snapshot's GPUs are mapped onto this node's, identical UUIDs first, then by position; other UUIDs need
        driver >= 580); every failing reason lists both GPU lists. After the CRIU restore the CUDA processes are
        restored onto the mapped GPUs and unlocked, then C(restore-complete) is written; if that fails,
        C(restore-failed) is written and the restored tree is killed.
      - V(required) - the same, and refuse a snapshot without GPU state.
      - V(off) - refuse a snapshot that holds GPU state (restored without it, its CUDA processes would stay locked).
      - O(skip_compat_check) skips the driver and GPU model checks, not the others.
      - With O(into), the snapshot's GPUs are mapped onto the GPUs each placeholder was given (C(NVIDIA_VISIBLE_DEVICES),
        else C(CUDA_VISIBLE_DEVICES), in its environment, and its C(/dev/nvidia<N>) device nodes); a placeholder with
        fewer or other GPUs is refused naming both lists. After CRIU every CUDA process of the copy is restored, then
        all are unlocked, then C(restore-complete) is written; on failure the copy and (by default) the placeholder
        are killed. Each destination's result has C(cuda).
      - The older spelling of O(accelerator) (V(required) = O(accelerator=cuda)); V(auto) when neither is given.
        Given both, they must agree.
    type: str
    choices: [auto, required, "off"]
  lazy:
    description:
      - Resume the restored tree at once and stream its memory in afterwards (CRIU lazy pages over userfaultfd).
        A page the process touches first is served at once; the rest is loaded in the background by CRIU's
        lazy-pages daemon, which exits when memory is complete. See RV(restore.lazy).
      - Needs the C(uffd) and C(uffd-noncoop) CRIU features (M(warmstart.snapshot.node_info)); without them, and for
        a snapshot with GPU state, the restore is eager and RV(restore.lazy.reason) says why.
      - A supervisor owns the daemon - when the daemon dies or memory is not complete within O(lazy_timeout), the
        restored tree is killed at once (it never runs on missing memory) and C(restore-failed) is written into
        the workload's control directory, also after the task has returned (unless O(lazy_wait)).
      - A process still loading its memory cannot be checkpointed (M(warmstart.snapshot.checkpoint) refuses it).
      - Off by default - an eager restore is finished when the task returns; see C(docs/benchmarks.md) for
        what lazy restore gains (time to the first answer).
      - With O(into), each placeholder's tree resumes as soon as CRIU restored it, its memory streamed in from the
        same verified images; should memory not be complete, the supervisor kills the tree and then the
        placeholder (so that its supervisor, the kubelet, replaces it; not with
        O(into.kill_placeholder_on_failure=false)) and writes C(restore-failed) into the placeholder's control
        directory. Each of RV(restore.destinations) says C(lazy).
    type: bool
    default: false
  lazy_wait:
    description:
      - With O(lazy), return only when memory is complete (RV(restore.lazy.complete_after)); fail if it was not.
    type: bool
    default: false
  lazy_verify:
    description:
      - How a lazy restore checks the page images on a node that has not verified them (a node that did, such as
        the one that took the snapshot, lets CRIU read them as they are).
      - V(before) - every page image is hashed before the tree runs; the first answer waits for that.
      - V(on_demand) - the tree runs once the small images and the pages CRIU restores itself are checked; the
        restore's supervisor serves every other page to CRIU's lazy-pages daemon from a 64 MiB piece of the
        store's image that matched its manifest digest when read, and kills the tree rather than serve a piece
        that does not. Used for single-process snapshots from a store read in place, without compression or
        encryption - elsewhere V(before) is used and RV(restore.lazy.reason) says why.
      - V(on_demand) is experimental - the tree runs sooner, but every page it faults on is a round trip through
        the supervisor and each piece is hashed whole when first touched; measured, the demo embedding server
        answered its first request after 55 s against 0.67 s with V(before). Keep V(before) for inference
        servers (C(docs/lazy.md), C(docs/benchmarks.md)).
    type: str
    choices: [before, on_demand]
    default: before
  lazy_timeout:
    description:
      - Seconds, from the restore's start, within which the lazy restore must have loaded all memory; past it
        the restored tree and the daemon are killed.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 600
  page_server:
    description:
      - V(host:port) of a page server started by M(warmstart.snapshot.page_server) on the node that holds the
        snapshot - a lazy restore (implied) whose pages come straight from there, so this node reads from
        the store only the small images (verified) and the few pages CRIU cannot load lazily.
      - The page server verified the pages images before serving; this node verifies every other file.
      - One page server serves one restore.
      - With O(tls), over CRIU's mutual TLS (the page server must have O(warmstart.snapshot.page_server#module:tls)
        too); without it, in the clear - only for a page server on a loopback address, or with O(insecure=true)
        (and the page server started with O(warmstart.snapshot.page_server#module:insecure=true)) on a network you
        trust. A page server beyond loopback without O(tls) or O(insecure) is refused before anything starts.
    type: str
  insecure:
    description:
      - Let a restore read pages in the clear from a O(page_server) beyond loopback (no O(tls)) - on a network
        you trust only; anyone on the path sees the process's memory and can change it.
    type: bool
    default: false
  tcp:
    description:
      - What happens to the snapshot's established TCP connections (recorded when it was taken with
        O(warmstart.snapshot.checkpoint#module:tcp=established), the default). Listening sockets are restored
        either way.
      - V(keep) - CRIU re-creates them; they work where their addresses still lead to the same peers, that is on
        the node that took the snapshot, in the host's network namespace.
      - V(close) - each connected socket comes back closed (a read returns end of file, a write fails; the
        workload reconnects), and a peer that writes to the old connection gets a reset. This also closes
        connections between processes of the restored tree.
      - Default - V(close) when the tree comes back in another network namespace or on another node than the
        dump's (a restore O(into) a placeholder container or pod, whose address is new; a process restore on
        a node other than the one that took the snapshot, as its manifest records it); V(keep) for a process
        restored on the node that took the snapshot.
      - O(into) a placeholder, the default keeps each connection the checkpoint listed with both ends in the
        snapshot over loopback (two processes of the container or pod talking over 127.0.0.1 or ::1, e.g.
        tensor-parallel workers and their torch.distributed store, come back together) and closes the others
        (they lead out of the snapshot, or use the source's own address, which the placeholder does not have);
        C(mode) is V(mixed) when some are kept and some closed - the closed ones are rewritten as closed sockets
        in the restore's own copy of the images. RV(restore.tcp) says which was applied and why, and each
        listed connection with what was done to it.
      - V(keep) of a snapshot taken with O(warmstart.snapshot.checkpoint#module:tcp=close) is refused (its
        connections were not dumped).
    type: str
    choices: [keep, close]
  app_profile:
    description:
      - The application profile that releases the restored copy (see C(docs/profiles.md)) - once CRIU let it go,
        its C(release) steps run (e.g. vLLM's C(wake_up)) and its C(serving) probe waits until the copy serves.
        A failed step or probe fails the restore and the copy is killed, never left half-restored.
      - Default - the one the snapshot recorded (M(warmstart.snapshot.checkpoint)'s O(warmstart.snapshot.checkpoint#module:app_profile));
        given here (a shipped name, a mapping C({name, vars}), a whole profile, or a file's absolute path), it
        replaces that one, for example with another port. Process snapshots (not O(into)).
    type: raw
  into:
    description: Restore a container snapshot into placeholder containers.
    type: dict
    suboptions:
      container:
        description: The placeholder container (name or id) to restore the snapshot's only container into.
        type: str
      container_map:
        description:
          - V(src=dst) pairs (a list, or one comma-separated string) - restore source container V(src) of the
            snapshot into placeholder V(dst). One source may go to several placeholders. A bare V(dst) means the
            snapshot's only container.
          - Each destination gets its own result; the task fails unless all succeed.
        type: list
        elements: str
      pod:
        description:
          - The placeholder is container O(into.pod.container) of a Kubernetes restore pod on this node, found by
            its CRI labels as in the checkpoint module's O(warmstart.snapshot.checkpoint#module:pod) option.
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
            description: The pod's placeholder container.
            type: str
            required: true
          container_id:
            description: Its id from the pod's status; when given, the container found must be this one.
            type: str
          source:
            description: The snapshot's container to restore into it (default the snapshot's only container).
            type: str
      runtime:
        description:
          - Container runtime of the placeholders, as in the checkpoint module's
            O(warmstart.snapshot.checkpoint#module:runtime) option (V(containerd) reads E(CONTAINERD_ADDRESS),
            E(CONTAINERD_NAMESPACE) and E(WARMSTART_CONTAINERD_STATE) from the task's environment).
          - V(auto) asks every runtime whose tool is installed on the node; exactly one must know each placeholder.
        type: str
        choices: [podman, containerd, auto]
        default: auto
      skip_image_check:
        description: Restore even if a placeholder runs another image than the snapshot's container did.
        type: bool
        default: false
      kill_placeholder_on_failure:
        description: Kill a placeholder whose restore failed (its supervisor restarts it; its one attempt is spent).
        type: bool
        default: true
"""

EXAMPLES = r"""
- name: Restore the newest compatible snapshot of the embedding server
  warmstart.snapshot.restore:
    name: embed
    store: /mnt/snapshots
  register: restored

- name: Restore the newest snapshot of container embed-1 into a fresh placeholder
  warmstart.snapshot.restore:
    name: embed-1
    into:
      container: embed-2

- name: Fan one snapshot out into three placeholders on this node
  warmstart.snapshot.restore:
    snapshot: 20261202T124302Z-f6ccdab5
    into:
      container_map: embed-1=replica-a,embed-1=replica-b,embed-1=replica-c

- name: Restore one snapshot by id
  warmstart.snapshot.restore:
    snapshot: 20261202T124302Z-f6ccdab5

- name: Resume at once, memory streamed in afterwards
  warmstart.snapshot.restore:
    name: embed
    lazy: true

- name: Restore on the node that took the snapshot, but close its TCP connections (clients reconnect)
  warmstart.snapshot.restore:
    name: embed
    tcp: close

- name: Lazy restore with the pages served by the node that holds the snapshot, over mutual TLS
  warmstart.snapshot.restore:
    snapshot: 20261202T124302Z-f6ccdab5
    page_server: "{{ served.page_server.address }}:{{ served.page_server.port }}"
    tls: true
"""

RETURN = r"""
restore:
  description: What was restored (in check mode - what would be).
  returned: success
  type: dict
  contains:
    id:
      description: Snapshot id.
      type: str
      returned: always
      sample: 20261202T124302Z-f6ccdab5
    name:
      description: Snapshot name.
      type: str
      returned: always
      sample: embed
    pid:
      description: Host PID of the restored root (with RV(restore.already_running), of the copy already running).
      type: int
      returned: not in check mode, without into
      sample: 22862
    already_running:
      description: O(if_running=keep) found the workload running as this snapshot's restore; nothing was done.
      type: bool
      returned: when true
      sample: true
    pids:
      description: Host PIDs of the restored tree.
      type: list
      elements: int
      returned: not in check mode, without into
      sample: [22862]
    ns_pid:
      description: PID of the root inside its PID namespace.
      type: int
      returned: not in check mode, without into
      sample: 1
    workload_name:
      description: Workload name, if the snapshot is of one.
      type: str
      returned: not in check mode, without into
      sample: embed
    work_dir:
      description: Directory with CRIU's restore log.
      type: str
      returned: not in check mode, without into
      sample: /var/lib/warmstart/restore/x
    warnings:
      description:
        - What went right but deserves a look (also shown as task warnings), for example a control dir
          outside O(control_roots), or an empty CRIU restore log (a full or read-only O(restore_root)).
      type: list
      elements: str
      returned: not in check mode, without into
      sample: []
    started_at:
      description: When the restore started on the node, in UTC (ISO 8601); RV(restore.timings) count from it.
      type: str
      returned: not in check mode, without into
      sample: "2026-12-07T17:50:00.123456Z"
    timings:
      description:
        - Seconds per phase (preflight, restore, total).
        - With GPU state also cuda_map, cuda_restore and cuda_unlock.
        - With an overlapped verify (RV(restore.verify)) also verify_wait, the time the stopped tree waited for
          its page images' digests after CRIU was done.
      type: dict
      returned: not in check mode
      sample: {restore: 0.14, cuda_restore: 2.1, cuda_unlock: 0.001}
    transfer:
      description:
        - Bytes the store moved for this restore - V(downloaded) from the store, V(reused) from this node's
          verified cache, V(seconds) spent fetching.
        - With O(store_options.peers) also V(from_peers) (chunks other nodes sent, each checked against the
          manifest), V(served) (bytes this node sent them), V(peer_rejected) (chunks a peer sent that did not
          match, fetched again from the store) and V(peer_refused) (connections refused, for example a
          failed TLS handshake); V(peer_error) when this node could not serve (its port taken) and fetched
          everything from the store.
      type: dict
      returned: not in check mode
      sample: {downloaded: 1430257664, reused: 0, uploaded: 0, seconds: 3.2, from_peers: 2860515328, served: 2860515328}
    verify:
      description:
        - How the checksums were checked, for a process restore. V(overlapped=true) - everything but the page
          images was verified before anything was touched, then CRIU restored the tree stopped while the page
          images were hashed on the other cores, and the tree ran only once every digest matched (a mismatch
          kills it). Used for a store read in place, an eager restore and a snapshot without GPU state.
        - V(reason) says which, and why not when it was not overlapped.
      type: dict
      returned: success of a process restore, not in check mode
      sample: {overlapped: true, reason: page images hashed while CRIU restored the tree stopped}
    lazy:
      description:
        - Whether the restore was lazy, and how it went until the task returned.
        - The outcome of a lazy restore is also in C(lazy-state.json) in RV(restore.work_dir).
      type: dict
      returned: not in check mode, without into
      contains:
        used:
          description: Whether the tree was restored lazily.
          type: bool
          returned: always
          sample: true
        reason:
          description: Why it was (or was not) restored lazily.
          type: str
          returned: always
          sample: uffd and uffd-noncoop available
        daemon_pid:
          description: PID of CRIU's lazy-pages daemon.
          type: int
          returned: when used
          sample: 4711
        resumed_after:
          description: Seconds from the restore's start (RV(restore.started_at)) to the restored tree running.
          type: float
          returned: when used
          sample: 0.34
        complete_after:
          description: Seconds from the restore's start to all memory loaded.
          type: float
          returned: when used with O(lazy_wait)
          sample: 0.71
        pages:
          description:
            - Where the pages came from - V(images) (CRIU's lazy-pages daemon read the node's verified images),
              V(checked_on_demand) (O(lazy_verify=on_demand) on a node that had not verified the page images - the
              restore's supervisor served each page to the daemon from a piece of the store's image that matched
              its manifest digest when read, see C(docs/lazy.md)), V(page_server) (from O(page_server)).
          type: str
          returned: when used
          sample: checked_on_demand
        eager_bytes:
          description: Bytes of pages read from the store before the tree ran (the pages CRIU restores itself; the
            rest came from the page server, or were checked and served on demand).
          type: int
          returned: when used with O(page_server), or with RV(restore.lazy.pages=checked_on_demand)
          sample: 1318912
    cuda:
      description:
        - Whether GPU state was restored (C(used)); when it was, C(pids) (host PIDs of the restored CUDA processes),
          C(gpu_pairs) (snapshot GPU UUID, this node's GPU UUID) and C(backend); else C(reason).
      type: dict
      returned: not in check mode, without into
      sample: {used: true, pids: [22862], gpu_pairs: [[GPU-5f1c, GPU-77aa]], backend: CUDA driver API}
    passed_over:
      description:
        - With O(name) or O(labels), every snapshot newer than the one restored that was passed over - C(id) and
          C(reason) (not compatible with this node, or unreadable with O(skip_unreadable)). Empty with O(snapshot).
      type: list
      elements: dict
      returned: always
      sample: [{id: 20261205T101500Z-1a2b3c4d, reason: "kernel: this node runs 6.1.0, older than the source's 6.12.0"}]
    tcp:
      description:
        - What the restore did (in check mode - would do) with the snapshot's established TCP connections - C(mode)
          V(keep), V(close) or (O(into) a placeholder, by default) V(mixed) - some kept, the others closed (see
          O(tcp)), and C(reason), why.
        - C(connections), when the checkpoint listed them - each C(local) and C(remote) address, C(internal)
          (its other end is in the snapshot too) and C(done) (V(kept) or V(closed)).
        - With O(into), each of RV(restore.destinations) that was restored (or would be) carries its own.
      type: dict
      returned: without into
      sample: {mode: keep, reason: "restored on node node1, which took the snapshot, into the host's network namespace"}
    gpu_state:
      description: In check mode - whether the snapshot holds GPU state.
      type: bool
      returned: check mode, without into
      sample: false
    criu_stats:
      description: CRIU's restore statistics - its times (C(*_time)) in seconds, its counts (pages) as they are.
      type: dict
      returned: not in check mode, without into
      sample: {restore_time: 0.12}
    app_profile:
      description:
        - The application profile that released the copy - C(name), C(release) (each step run - C(step),
          C(seconds)), C(serving) (the probe) and C(serving_after) (seconds until it passed); null without one.
        - RV(restore.timings) then also holds release and serving.
        - In check mode - the profile that would release the copy (C(name), C(release), C(serving)).
      type: dict
      returned: without into
      sample: {name: vllm-sleep, release: [{step: "HTTP POST http://127.0.0.1:8000/wake_up", seconds: 0.4}],
               serving: "HTTP GET http://127.0.0.1:8000/is_sleeping", serving_after: 0.1}
    outcome:
      description: For O(into) - V(succeeded), V(failed) or V(partially_succeeded) over all destinations.
      type: str
      returned: with into
      sample: succeeded
    destinations:
      description:
        - For O(into) - one result per placeholder - C(container), C(source), C(result), and when restored C(pid),
          C(ns_pid), C(timings), C(tcp), C(volumes) (each volume put back - C(mountpoint), C(entries)), and with
          O(lazy) C(lazy) (as RV(restore.lazy) - C(used), C(reason), C(daemon_pid), C(resumed_after), with
          O(lazy_wait) C(complete_after); here in seconds from the start of CRIU's restore into that placeholder).
      type: list
      elements: dict
      returned: with into
      sample:
        - container: embed-2
          source: embed-1
          result: succeeded
          pid: 30211
          ns_pid: 6
          timings: {rootfs: 0.01, volumes: 0.02, restore: 0.41, total: 0.47}
          volumes: [{mountpoint: /root/.cache, entries: 12}]
          tcp: {mode: close, reason: "restored into placeholder embed-2's network namespace, not the one the connections were dumped in"}
outcome:
  description:
    - How the restore ended, on success and on failure (the Kubernetes restore playbook reads it).
    - V(succeeded) - everything was restored (in check mode - would be).
    - V(partially_succeeded) - with O(into), some placeholders were restored and others not (the task fails).
    - V(incompatible) - refused before anything was touched because the snapshot does not fit this node
      (compatibility, checksums, image); RV(reasons) says why.
    - V(failed) - any other failure, including a process's page image whose checksum did not match while
      CRIU restored the tree stopped (see RV(restore.verify)); that copy was killed before it ran, and
      RV(reasons) names the image.
  returned: always
  type: str
  sample: succeeded
reasons:
  description: Every reason the restore was refused.
  returned: failure
  type: list
  elements: str
  sample: ["architecture: snapshot is aarch64, this node is x86_64"]
criu_log_tail:
  description: Last lines of CRIU's log when CRIU failed.
  returned: failure of CRIU
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import (
    metrics_argument_spec, pod_argument_spec, progress_argument_spec, runtime_option, store_argument_spec,
    tls_argument_spec)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            snapshot=dict(type="str"),
            name=dict(type="str"),
            labels=dict(type="dict"),
            **store_argument_spec(),
            **progress_argument_spec(),
            **metrics_argument_spec(),
            criu_path=dict(type="path"),
            verify=dict(type="bool", default=True),
            skip_compat_check=dict(type="bool", default=False),
            skip_unreadable=dict(type="bool", default=False),
            if_running=dict(type="str", choices=["refuse", "keep"], default="refuse"),
            insecure=dict(type="bool", default=False),
            app_profile=dict(type="raw"),
            restore_root=dict(type="path", default="/var/lib/warmstart/restore"),
            workloads_root=dict(type="path", default="/var/lib/warmstart/workloads"),
            control_roots=dict(type="list", elements="path", default=["/var/lib/warmstart", "/run/warmstart", "/tmp"]),
            accelerator=dict(type="str", choices=["auto", "cuda", "ascend", "off"]),
            cuda=dict(type="str", choices=["auto", "required", "off"]),
            lazy=dict(type="bool", default=False),
            lazy_wait=dict(type="bool", default=False),
            lazy_verify=dict(type="str", default="before", choices=["before", "on_demand"]),
            lazy_timeout=dict(type="raw", default=600),
            page_server=dict(type="str"),
            **tls_argument_spec(),
            tcp=dict(type="str", choices=["keep", "close"]),
            into=dict(type="dict", options=dict(
                container=dict(type="str"),
                container_map=dict(type="list", elements="str"),
                pod=pod_argument_spec(source=dict(type="str")),
                runtime=runtime_option(),
                skip_image_check=dict(type="bool", default=False),
                kill_placeholder_on_failure=dict(type="bool", default=True),
            ), mutually_exclusive=[("container", "container_map", "pod")],
                required_one_of=[("container", "container_map", "pod")]),
        ),
        mutually_exclusive=[("snapshot", "name"), ("into", "page_server")],
        required_one_of=[("snapshot", "name", "labels")],
        supports_check_mode=True,
    )
    run_module(module, _restore.run, progress=True)


if __name__ == "__main__":
    main()
