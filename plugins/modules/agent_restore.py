#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: agent_restore
short_description: Restore one restore pod on this node, once - the node agent's step
version_added: 0.2.0
description:
  - What the node agent (the rulebook C(warmstart.snapshot.node_agent)) runs for each C(restore_pod) event of
    C(warmstart.snapshot.k8s_events). It reads the pod O(namespace)/O(name) as the API server has it now and
    decides from that, so a repeated, stale or replayed event changes nothing.
  - A pod whose PodSnapshot does not exist or is not Ready yet waits - its C(Restored) condition is C(False),
    reason C(RestoreInProgress), with a message starting C(waiting:) - and is tried again on the next event.
  - Otherwise the pod's one restore attempt is claimed - the annotation C(snapshot.warmstart.io/restore-attempt)
    and the finalizer C(snapshot.warmstart.io/restore), in one write guarded by the pod's resourceVersion, so of
    two agents only one restores a pod - and the snapshot is restored into the pod's placeholder containers on
    this node, as M(warmstart.snapshot.restore) with C(into.pod) does - checksums and compatibility first. The
    outcome goes into the C(Restored) condition and the finalizer is released.
  - A snapshot that cannot go into the pod (another pod spec, a broken binding) is recorded as
    C(RestoreIncompatible) with every reason; nothing is touched.
  - A failed restore kills the placeholder (the kubelet restarts it; a new pod is needed), unless the pod asks
    for a cold start (annotation C(snapshot.warmstart.io/restore-fallback=cold-start), or O(fallback)) - then the
    placeholder keeps running and C(cold-start) is written into its snapshot-control dir, where a standby-aware
    entrypoint (C(SNAPSHOT_RESTORE_STANDBY=1)) starts the app cold; the condition's message says so.
  - A pod this agent claimed but did not record (the agent was killed or restarted) is never restored again; the
    outcome is read from the node - C(restore-complete) in the control dir is success, anything else is a
    failure and the placeholder is killed (or started cold); a restore still running is waited for.
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
    description: Says what it would do (wait, refuse, restore, recover); writes nothing to the API or the node.
  platform:
    description: A Kubernetes node with CRIU >= 4.2 (see P(warmstart.snapshot.node_prep#role)) and API access.
options:
  namespace:
    description: The pod's namespace.
    type: str
    default: default
  name:
    description: The pod's name.
    type: str
    required: true
  uid:
    description: The pod's uid when the event was emitted; a pod of that name with another uid is skipped.
    type: str
  node_name:
    description: This node's name; a pod on another node is skipped. Default E(NODE_NAME).
    type: str
  agent_id:
    description:
      - Who claims the pod (written into the attempt annotation). Stable across restarts of the agent, so that a
        restarted agent recovers its own attempts; default O(node_name).
    type: str
  fallback:
    description: What a failed or refused restore does when the pod's annotation does not say.
    type: str
    choices: [none, cold-start]
    default: none
  runtime:
    description: The container runtime that runs the pod's containers; V(auto) asks each installed one.
    type: str
    choices: [podman, containerd, auto]
    default: auto
  store:
    description:
      - The snapshot store; default the one the PodSnapshotContent names, opened with the options of the
        snapshot's PodSnapshotPolicy (its PodSnapshotStorageConfig's options and credentials Secret, as the
        capture used them; O(store_options) when the policy's store has none). A policy whose Secret cannot be
        read refuses the restore, naming the Secret.
    type: str
  restore_root:
    description: Where restore work dirs go on this node (default as M(warmstart.snapshot.restore)).
    type: path
  lazy:
    description:
      - Restore lazily (M(warmstart.snapshot.restore) O(warmstart.snapshot.restore#module:lazy)) - each container's
        tree runs as soon as CRIU restored it, C(restore-complete) is written (the startup probe passes, the pod
        serves) while its memory is streamed in from the same verified images.
      - The pod's C(Restored) condition is set once memory is complete - or C(RestoreFailed), the tree and the
        placeholder killed, should the lazy-pages daemon fail or memory not be complete within 600 seconds.
      - Where the node lacks userfaultfd, or the snapshot holds GPU state, the restore is eager.
    type: bool
    default: false
  running_timeout:
    description:
      - Seconds to wait for a restore of a recovered pod that still runs on this node.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 900
  metrics_dir:
    description:
      - Where the node's Prometheus metrics are kept (node_exporter's textfile collector format); each restore,
        refusal or recovery is counted by outcome, with its phases, the snapshot's age and RV(ready_seconds).
        Default E(WARMSTART_METRICS_DIR); neither set means no metrics.
    type: path
"""

EXAMPLES = r"""
- name: Restore the pod the event names (the node agent's playbook does this)
  warmstart.snapshot.agent_restore:
    namespace: "{{ ansible_eda.event.warmstart.namespace }}"
    name: "{{ ansible_eda.event.warmstart.name }}"
    uid: "{{ ansible_eda.event.warmstart.uid }}"
    node_name: "{{ lookup('ansible.builtin.env', 'NODE_NAME') }}"
    fallback: cold-start
"""

RETURN = r"""
action:
  description: What was done - V(skipped), V(waiting), V(refused), V(restored), V(recovered) (V(would ...) in check mode).
  returned: always
  type: str
  sample: restored
reason:
  description: Why the pod was skipped.
  returned: when skipped
  type: str
  sample: its restore already ran (Succeeded)
reasons:
  description: Why the pod waits, or why its snapshot was refused.
  returned: when waiting or refused
  type: list
  elements: str
pod_ref:
  description: The pod, as C(namespace/name).
  returned: always
  type: str
  sample: ml/embed-restore-0
outcome:
  description:
    - The node's restore outcome (V(succeeded), V(failed), V(partially_succeeded), V(incompatible)), as
      M(warmstart.snapshot.restore) returns it; null when no restore was attempted (skipped, waiting, check mode).
  returned: always
  type: str
  sample: succeeded
pod_outcome:
  description:
    - Where the pod stands by the reference contract's table (V(Pending), V(Succeeded), V(Failed),
      V(PartiallySucceeded), V(Unknown); see RV(warmstart.snapshot.restore_pod#module:pod_outcome)) - after the
      outcome was recorded, or while it waits or is skipped; absent when recovering in check mode.
  returned: when skipped, waiting, would refuse or restore, or when the outcome was recorded
  type: str
  sample: Succeeded
pod_snapshot_name:
  description: The PodSnapshot restored from.
  returned: when restored
  type: str
  sample: embed-20261202
message:
  description: What the Restored condition says.
  returned: when restored or recovered
  type: str
seconds:
  description: Seconds the node's restore took.
  returned: when restored
  type: float
ready_seconds:
  description: Seconds from the moment the pod's placeholder containers were all running to the restore's completion.
  returned: when restored and the pod's status says when its containers started
  type: float
snapshot_age_seconds:
  description: The PodSnapshot's age in seconds (from its C(createdAt)) at the restore.
  returned: when restored
  type: float
restore:
  description: The node's restore result (as M(warmstart.snapshot.restore) returns it).
  returned: when restored
  type: dict
recorded:
  description: Whether the outcome was written to the pod (a failure to write it is in RV(record_error)).
  returned: when refused, restored or recovered
  type: bool
record_error:
  description: Why the outcome could not be written to the pod (the API server refused or was unreachable).
  returned: when RV(recorded) is false
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _agent_restore
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec, runtime_option, store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespace=dict(type="str", default="default"),
            name=dict(type="str", required=True),
            uid=dict(type="str"),
            node_name=dict(type="str", fallback=(env_fallback, ["NODE_NAME"])),
            agent_id=dict(type="str"),
            fallback=dict(type="str", choices=["none", "cold-start"], default="none"),
            runtime=runtime_option(),
            store=dict(type="str"),
            store_options=store_argument_spec()["store_options"],
            criu_path=dict(type="path"),
            restore_root=dict(type="path"),
            lazy=dict(type="bool", default=False),
            running_timeout=dict(type="raw", default=900),
            metrics_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    run_module(module, _agent_restore.run)


if __name__ == "__main__":
    main()
