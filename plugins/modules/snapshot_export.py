#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: snapshot_export
short_description: Export a container snapshot as a checkpoint archive that podman restores
version_added: 0.1.0
description:
  - Writes a container snapshot as the standard container checkpoint archive, the format of
    C(podman container checkpoint --export) and the kubelet's checkpoint API, which
    C(podman container restore --import) restores as a new container (RV(restore_command)).
  - Only a whole container exports - the snapshot of a container whose app is its PID 1 (C(podman run) without
    C(--init), an ordinary Kubernetes pod's container), one container, without GPU state and without volumes
    other than C(/dev/shm). Every reason against it is listed and nothing is written.
  - Every file of the snapshot is copied and checked against the manifest (and its signature, when the store
    trusts keys) before any of it goes into the archive. The archive is written beside O(path) and renamed over
    it when complete, mode 0600 - it holds the workload's memory.
  - Podman's own records of a container (C(config.dump), C(spec.dump)) come from a carrier - a container of the
    snapshot's image that runs O(carrier_command), which podman checkpoints and the module removes. The image
    must be in podman's images on this node; the snapshot's container must have had no bind mounts that such a
    container lacks (they are listed).
  - O(path) holding the export of the same snapshot is left as it is (C(changed=false)) unless O(force=true).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.store.progress
  - warmstart.snapshot.attributes.progress
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Checks the snapshot, the image and O(path); writes nothing and starts no carrier.
  platform:
    description: Linux with podman (rootful), CRIU and runc - what C(podman container checkpoint) needs.
options:
  path:
    description: The archive to write, on the node. Its directory must exist.
    type: path
    required: true
  snapshot_id:
    description: The snapshot to export. Without it, the newest matching O(name) and O(labels).
    type: str
  name:
    description: Export the newest snapshot of this name (with O(labels)).
    type: str
  labels:
    description: Export the newest snapshot carrying all of these labels.
    type: dict
    default: {}
  compression:
    description: How the archive is compressed; C(podman container restore --import) reads each.
    type: str
    choices: [gzip, zstd, none]
    default: gzip
  carrier_command:
    description:
      - The command the carrier container runs, which must keep it running until it is checkpointed. Change it for
        an image without C(sleep).
    type: list
    elements: str
    default: [sleep, infinity]
  carrier_volumes:
    description:
      - Bind mounts of the carrier container, as C(podman run -v) takes them (V(/srv/models:/models:ro)). Give the
        snapshot's container's own bind mounts here - the export lists those the carrier lacks; the restore needs
        the same paths on its node.
    type: list
    elements: str
    default: []
  force:
    description: Rewrite O(path) even when it holds this snapshot's export already.
    type: bool
    default: false
notes:
  - On some kernels podman's restore needs CRIU's C(mntns-compat-mode) (its mount-v2 engine fails to remount a
    runc mount private) - put the line C(mntns-compat-mode) into C(/etc/criu/runc.conf) on the restoring node.
  - A snapshot taken with established TCP connections restores with C(--tcp-established) (RV(restore_command)
    says so).
seealso:
  - module: warmstart.snapshot.snapshot_import
  - module: warmstart.snapshot.checkpoint
"""

EXAMPLES = r"""
- name: Export the newest snapshot named embed
  warmstart.snapshot.snapshot_export:
    name: embed
    store: /mnt/snapshots
    path: /var/tmp/embed-checkpoint.tar.gz
  register: exported

- name: Restore it with podman
  ansible.builtin.command:
    argv: "{{ exported.restore_command + ['--name', 'embed-copy'] }}"
  changed_when: true

- name: An image without sleep
  warmstart.snapshot.snapshot_export:
    snapshot_id: 20261207T211403Z-df6a9219
    path: /var/tmp/server.tar.zst
    compression: zstd
    carrier_command: [/app/server, --idle]
"""

RETURN = r"""
snapshot:
  description: The snapshot exported.
  returned: success
  type: dict
  contains:
    id: {description: Snapshot id., type: str, returned: always, sample: 20261207T211100Z-138715db}
    name: {description: Snapshot name., type: str, returned: always, sample: embed}
    labels: {description: Labels., type: dict, returned: always, sample: {model: all-minilm-l6-v2}}
    created_at: {description: "When it was published, in UTC (ISO 8601).", type: str, returned: always,
                 sample: "2026-12-07T21:11:00.123456Z"}
    size: {description: Bytes in the snapshot., type: int, returned: always, sample: 2726288}
    source_node:
      description: The node recorded as the snapshot's source, as M(warmstart.snapshot.checkpoint) returns it.
      type: dict
      returned: always
      sample: {hostname: node-a, arch: x86_64, kernel: 6.18.0, criu_version: 4.2.1}
    targets:
      description: What the snapshot holds - one container.
      type: list
      elements: dict
      returned: always
      sample: [{name: embed, kind: container}]
archive:
  description: The archive.
  returned: success
  type: dict
  contains:
    path: {description: The archive., type: str, returned: always, sample: /var/tmp/embed-checkpoint.tar.gz}
    compression: {description: "V(gzip), V(zstd) or V(none).", type: str, returned: always, sample: gzip}
    size: {description: Bytes in the archive file., type: int, returned: when it was written or is already there, sample: 543788}
restore_command:
  description: The command that restores the archive as a new container with podman (add C(--name) to choose its name).
  returned: success
  type: list
  elements: str
  sample: [podman, container, restore, --import, /var/tmp/embed-checkpoint.tar.gz]
timings:
  description: Seconds the export took.
  returned: success
  type: dict
  sample: {total: 2.03}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _snapshot_export
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import progress_argument_spec, store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            snapshot_id=dict(type="str"),
            name=dict(type="str"),
            labels=dict(type="dict", default={}),
            compression=dict(type="str", choices=["gzip", "zstd", "none"], default="gzip"),
            carrier_command=dict(type="list", elements="str", default=["sleep", "infinity"]),
            carrier_volumes=dict(type="list", elements="str", default=[]),
            force=dict(type="bool", default=False),
            **store_argument_spec(),
            **progress_argument_spec(),
        ),
        mutually_exclusive=[("snapshot_id", "name")],
        supports_check_mode=True,
    )
    run_module(module, _snapshot_export.run, progress=True)


if __name__ == "__main__":
    main()
