#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: pod_info
short_description: Find Kubernetes pods to snapshot or restore into, and wait for them
version_added: 0.1.0
description:
  - Reads pods from the API server - one by O(name), or those matching O(label_selector) / O(field_selector) - and
    keeps those for which the JMESPath expression O(filter) is true.
  - Returns each pod, and a summary of it in the terms of the node-side modules (C(targets)) - namespace, name,
    uid, node, phase, condensed spec hash, and per container its runtime id from the pod's status and whether it
    runs - ready to pass to M(warmstart.snapshot.checkpoint) (O(warmstart.snapshot.checkpoint#module:pod)) or
    M(warmstart.snapshot.restore) (O(warmstart.snapshot.restore#module:into.pod)) delegated to the pod's node.
  - With O(wait_for) it waits until every pod is scheduled, or scheduled with every container running (the
    placeholder of a restore pod), and fails after O(wait_timeout) naming each pod and what it still lacks.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.attributes.api
  - warmstart.snapshot.attributes.info
  - warmstart.snapshot.attributes
options:
  namespace:
    description: Namespace of the pods.
    type: str
    default: default
  name:
    description: One pod by name (then O(label_selector) and O(field_selector) are not used).
    type: str
  label_selector:
    description: Label selector, as C(kubectl get -l) takes it (V(app=embed,tier!=canary)).
    type: str
  field_selector:
    description: Field selector (V(spec.nodeName=gpu-01), V(status.phase=Running)).
    type: str
  filter:
    description:
      - JMESPath expression evaluated on each pod object; pods for which it is false or empty are dropped
        (V(status.phase == 'Running'), V(metadata.annotations."example.com/tier" == 'gold')).
      - Needs the Python library C(jmespath) for the module's interpreter.
    type: str
  wait_for:
    description:
      - V(exists) - at least the named pod exists (with O(name)).
      - V(scheduled) - every pod found has a node.
      - V(running) - every pod found is scheduled and each of its containers runs and has a runtime id.
      - Without it the pods are read once.
    type: str
    choices: [exists, scheduled, running]
  wait_timeout:
    description:
      - Seconds to wait for O(wait_for).
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 120
  wait_sleep:
    description: Seconds between two reads while waiting.
    type: float
    default: 1
"""

EXAMPLES = r"""
- name: Warm embedding pods that say they are ready
  warmstart.snapshot.pod_info:
    namespace: ml
    label_selector: app=embed
    filter: "status.phase == 'Running'"
  register: embed_pods

- name: Snapshot each one on its node
  warmstart.snapshot.checkpoint:
    pod:
      namespace: "{{ item.namespace }}"
      name: "{{ item.name }}"
      uid: "{{ item.uid }}"
      container: main
      spec_hash: "{{ item.spec_hash }}"
    store: /mnt/snapshots
  delegate_to: "{{ item.node_name }}"
  loop: "{{ embed_pods.targets }}"

- name: Wait until the restore pods' placeholders run
  warmstart.snapshot.pod_info:
    namespace: ml
    label_selector: warmstart-restore=embed
    wait_for: running
    wait_timeout: 300
"""

RETURN = r"""
pods:
  description: The pods found, as the API server returned them.
  returned: always
  type: list
  elements: dict
targets:
  description:
    - One summary per pod. For a restore pod (one with a restore-from annotation, ours or C(nvidia.com/restore-from))
      C(pod_outcome) is its outcome by the reference contract's table (V(Pending), V(Succeeded), V(Failed),
      V(PartiallySucceeded), V(Unknown); see M(warmstart.snapshot.restore_pod)), null for other pods.
    - Each of C(containers) says C(name), C(container_id), C(running), C(ready), C(restart_count) and C(volumes),
      where it mounts the pod's C(emptyDir) volumes (what a snapshot takes along, M(warmstart.snapshot.checkpoint)
      O(warmstart.snapshot.checkpoint#module:volumes)).
  returned: always
  type: list
  elements: dict
  sample:
    - namespace: ml
      name: embed-0
      uid: 8d7c1c8e-4f7b-4a40-9b7e-1f1b5a0e2d11
      node_name: gpu-01
      phase: Running
      labels: {app: embed}
      annotations: {}
      spec_hash: 5f0c3e...
      pod_outcome: null
      containers:
        - {name: main, container_id: "podman://0f3a...", running: true, ready: true, restart_count: 0,
           volumes: [/root/.cache]}
reasons:
  description: On a wait that timed out, each pod and what it still lacks.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_info
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_summaries import WAIT_FOR


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", default="default"),
            name=dict(type="str"),
            label_selector=dict(type="str"),
            field_selector=dict(type="str"),
            filter=dict(type="str"),
            wait_for=dict(type="str", choices=list(WAIT_FOR)),
            wait_timeout=dict(type="raw", default=120),
            wait_sleep=dict(type="float", default=1.0),
        ),
        mutually_exclusive=[("name", "label_selector"), ("name", "field_selector")],
        supports_check_mode=True,
    )
    run_module(module, _pod_info.run)


if __name__ == "__main__":
    main()
