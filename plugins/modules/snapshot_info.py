#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: snapshot_info
short_description: List, inspect and verify the snapshots in a snapshot store
version_added: 0.1.0
description:
  - Lists the published snapshots of a store, newest first, optionally only those with a given O(name) and O(labels).
  - Reports what cannot be read (RV(broken)) and the staging directories of checkpoints that are running or were
    interrupted (RV(staging)), which M(warmstart.snapshot.cleanup) removes.
  - With O(verify=true) it re-reads every file of each listed snapshot and compares size and SHA256 with the
    manifest; problems are reported per snapshot and do not fail the task.
  - Read-only; never changes anything.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.attributes.info
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes
attributes:
  platform:
    description: Linux; CRIU is not needed.
options:
  name:
    description: Only snapshots with this name.
    type: str
  labels:
    description: Only snapshots that carry all of these labels with these values.
    type: dict
    default: {}
  details:
    description:
      - V(false) returns a summary of each snapshot; V(true) returns its whole manifest (source node
        fingerprint, targets, CRIU options and statistics, files with size and SHA256, timings).
    type: bool
    default: false
  verify:
    description:
      - Re-read every file of each listed snapshot and check its size and SHA256 against the manifest.
      - Reads the whole snapshot; slow for large snapshots on a network store.
    type: bool
    default: false
  query:
    description:
      - A JMESPath expression applied to the list RV(snapshots) (after O(details) and O(verify)); its value is
        returned as RV(query_result).
      - Needs the Python library C(jmespath) on the managed node (Debian/Ubuntu package C(python3-jmespath)).
    type: str
notes:
  - Snapshots hold process memory; reading them needs the permissions of the store (root by default).
seealso:
  - module: warmstart.snapshot.cleanup
  - module: warmstart.snapshot.checkpoint
"""

EXAMPLES = r"""
- name: List the snapshots of the embedding server
  warmstart.snapshot.snapshot_info:
    store: /mnt/snapshots
    name: embed
  register: snaps

- name: Check every snapshot of one model for corruption
  warmstart.snapshot.snapshot_info:
    labels:
      model: all-minilm-l6-v2
    verify: true
  register: checked

- name: Fail if any of them is damaged
  ansible.builtin.assert:
    that: checked.snapshots | rejectattr('intact') | list | length == 0

- name: Ids of the snapshots larger than 1 GiB
  warmstart.snapshot.snapshot_info:
    query: "[?size > `1073741824`].id"
  register: big
"""

RETURN = r"""
snapshots:
  description:
    - The published snapshots that match O(name) and O(labels), newest first.
    - A summary (the keys below), or with O(details=true) the whole manifest plus RV(snapshots[].path) and the
      verification keys.
  returned: success
  type: list
  elements: dict
  contains:
    id: {description: Snapshot id (sortable by time)., type: str, returned: always, sample: 20261202T124302Z-f6ccdab5}
    name: {description: Snapshot name., type: str, returned: always, sample: embed}
    labels: {description: Labels., type: dict, returned: always, sample: {model: all-minilm-l6-v2}}
    created_at: {description: Creation time in UTC (ISO 8601)., type: str, returned: always, sample: "2026-12-02T12:43:02.123456Z"}
    size: {description: Bytes in the snapshot's files., type: int, returned: always, sample: 3987719}
    source_node:
      description:
        - The node the snapshot was taken on, as RV(warmstart.snapshot.checkpoint#module:snapshot.source_node) gives
          it (with O(details=true) the manifest's C(source), which also lists the CPU flags).
      type: dict
      returned: when O(details=false)
      sample: {hostname: gpu-node-1, arch: x86_64, kernel: 6.18.44, cpu_vendor: GenuineIntel}
    targets:
      description: The snapshotted targets - C(name) and C(kind) (summary), or their full records (O(details=true)).
      type: list
      elements: dict
      returned: always
      sample: [{name: embed, kind: process}]
    path:
      description: Directory of the snapshot in the store.
      type: str
      returned: always
      sample: /var/lib/warmstart/store/snapshots/20261202T124302Z-f6ccdab5
    intact:
      description: Whether every file has the size and SHA256 the manifest records.
      type: bool
      returned: when O(verify=true)
      sample: true
    problems:
      description: What is wrong with the files (missing, truncated, corrupted); empty when intact.
      type: list
      elements: str
      returned: when O(verify=true)
      sample: ["containers/embed/criu/pages-1.img: SHA256 mismatch (corrupted)"]
count:
  description: Number of entries in RV(snapshots).
  returned: success
  type: int
  sample: 3
query_result:
  description: The value of O(query) applied to RV(snapshots); its type depends on the expression.
  returned: when O(query) is set
  type: raw
  sample: [20261202T124302Z-f6ccdab5]
broken:
  description:
    - Snapshot directories whose manifest cannot be read, whatever O(name) and O(labels) say (an unreadable
      manifest has no name). M(warmstart.snapshot.cleanup) removes them with O(warmstart.snapshot.cleanup#module:remove_broken=true).
  returned: success
  type: list
  elements: dict
  contains:
    id: {description: Snapshot id (the directory name)., type: str, returned: always, sample: 20261202T124302Z-f6ccdab5}
    error: {description: Why it cannot be read., type: str, returned: always, sample: "manifest cannot be read: Expecting value: line 1 column 1 (char 0)"}
    path: {description: Directory of the snapshot., type: str, returned: always, sample: /var/lib/warmstart/store/snapshots/20261202T124302Z-f6ccdab5}
    newer_schema:
      description: The manifest was written by a newer warmstart; the snapshot is not broken, this node's collection is old.
      type: bool
      returned: always
      sample: false
staging:
  description: Entries of the store's staging directory - checkpoints that run now or were interrupted.
  returned: success
  type: list
  elements: dict
  contains:
    path: {description: Staging directory., type: str, returned: always, sample: /var/lib/warmstart/store/tmp/0f3c9b2e8d4a4f7e9c1b2a3d4e5f6a7b}
    mtime: {description: Modification time of the directory itself (epoch seconds)., type: float, returned: always, sample: 1796215382.5}
    newest_mtime: {description: Latest modification of anything inside it (epoch seconds)., type: float, returned: always, sample: 1796215390.1}
    age: {description: Seconds since anything in it last changed., type: float, returned: always, sample: 7201.3}
    size: {description: Bytes in it., type: int, returned: always, sample: 1048576}
store:
  description: The store that was read.
  returned: success
  type: dict
  contains:
    url: {description: The store - a directory or V(s3://bucket/prefix) (as O(store) names it)., type: str, returned: always, sample: /var/lib/warmstart/store}
    kind: {description: V(fs) or V(s3)., type: str, returned: always, sample: fs}
    exists:
      description: Whether the store holds a C(snapshots) directory (V(false) - nothing was ever published there).
      type: bool
      returned: always
      sample: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _snapshot_info
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **store_argument_spec(),
            name=dict(type="str"),
            labels=dict(type="dict", default={}),
            details=dict(type="bool", default=False),
            verify=dict(type="bool", default=False),
            query=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    run_module(module, _snapshot_info.run)


if __name__ == "__main__":
    main()
