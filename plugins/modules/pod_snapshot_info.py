#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: pod_snapshot_info
short_description: List PodSnapshots with their contents, and what grouping retention would remove
version_added: 0.1.0
description:
  - Reads the PodSnapshots of a namespace (one by O(name), or those matching O(label_selector)) and the
    PodSnapshotContent each is bound to, and returns a summary of each - readiness, creation time, labels, source
    pod and node, and where the artifact lives in the store.
  - With O(keep_last) it also returns C(expired) - the Ready PodSnapshots beyond the O(keep_last) newest of their
    group (the values of the O(group_by) labels, as C(snapshotGroupingRules.groupByLabelValue) of a
    PodSnapshotPolicy; without O(group_by), one group per source pod), oldest first. It removes nothing. The
    playbook C(warmstart.snapshot.k8s_snapshot) deletes those records with M(warmstart.snapshot.pod_snapshot)
    and their store snapshots with M(warmstart.snapshot.cleanup).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.attributes.api
  - warmstart.snapshot.attributes.info
  - warmstart.snapshot.attributes
options:
  namespace:
    description: Namespace of the PodSnapshots.
    type: str
    default: default
  name:
    description: One PodSnapshot by name.
    type: str
  label_selector:
    description: Label selector on the PodSnapshots.
    type: str
  policy:
    description:
      - Also read this PodSnapshotPolicy of O(namespace) and return what it asks of a snapshot run (RV(policy)) -
        its label selector as a query string, store, trigger, post-checkpoint action, scope and grouping rules.
    type: str
  keep_last:
    description: PodSnapshots to keep per group, newest first; V(0) computes no retention.
    type: int
    default: 0
  group_by:
    description: Label keys whose values form a group for O(keep_last).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Keep the three newest snapshots per model
  warmstart.snapshot.pod_snapshot_info:
    namespace: ml
    group_by: [model]
    keep_last: 3
  register: snaps

- name: Show what would go
  ansible.builtin.debug:
    msg: "{{ snaps.expired | map(attribute='name') }}"
"""

RETURN = r"""
snapshots:
  description: One summary per PodSnapshot.
  returned: always
  type: list
  elements: dict
  sample:
    - namespace: ml
      name: embed-0-20261202t124302z-f6ccdab5
      uid: 0e7d...
      labels: {model: minilm}
      ready: true
      created_at: "2026-12-02T12:43:02Z"
      content: ml-embed-0-20261202t124302z-f6ccdab5-0e7d1c2a
      size: 361758720
      pod_spec_hash: 5f0c3e...
      source_pod: embed-0
      node: gpu-01
      store: {url: /mnt/snapshots, snapshot_id: 20261202T124302Z-f6ccdab5, path: /mnt/snapshots/snapshots/20261202T124302Z-f6ccdab5}
policy:
  description: With O(policy) - its settings in the terms of the playbook C(warmstart.snapshot.k8s_snapshot).
  returned: always
  type: dict
  sample: {name: embed, selector: "app=embed,tier in (gold)", store_url: /mnt/snapshots, wait_ready: true,
           leave_running: true, scope: whole-pod, group_by: [model], max_per_group: 3, last_access_timeout: 72h}
expired:
  description: With O(keep_last) - the summaries of the PodSnapshots retention removes, each with its C(reason).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils import _k8s_runners
from ansible_collections.warmstart.snapshot.plugins.module_utils._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils._k8s_client import auth_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", default="default"),
            name=dict(type="str"),
            label_selector=dict(type="str"),
            policy=dict(type="str"),
            keep_last=dict(type="int", default=0),
            group_by=dict(type="list", elements="str", default=[]),
        ),
        mutually_exclusive=[("name", "label_selector")],
        supports_check_mode=True,
    )
    run_module(module, _k8s_runners.run_pod_snapshot_info)


if __name__ == "__main__":
    main()
