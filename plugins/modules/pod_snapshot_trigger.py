#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: pod_snapshot_trigger
short_description: Carry out a PodSnapshotManualTrigger - its PodSnapshot request, then its Triggered condition
version_added: 0.2.0
description:
  - A C(PodSnapshotManualTrigger) (as GKE's) asks for one snapshot of the pod C(spec.targetPod) of its namespace
    now, optionally under the PodSnapshotPolicy C(spec.policyName) and of the containers C(spec.containers).
  - Each run is one idempotent pass over the trigger O(namespace)/O(name) - meant for the node agent's
    C(manual_trigger) events and resyncs. It creates the trigger's PodSnapshot B(request) (named
    C(<trigger>-<first 8 hex of the trigger's uid>), with the target pod's uid, labels and the annotations
    C(snapshot.warmstart.io/trigger) and C(snapshot.warmstart.io/trigger-uid)) and records its name in
    C(status.snapshotCreated.name); the agent then captures that request on the pod's node and binds it
    (M(warmstart.snapshot.pod_snapshot)).
  - Once the PodSnapshot is Ready, the trigger's condition C(Triggered) becomes C(True), reason C(Complete); when it
    has Failed, C(False), reason C(Failed), with its reason and message. A target pod or policy that does not exist,
    a PodSnapshot of that name that another trigger or a user made, or one deleted before it became Ready fail the
    trigger at once with the cause. A trigger that has its C(Triggered) condition is left as it is (RV(phase) says
    how it ended).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.attributes.api
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Reads the trigger, the pod and the PodSnapshot and reports what would be created or set.
  diff_mode:
    support: full
    description: Returns the trigger and its PodSnapshot before and after, without the metadata the API server keeps; RV(actions) lists the changes.
options:
  namespace:
    description: Namespace of the trigger (and of its pod and PodSnapshot).
    type: str
    required: true
  name:
    description: Name of the PodSnapshotManualTrigger.
    type: str
    required: true
seealso:
  - module: warmstart.snapshot.pod_snapshot
  - module: warmstart.snapshot.k8s_crds
"""

EXAMPLES = r"""
- name: Create the PodSnapshot request of a manual trigger (or finish the trigger once it is Ready or Failed)
  warmstart.snapshot.pod_snapshot_trigger:
    namespace: inference
    name: embed-now
  register: trigger

- name: Say which PodSnapshot it made
  ansible.builtin.debug:
    msg: "{{ trigger.pod_snapshot_name }} is {{ trigger.phase }}"
"""

RETURN = r"""
phase:
  description: V(pending) (the PodSnapshot is not Ready yet), V(complete) or V(failed).
  returned: always
  type: str
  sample: pending
pod_snapshot_name:
  description: The PodSnapshot the trigger created (null when it failed before creating one).
  returned: always
  type: str
  sample: embed-now-1a2b3c4d
trigger:
  description: The trigger as the API server returned it (as it would be, in check mode).
  returned: always
  type: dict
  sample: {spec: {targetPod: embed-0}, status: {snapshotCreated: {name: embed-now-1a2b3c4d}}}
pod_snapshot:
  description: The trigger's PodSnapshot (null when there is none).
  returned: always
  type: dict
  sample: {metadata: {name: embed-now-1a2b3c4d}, spec: {source: {podRef: {name: embed-0}}}}
actions:
  description: What was done (or would be in check mode), in order.
  returned: always
  type: list
  elements: str
  sample:
    - created PodSnapshot inference/embed-now-1a2b3c4d (a request)
    - recorded snapshotCreated embed-now-1a2b3c4d on PodSnapshotManualTrigger inference/embed-now
"""

import functools

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _pod_snapshot_trigger
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", required=True),
            name=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )
    run_module(module, functools.partial(_pod_snapshot_trigger.run, diff=module._diff))


if __name__ == "__main__":
    main()
