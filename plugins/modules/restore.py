#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: restore
short_description: Restore a process snapshot on this node with CRIU
version_added: 0.1.0
description:
  - Restores a snapshot taken by M(warmstart.snapshot.checkpoint) - by O(snapshot) id, or the newest published
    snapshot matching O(name) and O(labels) that is compatible with this node.
  - Before any process is touched it verifies every file's SHA256 against the manifest (O(verify)) and checks
    compatibility (architecture, kernel and CRIU not older than the source's, CPU vendor, source CPU flags a
    subset of this node's), and refuses with every failing reason.
  - The tree is restored detached, in a new PID namespace when the source was a namespace init (so the same
    snapshot can run twice on one node when nothing else, such as a listening port, collides).
  - Writes C(restore-complete) (C(pid=<pid in its namespace>)) into the workload's control directory, or
    C(restore-failed) on failure; CRIU leaves no half-restored process behind.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.criu
attributes:
  check_mode:
    support: full
    description: Selects, verifies and checks the snapshot, restores nothing.
  diff_mode:
    support: none
    description: No diff is produced.
  platform:
    support: full
    platforms: linux
    description: Linux with CRIU >= 4.2.
options:
  snapshot:
    description: Snapshot id to restore.
    type: str
  name:
    description: Restore the newest compatible snapshot of this name.
    type: str
  labels:
    description: Restore the newest compatible snapshot carrying these labels.
    type: dict
  verify:
    description: Verify every file's size and SHA256 before restoring.
    type: bool
    default: true
  skip_compat_check:
    description: Restore even if the node does not match the source (at your own risk).
    type: bool
    default: false
  restore_root:
    description: Node-local directory for CRIU's restore work files and logs.
    type: path
    default: /var/lib/warmstart/restore
"""

EXAMPLES = r"""
- name: Restore the newest compatible snapshot of the embedding server
  warmstart.snapshot.restore:
    name: embed
    store: /mnt/snapshots
  register: restored

- name: Restore one snapshot by id
  warmstart.snapshot.restore:
    snapshot: 20261202T124302Z-f6ccdab5
"""

RETURN = r"""
restore:
  description: What was restored (in check mode - what would be).
  returned: success
  type: dict
  contains:
    id:
      description: Snapshot id.
      type: str
      returned: always
      sample: 20261202T124302Z-f6ccdab5
    name:
      description: Snapshot name.
      type: str
      returned: always
      sample: embed
    pid:
      description: Host PID of the restored root.
      type: int
      returned: not in check mode
      sample: 22862
    pids:
      description: Host PIDs of the restored tree.
      type: list
      elements: int
      returned: not in check mode
      sample: [22862]
    ns_pid:
      description: PID of the root inside its PID namespace.
      type: int
      returned: not in check mode
      sample: 1
    workload:
      description: Workload name, if the snapshot is of one.
      type: str
      returned: not in check mode
      sample: embed
    work_dir:
      description: Directory with CRIU's restore log.
      type: str
      returned: not in check mode
      sample: /var/lib/warmstart/restore/x
    timings:
      description: Seconds per phase (preflight, restore, total).
      type: dict
      returned: not in check mode
      sample: {restore: 0.14}
    criu_stats:
      description: CRIU's restore statistics (microseconds, pages).
      type: dict
      returned: not in check mode
      sample: {restore_time: 120000}
reasons:
  description: Every reason the restore was refused.
  returned: failure
  type: list
  elements: str
  sample: ["architecture: snapshot is aarch64, this node is x86_64"]
criu_log_tail:
  description: Last lines of CRIU's log when CRIU failed.
  returned: failure of CRIU
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils._module import run_restore


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            snapshot=dict(type="str"),
            name=dict(type="str"),
            labels=dict(type="dict"),
            store=dict(type="path", default="/var/lib/warmstart/store"),
            criu_path=dict(type="path"),
            verify=dict(type="bool", default=True),
            skip_compat_check=dict(type="bool", default=False),
            restore_root=dict(type="path", default="/var/lib/warmstart/restore"),
        ),
        mutually_exclusive=[("snapshot", "name")],
        required_one_of=[("snapshot", "name", "labels")],
        supports_check_mode=True,
    )
    run_restore(module)


if __name__ == "__main__":
    main()
