#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: restore_pod
short_description: Select snapshots for, create, begin and finish pods that restore from a PodSnapshot
version_added: 0.1.0
description:
  - The restore-pod contract as a module. A restore pod is an ordinary pod that carries the annotation
    C(snapshot.warmstart.io/restore-from) (the PodSnapshot), an C(emptyDir) volume C(snapshot-control) mounted in
    each container at C(/snapshot-control) by C(subPath), the env C(SNAPSHOT_CONTROL_DIR), the inert command
    C(/bin/sh -c 'exec sleep infinity') and the Localhost seccomp profile C(profiles/block-iouring.json);
    optionally a container map, the skip-compat annotation and a startup probe on C(restore-complete).
    A node agent then restores the snapshot into the running placeholder.
  - The reference contract's names are read as aliases of ours - the annotations C(nvidia.com/restore-from),
    C(nvidia.com/restore-container-map), C(nvidia.com/snapshot-skip-compat-check) and the condition
    C(nvidia.com/Restored); a pod that sets one of ours and its alias to different values is refused, naming both.
    What the module writes keeps our names.
  - The module's actions read or write the cluster. The contract's pure steps are filters, which need no API
    server - P(warmstart.snapshot.restore_template#filter) builds a restore pod (or a workload's restore template),
    P(warmstart.snapshot.restore_pod_problems#filter) lists every way a pod falls short of the contract,
    P(warmstart.snapshot.restore_pod_outcome#filter) classifies a restore pod by the reference contract's table
    (M(warmstart.snapshot.pod_info) gives the same C(pod_outcome) for pods it reads).
  - O(action=select) finds the PodSnapshot to restore O(pod) or O(template) from - the newest Ready one in
    O(namespace) whose condensed pod-spec hash and O(grouping_labels) match, or the one its C(restore-from)
    annotation pins - and checks its PodSnapshotContent (bound, backlink uid); a pinned one must have been taken
    from the same pod spec (condensed pod-spec hash) unless the pod skips the compatibility check or O(scope) is
    V(rootfs-only). When none fits it fails with the reasons, naming the fields in which the (nearest) snapshot
    differs.
  - O(action=create) builds the restore pod (from O(snapshot), else from the one O(action=select) finds; anything
    that conflicts with the contract - another restore-from, a different C(snapshot-control) volume, another
    C(SNAPSHOT_CONTROL_DIR), another seccomp profile - fails with every reason instead of being overwritten) and
    creates O(count) of them in O(namespace) - named C(<name_prefix>-<i>), idempotent by name, or with
    C(generateName) when O(name_prefix) is not given. A given O(snapshot) is checked against the pod-spec hash as a
    pinned one is.
  - O(action=begin), once the pod O(namespace)/O(name) is scheduled and its placeholder runs - checks that its
    PodSnapshot is bound to its content (backlink uid, Ready) and was taken from the pod's spec (unless the pod's
    skip-compat annotation is C(true)), and works out the (source, destination container) pairs to restore; then
    adds the finalizer C(snapshot.warmstart.io/restore) and sets the C(Restored) condition to C(False), reason
    C(RestoreInProgress), as the reference contract does. Returns what the node needs (RV(store), RV(pairs), RV(node_name)). A
    pod whose restore already ran is refused - a restore is never replayed; a new pod is needed.
  - O(action=finish) records the node's O(outcome) in the C(Restored) condition (C(RestoreSucceeded),
    C(RestoreFailed), C(RestorePartiallySucceeded), C(RestoreIncompatible)) with O(condition_message), and removes the
    finalizer. After a restore that succeeded (also partly) it writes the PodSnapshot's C(status.lastAccessTime),
    which retention by C(lastAccessTimeout) counts from (M(warmstart.snapshot.pod_snapshot_info)).
  - A pod that selects its snapshot at restore (annotation C(snapshot.warmstart.io/restore-select), from the filter
    P(warmstart.snapshot.restore_template#filter) without a snapshot) gets, at O(action=begin), the newest compatible
    Ready PodSnapshot (with the grouping labels and scope of its C(snapshot.warmstart.io/restore-policy) policy)
    pinned in its C(restore-from) annotation first.
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
    description: O(action=create) reports the pods it would create and creates none; the other actions only read.
  platform:
    description: Any node that reaches the API server.
options:
  action:
    description: What to do (see the description).
    type: str
    choices: [select, create, begin, finish]
    required: true
  pod:
    description: A Pod (as the API returns it, or as a manifest).
    type: dict
  template:
    description: A pod template (C(metadata) and C(spec)), or a workload whose C(spec.template) is one.
    type: dict
  snapshot:
    description:
      - Name of the PodSnapshot to restore from (O(action=create) selects one without it).
    type: str
  container_map:
    description:
      - Which snapshotted container restores into which container of the pod, as V(src=dst,...) or a dict
        a dict mapping each source to its destination; one source may fill several destinations. Default the same
        names.
    type: raw
  skip_compat_check:
    description: Annotate the pod so that the node agent skips the compatibility check (the restore may then fail late).
    type: bool
    default: false
  startup_probe:
    description: Add a startup probe C(cat /snapshot-control/restore-complete) to each destination container.
    type: bool
    default: true
  entrypoint:
    description:
      - How O(action=create) keeps the containers from starting their workload.
      - V(inert) replaces each container's command with C(/bin/sh -c 'exec sleep infinity') (its own command is
        recorded in an annotation, so the pod hashes like its template).
      - V(standby) keeps each container's command and sets the env C(SNAPSHOT_RESTORE_STANDBY=1); only for images
        whose entrypoint honours it by blocking without initialising.
    type: str
    choices: [inert, standby]
    default: inert
  seccomp_profile:
    description: The Localhost seccomp profile (relative to the kubelet's seccomp root) that blocks io_uring.
    type: str
    default: profiles/block-iouring.json
  namespace:
    description:
      - Namespace to select snapshots in or create pods in; default the pod's or template's C(metadata.namespace).
    type: str
  name:
    description: Name of the pod to begin or finish.
    type: str
  outcome:
    description:
      - The result of the node's restore, for O(action=finish), as the M(warmstart.snapshot.restore) module returns
        it; recorded as the C(Restored) reason C(RestoreSucceeded), C(RestoreFailed), C(RestorePartiallySucceeded)
        or C(RestoreIncompatible).
    type: str
    choices: [succeeded, failed, partially_succeeded, incompatible]
  condition_message:
    description: Message of the C(Restored) condition, for O(action=begin) and O(action=finish).
    type: str
    default: ""
  grouping_labels:
    description: Pod label keys whose values a snapshot must share (a PodSnapshotPolicy's grouping labels).
    type: list
    elements: str
    default: []
  scope:
    description: V(rootfs-only) does not compare the pod-spec hash when selecting.
    type: str
    choices: [whole-pod, rootfs-only]
    default: whole-pod
  count:
    description: How many restore pods O(action=create) makes.
    type: int
    default: 1
  name_prefix:
    description:
      - Pods are named C(<name_prefix>-0) ... C(<name_prefix>-<count-1>); an existing pod of that name that restores
        from the same snapshot is kept (idempotent), one that restores from another is refused.
      - Without it each run creates O(count) new pods with C(generateName) (C(<snapshot>-restore-)).
    type: str
  skip_binding_check:
    description:
      - With O(snapshot) given, do not check that it is Ready and bound to a PodSnapshotContent pointing back to it.
    type: bool
    default: false
seealso:
  - module: warmstart.snapshot.pod_snapshot
  - module: warmstart.snapshot.restore
"""

EXAMPLES = r"""
- name: Which snapshot would a new replica restore from?
  warmstart.snapshot.restore_pod:
    action: select
    namespace: inference
    template: "{{ deployment.spec.template }}"
    grouping_labels: [model]
  register: chosen

- name: Three restore pods from the newest matching snapshot
  warmstart.snapshot.restore_pod:
    action: create
    namespace: inference
    template: "{{ deployment.spec.template }}"
    grouping_labels: [model]
    count: 3
    name_prefix: embed-restore
  register: created

- name: How did the restore of embed-restore-0 go? (pod_info reads it; the filter classifies a pod at hand)
  warmstart.snapshot.pod_info:
    namespace: inference
    name: embed-restore-0
  register: restored
  # restored.targets[0].pod_outcome, or: restored.pods[0] | warmstart.snapshot.restore_pod_outcome
"""

RETURN = r"""
pod:
  description: The restore pod as built (O(action=create)), or as it is after the change (O(action=begin), O(action=finish)).
  returned: when O(action) is create, begin or finish
  type: dict
  sample: {metadata: {annotations: {snapshot.warmstart.io/restore-from: embed-20261202}}}
pod_outcome:
  description:
    - Where the restore pod stands, by the reference contract's table over its C(Restored) (or
      C(nvidia.com/Restored)) condition - no condition V(Pending); status C(True) V(Succeeded); status C(False) with
      reason C(RestoreFailed) or C(RestoreIncompatible) V(Failed), C(RestorePartiallySucceeded)
      V(PartiallySucceeded), C(RestoreInProgress) V(Pending); any other status or reason V(Unknown).
  returned: when O(action) is begin or finish
  type: str
  sample: Succeeded
  choices: [Pending, Succeeded, Failed, PartiallySucceeded, Unknown]
losses:
  description:
    - Why the restore is lost although the condition may not say so - the pod's phase is C(Failed), or it ended
      without a restore, or a destination container terminated or restarted after its restore began. A new pod is
      needed then.
  returned: when O(action) is begin or finish
  type: list
  elements: str
  sample: ["container 'main' restarted (1 times) after its restore began"]
pod_snapshot:
  description: The PodSnapshot chosen (O(action=select)) or restored from (O(action=create)).
  returned: when O(action) is select or create
  type: dict
  sample: {metadata: {name: embed-20261202, namespace: inference}}
pod_snapshot_content:
  description: Its PodSnapshotContent (store, node, source).
  returned: when O(action) is select or create
  type: dict
  sample: {spec: {store: {url: s3://snapshots/prod, snapshotId: 20261202T124302Z-f6ccdab5}}}
pods:
  description: The restore pods (created, kept, or would be created in check mode).
  returned: when O(action=create)
  type: list
  elements: dict
  sample: [{metadata: {name: embed-restore-0}}]
actions:
  description: What was created.
  returned: when O(action=create)
  type: list
  elements: str
  sample: ["created Pod inference/embed-restore-0"]
pod_snapshot_name:
  description: The PodSnapshot the pod restores from.
  returned: when O(action=begin)
  type: str
  sample: embed-20261202
content_name:
  description: Its PodSnapshotContent.
  returned: when O(action=begin)
  type: str
  sample: inference-embed-20261202-0e7d1c2a
policy_name:
  description: The PodSnapshotPolicy the snapshot was taken under (null when none).
  returned: when O(action=begin)
  type: str
  sample: embed
store:
  description:
    - Where the artifact lives (the PodSnapshotContent's C(spec.store)) - C(url) (a directory or
      V(s3://bucket/prefix)), C(snapshot_id) and C(path).
  returned: when O(action=begin)
  type: dict
  sample: {url: /mnt/snapshots, snapshot_id: 20261202T124302Z-f6ccdab5, path: null}
pairs:
  description: What to restore into which container of the pod, with its runtime id from the pod's status.
  returned: when O(action=begin)
  type: list
  elements: dict
  sample: [{source: main, container: main, container_id: "containerd://0f3a"}]
node_name:
  description: The node the pod runs on.
  returned: when O(action=begin)
  type: str
  sample: gpu-01
last_access_time:
  description:
    - When O(action=finish) recorded a (partly) successful restore - the time written into the PodSnapshot's
      C(status.lastAccessTime) (what C(retentionConfig.lastAccessTimeout) counts from); null otherwise.
  returned: when O(action=finish)
  type: str
  sample: "2026-12-02T12:44:10Z"
skip_compat_check:
  description: Whether the pod asks to skip the compatibility check (its C(snapshot-skip-compat-check) annotation).
  returned: when O(action=begin)
  type: bool
  sample: false
reasons:
  description: Every reason of a failure (contract conflicts, why no snapshot fits).
  returned: on failure
  type: list
  elements: str
  sample: ["1 Ready PodSnapshot(s) of the pod's group were taken from another pod spec (podSpecHash differs from 5f2c0c7b9e0b)"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore_pod
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            action=dict(type="str", choices=["select", "create", "begin", "finish"], required=True),
            pod=dict(type="dict"),
            template=dict(type="dict"),
            snapshot=dict(type="str"),
            container_map=dict(type="raw"),
            skip_compat_check=dict(type="bool", default=False),
            startup_probe=dict(type="bool", default=True),
            entrypoint=dict(type="str", choices=["inert", "standby"], default="inert"),
            seccomp_profile=dict(type="str", default="profiles/block-iouring.json"),
            namespace=dict(type="str"),
            name=dict(type="str"),
            grouping_labels=dict(type="list", elements="str", default=[]),
            scope=dict(type="str", choices=["whole-pod", "rootfs-only"], default="whole-pod"),
            count=dict(type="int", default=1),
            name_prefix=dict(type="str"),
            skip_binding_check=dict(type="bool", default=False),
            outcome=dict(type="str", choices=["succeeded", "failed", "partially_succeeded", "incompatible"]),
            condition_message=dict(type="str", default=""),
        ),
        mutually_exclusive=[("pod", "template")],
        required_if=[
            ("action", "select", ["pod", "template"], True),
            ("action", "create", ["pod", "template"], True),
            ("action", "begin", ["namespace", "name"]),
            ("action", "finish", ["namespace", "name", "outcome"]),
        ],
        supports_check_mode=True,
    )
    run_module(module, _restore_pod.run)


if __name__ == "__main__":
    main()
