#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: pod_snapshot
short_description: Record a pod snapshot in Kubernetes as a PodSnapshot bound to its PodSnapshotContent
version_added: 0.1.0
description:
  - With O(state=present), makes the cluster say what a checkpoint of a pod produced - the namespaced
    C(PodSnapshot) O(namespace)/O(name) (source pod, containers, scope, policy) and the cluster-scoped
    C(PodSnapshotContent) that records where the artifact lives (O(store)), on which node it was taken and what
    that node and pod were (O(source_node)), with a backlink to the PodSnapshot and its uid - and binds them
    (C(status.boundSnapshotContentName)).
  - The PodSnapshot's C(status.podSpecHash) is the condensed pod-spec hash of the source pod as the API server
    returns it; the content's C(status.podSpecFields) holds the digest of every hashed field, so that a pod that
    does not match can be told which fields differ (M(warmstart.snapshot.restore_pod) O(warmstart.snapshot.restore_pod#module:action=select)).
  - Conditions C(Ready) and C(Failed) follow O(ready), O(failed_reason) and O(failed_message).
  - Idempotent; the specs of both objects are immutable (the CRDs enforce it), so a PodSnapshot that exists with
    another spec, one bound to another content, or a content whose backlink names another PodSnapshot (or an
    earlier one of the same name, by uid) is refused with the reason, never overwritten.
  - With O(state=absent), deletes the PodSnapshot (that incarnation only, by uid) and then every
    PodSnapshotContent that points back to it. The artifact in the store is left alone
    (M(warmstart.snapshot.cleanup) applies retention there).
  - A PodSnapshot that exists already as a B(request) - created by a user, a C(PodSnapshotManualTrigger) or the
    agent with C(spec.source.podRef) and no status - is bound by O(state=present) like any other - its spec is
    kept (its containers are the default of O(containers)); a request without C(podRef.uid) takes the source pod's
    current one in the content's backlink, a request that names a uid refuses another incarnation of the pod.
  - With O(state=capturing), claims the next capture attempt of the request O(namespace)/O(name) - C(status.attempts)
    plus one, C(status.lastAttemptTime), condition C(Ready) False C(SnapshotInProgress) - in one status write guarded
    by the resourceVersion it read, so that of two agents one claims it (RV(claimed)). Nothing is claimed, and
    RV(reason) says why, when the PodSnapshot is Ready or Failed already, or an attempt started less than
    O(attempt_timeout) seconds ago is still running; an older one did not finish and counts as failed.
  - With O(state=failed), records that the current attempt failed (O(failed_reason), O(failed_message)) in
    C(status.lastError). While fewer than O(max_attempts) attempts were made the request stays open for another
    attempt (C(Ready) False with the reason, C(Failed) False C(WillRetry)) and the source pod is not touched; the
    last attempt makes it C(Failed) True (RV(final)). The source pod is not read, so a request whose pod is gone can
    be failed with the reason.
  - The records are returned in every case (RV(pod_snapshot), RV(pod_snapshot_content), RV(status)).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.attributes.api
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Reads the source pod and the records and reports what would be created or changed.
  diff_mode:
    support: full
    description:
      - Returns the PodSnapshot and its PodSnapshotContent before and after (a capture attempt - the PodSnapshot
        only), without the metadata the API server keeps; RV(actions) lists the changes.
options:
  namespace:
    description: Namespace of the PodSnapshot and of the source pod.
    type: str
    required: true
  name:
    description: Name of the PodSnapshot (DNS-1123 subdomain).
    type: str
    required: true
  state:
    description:
      - V(present) - the records exist (and are bound); V(absent) - they do not.
      - V(capturing) and V(failed) - a capture attempt of an existing PodSnapshot begins, or failed (see the
        description).
    type: str
    choices: [present, absent, capturing, failed]
    default: present
  source_pod:
    description: Name of the pod that was snapshotted; read from the API (its uid, node, containers and spec).
    type: str
  containers:
    description: Containers of the pod the snapshot holds; empty means all of them.
    type: list
    elements: str
    default: []
  scope:
    description:
      - V(whole-pod) restores only into pods with the same condensed pod-spec hash; V(rootfs-only) skips the hash.
    type: str
    choices: [whole-pod, rootfs-only]
    default: whole-pod
  policy_name:
    description: The PodSnapshotPolicy that made this snapshot, if any.
    type: str
  labels:
    description:
      - Labels of the PodSnapshot. By default the source pod's labels, so that grouping by label values finds it.
    type: dict
  content_name:
    description:
      - Name of the PodSnapshotContent. Default C(<namespace>-<name>-<first 8 hex of the PodSnapshot uid>), one per
        incarnation of the PodSnapshot.
    type: str
  store:
    description:
      - Where the artifact lives. Needed to create the PodSnapshotContent, and so for O(ready=true).
    type: dict
    suboptions:
      url:
        description: The store (a directory every node mounts, or V(s3://bucket/prefix)).
        type: str
        required: true
      snapshot_id:
        description: The snapshot id in the store.
        type: str
        required: true
      path:
        description: The snapshot's directory or key prefix in the store.
        type: str
  node:
    description: Node the snapshot was taken on; default the source pod's C(spec.nodeName).
    type: str
  source_node:
    description:
      - What the source node was - the C(source) section of the snapshot's manifest
        (C(arch), C(kernel), C(cpu_vendor), C(cpu_flags_hash), C(hostname); GPU as C(gpu_driver) and C(gpu_models)
        or C(gpu) with C(driver) and C(models)); camelCase keys (C(cpuHash), C(cpuVendor), C(gpuDriver),
        C(gpuModels)) are accepted too. Recorded in the content's C(status.source) with the pod's image.
    type: dict
    default: {}
  size:
    description: Bytes in the snapshot (C(status.size)).
    type: int
  created_at:
    description: When the snapshot was taken (RFC 3339); default the time it was first recorded.
    type: str
  ready:
    description:
      - V(true) sets condition C(Ready) True (the snapshot can be restored from) and C(Failed) False.
      - V(false) with O(failed_reason) sets C(Failed) True and C(Ready) False; without it the snapshot is in
        progress (C(Ready) False, reason C(SnapshotInProgress)).
    type: bool
    default: true
  failed_reason:
    description:
      - CamelCase reason of a failed snapshot (for example V(CheckpointFailed)); with O(state=present) it needs
        O(ready=false); O(state=failed) requires it.
    type: str
  failed_message:
    description: What went wrong, for people.
    type: str
  max_attempts:
    description:
      - Capture attempts a request gets, for O(state=capturing) and O(state=failed); the attempt that reaches it
        makes the request Failed when it fails.
    type: int
    default: 1
  attempt_timeout:
    description:
      - Seconds after which an attempt that was claimed (O(state=capturing)) and never recorded counts as failed
        (its agent stopped), so that the next O(state=capturing) may claim another one.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 3600
seealso:
  - module: warmstart.snapshot.restore_pod
  - module: warmstart.snapshot.k8s_crds
  - module: warmstart.snapshot.checkpoint
  - module: warmstart.snapshot.pod_snapshot_trigger
"""

EXAMPLES = r"""
- name: Record the snapshot of pod embed-0 after the checkpoint
  warmstart.snapshot.pod_snapshot:
    namespace: inference
    name: embed-20261202
    source_pod: embed-0
    containers: [server]
    store:
      url: s3://snapshots/prod
      snapshot_id: "{{ ckpt.snapshot.id }}"
      path: "{{ ckpt.snapshot.path }}"
    source_node: "{{ ckpt.snapshot.source_node }}"
    size: "{{ ckpt.snapshot.size }}"
  delegate_to: localhost
  register: record

- name: Record a checkpoint that failed
  warmstart.snapshot.pod_snapshot:
    namespace: inference
    name: embed-20261202
    source_pod: embed-0
    ready: false
    failed_reason: CheckpointFailed
    failed_message: "{{ ckpt.msg }}"
  delegate_to: localhost

- name: Claim a capture attempt of a PodSnapshot request (three attempts in all)
  warmstart.snapshot.pod_snapshot:
    namespace: inference
    name: embed-request
    state: capturing
    max_attempts: 3
  register: attempt

- name: Record that this attempt failed (retried while attempts are left)
  warmstart.snapshot.pod_snapshot:
    namespace: inference
    name: embed-request
    state: failed
    failed_reason: CheckpointFailed
    failed_message: "{{ ckpt.msg }}"
    max_attempts: 3
  when: attempt.claimed and ckpt is failed

- name: Forget it (the PodSnapshot and its content)
  warmstart.snapshot.pod_snapshot:
    namespace: inference
    name: embed-20261202
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
pod_snapshot:
  description: The PodSnapshot as the API server returned it (as it would be, in check mode); null when absent.
  returned: always
  type: dict
  sample: {metadata: {name: embed-20261202, namespace: inference}, spec: {source: {podRef: {name: embed-0}}}}
pod_snapshot_content:
  description: The PodSnapshotContent it is bound to; null when there is none (no O(store) yet, or absent).
  returned: always
  type: dict
  sample: {metadata: {name: inference-embed-20261202-1a2b3c4d}, spec: {store: {url: s3://snapshots/prod}}}
status:
  description: The PodSnapshot's status (bound content, podSpecHash, size, createdAt, lastAccessTime, attempts,
    lastAttemptTime, lastError, conditions).
  returned: always
  type: dict
  sample:
    boundSnapshotContentName: inference-embed-20261202-1a2b3c4d
    podSpecHash: 5f2c0c7b9e0b3a4d8c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c
    conditions: [{type: Ready, status: "True", reason: SnapshotReady}]
actions:
  description: What was done (or would be in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: ["created PodSnapshot inference/embed-20261202", "created PodSnapshotContent inference-embed-20261202-1a2b3c4d"]
claimed:
  description: With O(state=capturing) - whether this task claimed an attempt (then capture now).
  returned: when O(state=capturing)
  type: bool
  sample: true
attempt:
  description: The attempt claimed (O(state=capturing)) or recorded as failed (O(state=failed)).
  returned: when O(state) is capturing or failed
  type: int
  sample: 2
max_attempts:
  description: O(max_attempts).
  returned: when O(state) is capturing or failed
  type: int
  sample: 3
reason:
  description: With O(state=capturing) - why no attempt was claimed (null when one was).
  returned: when O(state=capturing)
  type: str
  sample: attempt 1 is in progress since 2026-12-02T12:00:00Z
final:
  description: With O(state=failed) - whether the request is Failed now (no attempt left).
  returned: when O(state=failed)
  type: bool
  sample: false
pending:
  description: Deleted objects that wait for their finalizers.
  returned: when O(state=absent)
  type: list
  elements: str
  sample: []
reasons:
  description: Every reason a request was refused.
  returned: on failure
  type: list
  elements: str
  sample: ["PodSnapshotContent x points back to uid 'a', but PodSnapshot ns/y has uid 'b' (the PodSnapshot was deleted and created again)"]
"""

import functools

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_snapshot
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", required=True),
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent", "capturing", "failed"], default="present"),
            source_pod=dict(type="str"),
            containers=dict(type="list", elements="str", default=[]),
            scope=dict(type="str", choices=["whole-pod", "rootfs-only"], default="whole-pod"),
            policy_name=dict(type="str"),
            labels=dict(type="dict"),
            content_name=dict(type="str"),
            store=dict(type="dict", options=dict(
                url=dict(type="str", required=True),
                snapshot_id=dict(type="str", required=True),
                path=dict(type="str"),
            )),
            node=dict(type="str"),
            source_node=dict(type="dict", default={}),
            size=dict(type="int"),
            created_at=dict(type="str"),
            ready=dict(type="bool", default=True),
            failed_reason=dict(type="str"),
            failed_message=dict(type="str"),
            max_attempts=dict(type="int", default=1),
            attempt_timeout=dict(type="raw", default=3600),
        ),
        required_if=[("state", "present", ["source_pod"])],
        supports_check_mode=True,
    )
    run_module(module, functools.partial(_pod_snapshot.run, diff=module._diff))


if __name__ == "__main__":
    main()
