#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_crds
short_description: Install, update or remove the warmstart CustomResourceDefinitions
version_added: 0.1.0
description:
  - Creates each CustomResourceDefinition of O(definitions) that is missing and updates each one whose spec, labels
    or annotations differ from the definition (values the API server added as defaults are no difference).
  - With O(state=absent) deletes them; the API server then deletes every object of those kinds.
  - The P(warmstart.snapshot.k8s_crds#role) role calls it with the collection's own definitions
    (PodSnapshot, PodSnapshotContent, PodSnapshotPolicy, PodSnapshotManualTrigger, PodSnapshotStorageConfig).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.k8s_auth
  - warmstart.snapshot.attributes.api
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Reads the CRDs and reports what would be created, updated or deleted; changes nothing.
  diff_mode:
    support: full
    description: Returns the spec of each CRD before and after.
options:
  definitions:
    description:
      - The CustomResourceDefinitions (C(apiextensions.k8s.io/v1)), as dicts; a C(v1) C(List) stands for its
        C(items). For example C(lookup('ansible.builtin.file', 'crds.yaml') | ansible.builtin.from_yaml_all | list).
      - With O(state=absent) only their C(metadata.name) is used.
    type: list
    elements: dict
    required: true
  state:
    description: Whether the CRDs should exist.
    type: str
    choices: [present, absent]
    default: present
  wait:
    description: After creating or updating, wait until every CRD is C(Established) (its objects can be used).
    type: bool
    default: true
  wait_timeout:
    description:
      - Seconds to wait for O(wait).
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 60
seealso:
  - module: warmstart.snapshot.pod_snapshot
  - module: warmstart.snapshot.restore_pod
"""

EXAMPLES = r"""
- name: Install the warmstart CRDs
  warmstart.snapshot.k8s_crds:
    definitions: "{{ lookup('ansible.builtin.file', 'crds.yaml') | ansible.builtin.from_yaml_all | list }}"
    context: prod

- name: Remove them (and every PodSnapshot with them)
  warmstart.snapshot.k8s_crds:
    definitions: "{{ lookup('ansible.builtin.file', 'crds.yaml') | ansible.builtin.from_yaml_all | list }}"
    state: absent
"""

RETURN = r"""
crds:
  description: One entry per definition, in order.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Name of the CRD., type: str, returned: always, sample: podsnapshots.snapshot.warmstart.io}
    action:
      description: What was done (or would be in check mode).
      type: str
      returned: always
      sample: created
      choices: [created, updated, unchanged, deleted, absent]
"""

import functools

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _k8s_crds
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import auth_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **auth_argument_spec(),
            definitions=dict(type="list", elements="dict", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            wait=dict(type="bool", default=True),
            wait_timeout=dict(type="raw", default=60),
        ),
        supports_check_mode=True,
    )
    run_module(module, functools.partial(_k8s_crds.run, diff=module._diff))


if __name__ == "__main__":
    main()
