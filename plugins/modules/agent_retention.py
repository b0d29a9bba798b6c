#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: agent_retention
short_description: Apply every PodSnapshotPolicy's retention to this node's snapshots - the node agent's step
version_added: 0.2.0
description:
  - What the node agent (the rulebook C(warmstart.snapshot.node_agent)) runs for each C(retention) event of
    C(warmstart.snapshot.k8s_events) (every C(retention_seconds) of that event source), so
    that a policy's grouping rules (C(snapshotGroupingRules), the newest C(maxSnapshotCountPerGroup) Ready
    PodSnapshots of each group are kept) and C(retentionConfig.lastAccessTimeout) (a PodSnapshot not restored
    from, or never restored from and not created, within it goes) hold as time passes, not only when the
    C(warmstart.snapshot.k8s_snapshot) playbook runs.
  - Every agent computes the same expired set from the API and removes only the snapshots taken on its own node
    (the PodSnapshotContent's C(source.nodeName)) - the PodSnapshot and its contents first, then the snapshot in
    the store the content names - so no two agents remove one snapshot.
  - A PodSnapshot that a restore pod still waits for or restores from is kept, and RV(kept) says so.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.store.options
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Says what it would remove; writes nothing to the API or the store.
  platform:
    description: A Kubernetes node with API access and access to the stores its snapshots are in.
options:
  namespaces:
    description: The namespaces whose PodSnapshotPolicies apply; empty means all.
    type: list
    elements: str
    default: []
  node_name:
    description: This node's name; only the snapshots taken on it are removed. Default E(NODE_NAME).
    type: str
notes:
  - O(store_options), when given, open every store instead of the options of each policy's storage config.
"""

EXAMPLES = r"""
- name: Apply the policies' retention to this node's snapshots (the node agent's playbook does this)
  warmstart.snapshot.agent_retention:
    node_name: "{{ lookup('ansible.builtin.env', 'NODE_NAME') }}"
    namespaces: [ml]
"""

RETURN = r"""
removed:
  description: The PodSnapshots removed (would be removed, in check mode), with the policy and why.
  returned: always
  type: list
  elements: dict
  sample:
    - namespace: ml
      name: embed-20261207-0100
      policy_name: embed
      reason: "not restored from for 3d (last_access_timeout=72h)"
      store: {url: "s3://snapshots/fleet", snapshot_id: "20261204T010000Z-1a2b3c4d", path: null}
      bytes_freed: 2147483648
kept:
  description: Expired PodSnapshots kept because a restore pod still restores from them, and why.
  returned: always
  type: list
  elements: dict
policies:
  description: How many PodSnapshotPolicies were looked at.
  returned: always
  type: int
  sample: 2
errors:
  description: What could not be removed (the task then fails, after the others were removed).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _agent_retention
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec, store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            namespaces=dict(type="list", elements="str", default=[]),
            node_name=dict(type="str", fallback=(env_fallback, ["NODE_NAME"])),
            store_options=store_argument_spec()["store_options"],
        ),
        supports_check_mode=True,
    )
    run_module(module, _agent_retention.run)


if __name__ == "__main__":
    main()
