#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: agent_capture
short_description: Capture one requested PodSnapshot on this node - the node agent's step
version_added: 0.2.0
description:
  - What the node agent (the rulebook C(warmstart.snapshot.node_agent)) runs for the C(capture_request),
    C(manual_trigger) and C(source_ready) events of C(warmstart.snapshot.k8s_events).
  - A PodSnapshot without a bound content is a request (by a user, a PodSnapshotManualTrigger, or the agent). With
    O(name), that request is captured; with O(pod) and O(policy), the request for that policy's source pod is
    created first (named C(<pod>-<policy>-<hash of the pod uid>), so one per pod incarnation) and captured; with
    O(trigger), the trigger's request.
  - The request is read as the API server has it now; one that is bound, Ready or Failed is left alone. The
    attempt is claimed with a write guarded by the PodSnapshot's resourceVersion (annotations
    C(snapshot.warmstart.io/capture-attempt) and C(capture-attempts)), so of two agents only one captures.
  - The source pod's container is checkpointed on this node (as M(warmstart.snapshot.checkpoint) with C(pod:)
    does), into O(store) or the store of the request's policy; the policy's trigger decides whether to wait for
    C(ready-for-snapshot) and its C(postCheckpoint) whether the source keeps running.
  - On success the request is bound to a new PodSnapshotContent and Ready. A failed capture leaves the source
    running; it is retried on the next event (the condition C(Ready) says C(CaptureRetrying) and why) until
    O(max_attempts) attempts failed, then the request is C(Failed) with the last cause. A request whose source pod
    is gone or was replaced is C(Failed) at once.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.store.options
  - warmstart.snapshot.store.criu
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Says whether it would capture or fail the request; creates, claims and checkpoints nothing.
  platform:
    description: A Kubernetes node with CRIU >= 4.2 (see P(warmstart.snapshot.node_prep#role)) and API access.
options:
  namespace:
    description: The namespace of the request (and of O(pod) and O(policy)).
    type: str
    default: default
  name:
    description: The PodSnapshot request to capture.
    type: str
  pod:
    description: A source pod a PodSnapshotPolicy selects (with O(policy)); its request is created when missing.
    type: str
  policy:
    description: The PodSnapshotPolicy that selects O(pod).
    type: str
  trigger:
    description:
      - A PodSnapshotManualTrigger - its PodSnapshot request is created (as M(warmstart.snapshot.pod_snapshot_trigger)
        does) and captured, and the trigger's C(Triggered) condition set from the outcome.
    type: str
  node_name:
    description: This node's name; a request whose source pod runs elsewhere is skipped. Default E(NODE_NAME).
    type: str
  agent_id:
    description: Who claims the request (written into its annotation); default O(node_name).
    type: str
  max_attempts:
    description: Failed captures of one request before it is marked C(Failed).
    type: int
    default: 3
  ready_timeout:
    description:
      - Seconds to wait for C(ready-for-snapshot) when the policy's trigger is C(workload).
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 300
  runtime:
    description: The container runtime that runs the pod's containers; V(auto) asks each installed one.
    type: str
    choices: [podman, containerd, auto]
    default: auto
  store:
    description: The snapshot store to capture into; default the request's policy's store.
    type: str
  metrics_dir:
    description: Where the node's Prometheus metrics are kept; default E(WARMSTART_METRICS_DIR); unset means none.
    type: path
"""

EXAMPLES = r"""
- name: Capture the PodSnapshot a user asked for (the node agent's playbook does this)
  warmstart.snapshot.agent_capture:
    namespace: ml
    name: embed-warm
    store: /mnt/snapshots

- name: Capture a policy's source pod once it is ready
  warmstart.snapshot.agent_capture:
    namespace: ml
    pod: embed-0
    policy: embed-policy
"""

RETURN = r"""
action:
  description: V(skipped), V(captured), V(will retry), V(failed) (V(would capture), V(would fail) in check mode).
  returned: always
  type: str
  sample: captured
pod_snapshot_ref:
  description: The request (a PodSnapshot), as C(namespace/name).
  returned: when a request was found or created
  type: str
  sample: ml/embed-warm
snapshot_id:
  description: The id of the snapshot in the store.
  returned: when captured
  type: str
attempts:
  description: How many attempts this request has had, this one included.
  returned: when claimed
  type: int
reason:
  description: Why the request was skipped.
  returned: when skipped
  type: str
reasons:
  description: Why the attempt failed.
  returned: when it failed
  type: list
  elements: str
requested:
  description: The request made for O(pod) and O(policy) (C(pod_snapshot_name), C(created)), or for O(trigger).
  returned: with O(pod) and O(policy), or O(trigger)
  type: dict
trigger_phase:
  description: The trigger's phase after the capture (V(pending), V(complete), V(failed)).
  returned: with O(trigger)
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _agent_capture
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec, runtime_option, store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", default="default"),
            name=dict(type="str"),
            pod=dict(type="str"),
            policy=dict(type="str"),
            trigger=dict(type="str"),
            node_name=dict(type="str", fallback=(env_fallback, ["NODE_NAME"])),
            agent_id=dict(type="str"),
            max_attempts=dict(type="int", default=3),
            ready_timeout=dict(type="raw", default=300),
            runtime=runtime_option(),
            store=dict(type="str"),
            store_options=store_argument_spec()["store_options"],
            criu_path=dict(type="path"),
            metrics_dir=dict(type="path"),
        ),
        required_one_of=[("name", "pod", "trigger")],
        required_together=[("pod", "policy")],
        mutually_exclusive=[("name", "pod", "trigger")],
        supports_check_mode=True,
    )
    run_module(module, _agent_capture.run)


if __name__ == "__main__":
    main()
