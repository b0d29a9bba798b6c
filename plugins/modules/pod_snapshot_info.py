#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: pod_snapshot_info
short_description: List PodSnapshots with their contents, what retention would remove, and where snapshots go
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
  - With O(last_access_timeout) (a policy's C(retentionConfig.lastAccessTimeout), as GKE's) C(expired) also holds
    the Ready PodSnapshots not restored from within that time - counted from C(status.lastAccessTime), which
    M(warmstart.snapshot.restore_pod) O(warmstart.snapshot.restore_pod#module:action=finish) writes on each
    (partly) successful restore, or from their creation when never restored from. With both rules a
    snapshot goes when either says so, and its C(reason) names each.
  - With O(policy) or O(storage_config), RV(store_url) and RV(store_options) say where snapshots go - the policy's
    C(storeUrl), or the C(PodSnapshotStorageConfig) it names in C(storageConfigName) (or O(storage_config)) with
    its options and the credentials from its C(credentialsSecretRef) Secret (in the Secret's namespace, by default
    O(namespace)). A policy with both C(storeUrl) and C(storageConfigName), or neither, is refused naming both; a
    missing storage config, Secret or key is refused naming the Secret, the key and the storage config.
  - The credentials (C(access_key_id), C(secret_access_key), C(session_token)) are returned in RV(store_options)
    only with O(include_credentials=true) - set C(no_log) on that task; without it RV(credentials_secret)
    names the Secret and nothing of its values is returned.
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
  last_access_timeout:
    description:
      - Expire Ready PodSnapshots not restored from (or, never restored from, not created) within this duration -
        V(72h), V(90m), V(7d), V(1d12h), or seconds.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
  storage_config:
    description:
      - A PodSnapshotStorageConfig to resolve into RV(store_url) and RV(store_options); with O(policy) as well, the
        policy must name this one.
    type: str
  include_credentials:
    description:
      - Return the Secret's credentials in RV(store_options) (for a task that passes them to a store module; set
        C(no_log) on it). Without it they are left out.
    type: bool
    default: false
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

- name: Snapshots not restored from for three days
  warmstart.snapshot.pod_snapshot_info:
    namespace: ml
    last_access_timeout: 72h
  register: idle

- name: Where the embed policy stores snapshots, with the credentials of its storage config
  warmstart.snapshot.pod_snapshot_info:
    namespace: ml
    policy: embed
    include_credentials: true
  register: where
  no_log: true

- name: Checkpoint into that store
  warmstart.snapshot.checkpoint:
    pod: {namespace: ml, name: embed-0, container: server}
    store: "{{ where.store_url }}"
    store_options: "{{ where.store_options }}"
  no_log: true
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
      content_name: ml-embed-0-20261202t124302z-f6ccdab5-0e7d1c2a
      size: 361758720
      pod_spec_hash: 5f0c3e...
      source_pod: embed-0
      node_name: gpu-01
      store: {url: /mnt/snapshots, snapshot_id: 20261202T124302Z-f6ccdab5, path: /mnt/snapshots/snapshots/20261202T124302Z-f6ccdab5}
      failed: false
      policy_name: embed
      last_access_time: "2026-12-03T08:00:00Z"
      attempts: 1
      last_error: null
policy:
  description: With O(policy) - its settings in the terms of the playbook C(warmstart.snapshot.k8s_snapshot).
  returned: always
  type: dict
  sample: {name: embed, selector: "app=embed,tier in (gold)", store_url: /mnt/snapshots, wait_ready: true,
           leave_running: true, scope: whole-pod, group_by: [model], max_per_group: 3, last_access_timeout: 72h,
           storage_config: null}
expired:
  description:
    - With O(keep_last) or O(last_access_timeout) - the summaries of the PodSnapshots retention removes, each with
      its C(reason).
  returned: always
  type: list
  elements: dict
store_url:
  description: With O(policy) or O(storage_config) - the store snapshots go to (a directory or V(s3://bucket/prefix)).
  returned: always
  type: str
  sample: s3://snapshots/prod
store_options:
  description:
    - With O(policy) or O(storage_config) - the store's options as the store modules take them (C(endpoint_url),
      C(region), C(profile), C(cache_dir), C(concurrency)), and with O(include_credentials) C(access_key_id),
      C(secret_access_key) and C(session_token) from the Secret.
  returned: always
  type: dict
  sample: {endpoint_url: "http://minio.storage:9000", region: us-east-1}
storage_config:
  description: The PodSnapshotStorageConfig the store came from (null for a policy's inline C(storeUrl)).
  returned: always
  type: str
  sample: shared-s3
credentials_secret:
  description: C(namespace/name) of the Secret the credentials come from (null without one).
  returned: always
  type: str
  sample: warmstart/s3-credentials
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_snapshot_info
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec


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
            last_access_timeout=dict(type="raw"),
            storage_config=dict(type="str"),
            include_credentials=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("name", "label_selector")],
        supports_check_mode=True,
    )
    run_module(module, _pod_snapshot_info.run)


if __name__ == "__main__":
    main()
