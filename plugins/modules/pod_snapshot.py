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
  - The records are returned in every case (RV(snapshot), RV(content), RV(status)).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.attributes.api
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Reads the source pod and both records and reports what would be created or changed.
  diff_mode:
    description: No diff; RV(actions) lists the changes.
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
    description: Whether the records should exist.
    type: str
    choices: [present, absent]
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
    description: CamelCase reason of a failed snapshot (for example V(CheckpointFailed)); needs O(ready=false).
    type: str
  failed_message:
    description: What went wrong, for people.
    type: str
seealso:
  - module: warmstart.snapshot.restore_pod
  - module: warmstart.snapshot.k8s_crds
  - module: warmstart.snapshot.checkpoint
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
    source_node: "{{ ckpt.snapshot.source }}"
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

- name: Forget it (the PodSnapshot and its content)
  warmstart.snapshot.pod_snapshot:
    namespace: inference
    name: embed-20261202
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
snapshot:
  description: The PodSnapshot as the API server returned it (as it would be, in check mode); null when absent.
  returned: always
  type: dict
  sample: {metadata: {name: embed-20261202, namespace: inference}, spec: {source: {podRef: {name: embed-0}}}}
content:
  description: The PodSnapshotContent it is bound to; null when there is none (no O(store) yet, or absent).
  returned: always
  type: dict
  sample: {metadata: {name: inference-embed-20261202-1a2b3c4d}, spec: {store: {url: s3://snapshots/prod}}}
status:
  description: The PodSnapshot's status (bound content, podSpecHash, size, createdAt, conditions).
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_runners
from ansible_collections.warmstart.snapshot.plugins.module_utils._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils._k8s_client import auth_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", required=True),
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
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
        ),
        required_if=[("state", "present", ["source_pod"])],
        supports_check_mode=True,
    )
    run_module(module, _k8s_runners.run_pod_snapshot)


if __name__ == "__main__":
    main()
