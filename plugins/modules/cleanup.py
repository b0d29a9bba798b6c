#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cleanup
short_description: Apply retention to a snapshot store and remove what interrupted checkpoints and restores left
version_added: 0.1.0
description:
  - Keeps the newest O(keep_last) snapshots of each group (by default a group is a snapshot name; with O(group_by)
    the values of those label keys) and removes the others; removes snapshots older than O(max_age). A snapshot
    goes when either rule says so.
  - Only snapshots matching O(name) and O(labels) are considered; the others are left alone.
  - Removes staging directories in which nothing has changed for O(incomplete_older_than) (checkpoints that were
    interrupted; a running checkpoint keeps writing into its own, so it is not touched), and left-overs of an
    interrupted removal.
  - Removes restore work directories (C(<snapshot id>-<suffix>) under O(restore_root), with CRIU's restore log)
    unchanged for O(incomplete_older_than) on this node.
  - Snapshots whose manifest cannot be read are reported and kept, unless O(remove_broken=true). Snapshots
    written by a newer warmstart (newer manifest schema) are never removed.
  - A snapshot is unpublished first (its directory is moved into the store's C(tmp/)), then its files are deleted,
    so no reader ever sees half a snapshot.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Lists what would be removed and the bytes that would be freed; removes nothing.
  platform:
    description: Linux; CRIU is not needed.
options:
  keep_last:
    description: Snapshots to keep per group, newest first. V(0) keeps any number.
    type: int
    default: 0
  group_by:
    description:
      - Label keys whose values form a group for O(keep_last), for example V([model, gpu]). A snapshot without one
        of the labels is grouped with the others that lack it.
      - Empty (the default) groups by snapshot name.
    type: list
    elements: str
    default: []
  max_age:
    description:
      - Remove snapshots older than this. Seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), V(2w) -
        or a sum such as V(1d12h).
      - Unset (the default) - no age limit. It applies to every group, so it can remove all snapshots of a group
        that no longer gets new ones.
    type: raw
  incomplete_older_than:
    description:
      - Remove staging directories and restore work directories in which nothing has changed for this long
        (same format as O(max_age)).
      - Keep it well above the time between two writes of a running checkpoint; V(0) removes every staging
        directory, including those of checkpoints that run right now.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 1h
  name:
    description: Consider only snapshots with this name.
    type: str
  labels:
    description: Consider only snapshots that carry all of these labels with these values.
    type: dict
    default: {}
  snapshot_ids:
    description:
      - Also remove these published snapshots by id, whatever the other rules say (for example the ones a
        Kubernetes grouping retention expired, see M(warmstart.snapshot.pod_snapshot_info)). An id that is not in
        the store is reported in C(missing), not an error.
    type: list
    elements: str
    default: []
  remove_broken:
    description:
      - Also remove snapshot directories whose manifest cannot be read (missing, malformed, wrong id), whatever
        O(name) and O(labels) say.
    type: bool
    default: false
  prune_node_cache:
    description:
      - For an V(s3://) store, also remove this node's cached copies of snapshots that are no longer published
        (O(store_options.cache_dir)). Every node has its own cache - run it on each.
    type: bool
    default: false
  restore_root:
    description:
      - Node-local directory of restore work directories (as in M(warmstart.snapshot.restore)). Only entries named
        like a restore work directory are looked at.
    type: path
    default: /var/lib/warmstart/restore
notes:
  - On a store shared by many nodes, running it on one node is enough for the snapshots; restore work directories
    are per node. Runs on several nodes at once are safe - a snapshot already removed by another one is skipped
    with a warning.
seealso:
  - module: warmstart.snapshot.snapshot_info
"""

EXAMPLES = r"""
- name: Keep the three newest snapshots of each name, none older than a week
  warmstart.snapshot.cleanup:
    store: /mnt/snapshots
    keep_last: 3
    max_age: 7d
  register: cleaned

- name: Keep one snapshot per model and GPU type
  warmstart.snapshot.cleanup:
    keep_last: 1
    group_by: [model, gpu]

- name: What would go? (nothing is removed)
  warmstart.snapshot.cleanup:
    keep_last: 1
    name: embed
  check_mode: true
  register: preview

- name: Only repair - interrupted checkpoints older than 6 hours and unreadable snapshots
  warmstart.snapshot.cleanup:
    incomplete_older_than: 6h
    remove_broken: true
"""

RETURN = r"""
removed:
  description: The snapshots removed (in check mode - that would be removed), with why and how large.
  returned: success
  type: list
  elements: dict
  contains:
    id: {description: Snapshot id., type: str, returned: always, sample: 20261201T080000Z-0a1b2c3d}
    name: {description: Snapshot name (null for an unreadable snapshot)., type: str, returned: always, sample: embed}
    labels: {description: Its labels., type: dict, returned: always, sample: {model: all-minilm-l6-v2}}
    created_at: {description: Creation time in UTC (ISO 8601)., type: str, returned: always, sample: "2026-12-01T08:00:00.000000Z"}
    group: {description: Its retention group., type: str, returned: always, sample: name=embed}
    reason: {description: Why it goes., type: str, returned: always, sample: keep_last=1 for name=embed (it is the 2nd newest)}
    size: {description: Bytes freed., type: int, returned: always, sample: 3987719}
missing:
  description: Ids of O(snapshot_ids) that were not published in the store.
  returned: success
  type: list
  elements: str
  sample: []
removed_staging:
  description: Staging directories removed (in check mode - that would be removed).
  returned: success
  type: list
  elements: dict
  contains:
    path: {description: The directory., type: str, returned: always, sample: /var/lib/warmstart/store/tmp/0f3c9b2e8d4a4f7e9c1b2a3d4e5f6a7b}
    reason: {description: Why it goes., type: str, returned: always, sample: "incomplete snapshot, unchanged for 3h2m (incomplete_older_than=1h)"}
    age: {description: Seconds since anything in it changed., type: float, returned: always, sample: 10920.4}
    size: {description: Bytes freed., type: int, returned: always, sample: 1048576}
removed_cache:
  description: Cached snapshot copies of this node removed (O(prune_node_cache); in check mode - that would be removed).
  returned: success
  type: list
  elements: dict
  contains:
    id: {description: Snapshot id., type: str, returned: always, sample: 20261201T080000Z-0a1b2c3d}
    path: {description: The cached copy., type: str, returned: always, sample: /var/lib/warmstart/cache/s3/b__p/20261201T080000Z-0a1b2c3d}
    size: {description: Bytes., type: int, returned: always, sample: 1048576}
    reason: {description: Why., type: str, returned: always, sample: no longer published in the store}
removed_restore_dirs:
  description: Restore work directories under O(restore_root) removed (in check mode - that would be removed).
  returned: success
  type: list
  elements: dict
  contains:
    path: {description: The directory., type: str, returned: always, sample: /var/lib/warmstart/restore/20261201T080000Z-0a1b2c3d-5e6f7a8b}
    reason: {description: Why it goes., type: str, returned: always, sample: "restore work dir unchanged for 2d (incomplete_older_than=1h)"}
    age: {description: Seconds since anything in it changed., type: float, returned: always, sample: 172800.0}
    size: {description: Bytes freed., type: int, returned: always, sample: 20480}
bytes_freed:
  description: Bytes in everything removed (in check mode - that would be freed).
  returned: success
  type: int
  sample: 3987719
kept:
  description: The snapshots considered and kept, newest first.
  returned: success
  type: list
  elements: dict
  contains:
    id: {description: Snapshot id., type: str, returned: always, sample: 20261202T124302Z-f6ccdab5}
    name: {description: Snapshot name., type: str, returned: always, sample: embed}
    labels: {description: Its labels., type: dict, returned: always, sample: {model: all-minilm-l6-v2}}
    created_at: {description: Creation time in UTC (ISO 8601)., type: str, returned: always, sample: "2026-12-02T12:43:02.123456Z"}
broken:
  description: Snapshot directories whose manifest cannot be read.
  returned: success
  type: list
  elements: dict
  contains:
    id: {description: Snapshot id (the directory name)., type: str, returned: always, sample: 20261202T124302Z-f6ccdab5}
    error: {description: Why it cannot be read., type: str, returned: always, sample: "manifest is missing (snapshot not published or incomplete)"}
    remove: {description: Whether it is removed (O(remove_broken)); it is then also in RV(removed)., type: bool, returned: always, sample: false}
    reason: {description: What happens to it and why., type: str, returned: always, sample: "unreadable snapshot; kept (set remove_broken to remove it)"}
errors:
  description: What could not be removed; the task fails.
  returned: failure to remove something
  type: list
  elements: str
  sample: ["snapshot 20261201T080000Z-0a1b2c3d: Permission denied"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _cleanup
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **store_argument_spec(),
            keep_last=dict(type="int", default=0),
            group_by=dict(type="list", elements="str", default=[]),
            max_age=dict(type="raw"),
            incomplete_older_than=dict(type="raw", default="1h"),
            name=dict(type="str"),
            labels=dict(type="dict", default={}),
            remove_broken=dict(type="bool", default=False),
            snapshot_ids=dict(type="list", elements="str", default=[]),
            restore_root=dict(type="path", default="/var/lib/warmstart/restore"),
            prune_node_cache=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    run_module(module, _cleanup.run)


if __name__ == "__main__":
    main()
