#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: snapshot_import
short_description: Import a container checkpoint archive (podman, the kubelet) into a snapshot store
version_added: 0.1.0
description:
  - Reads the standard container checkpoint archive - what C(podman container checkpoint --export) and the
    kubelet's checkpoint API (CRI-O, containerd) write - and publishes it in the store as a container snapshot,
    which M(warmstart.snapshot.restore) restores into a placeholder container
    (O(warmstart.snapshot.restore#module:into)) with every check a warmstart snapshot gets - manifest,
    checksums, the signature when the store is signed, image, mounts, node.
  - The archive is streamed once, plain or gzip or zstd compressed. Every member is checked - regular files and
    directories with plain relative names, each once - and only CRIU's images, C(rootfs-diff.tar),
    C(deleted.files), C(devshm-checkpoint.tar), C(stats-dump), C(config.dump) and C(spec.dump) are used; the
    others (C(network.status), logs) are passed over and listed in RV(archive.passed_over).
  - Refused, every reason at once and nothing published - an archive without a CRIU dump, of a container with a
    terminal, a user namespace, the host's network or another container's PID namespace, or with external
    mounts warmstart cannot map. See the collection's C(docs/archive.md) for the mapping.
  - An archive does not say which node made it; the snapshot records the importing node as its source, so import
    on the node that made the archive, or one like it.
  - Importing the same archive (same SHA256) under the same name again finds the snapshot it published and
    changes nothing.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.store.criu
  - warmstart.snapshot.store.progress
  - warmstart.snapshot.attributes.progress
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Reads and checks the whole archive and reports what would be published; writes nothing.
  platform:
    description: Linux with CRIU >= 4.2 and pycriu (see P(warmstart.snapshot.node_prep#role)).
options:
  path:
    description: The checkpoint archive on the node.
    type: path
    required: true
  name:
    description: Name of the snapshot. Defaults to the container's name in the archive.
    type: str
  labels:
    description: Labels of the snapshot.
    type: dict
    default: {}
  container_name:
    description:
      - The container's name in the snapshot (its C(containers/<name>/) directory, and the source name of
        O(warmstart.snapshot.restore#module:into)). Defaults to the name in the archive's C(config.dump).
    type: str
notes:
  - The archive's CRIU images must be readable by this node's CRIU; a restore refuses a snapshot whose
    container image is not the placeholder's.
seealso:
  - module: warmstart.snapshot.restore
  - module: warmstart.snapshot.checkpoint
  - name: Kubernetes container checkpointing
    description: The kubelet's checkpoint API, which writes this archive.
    link: https://kubernetes.io/docs/reference/node/kubelet-checkpoint-api/
"""

EXAMPLES = r"""
- name: Import what podman exported
  warmstart.snapshot.snapshot_import:
    path: /var/tmp/embed-checkpoint.tar.gz
    store: /mnt/snapshots
    labels: {model: all-minilm-l6-v2}
  register: imported

- name: Restore it into a placeholder of the same image
  warmstart.snapshot.restore:
    snapshot_id: "{{ imported.snapshot.id }}"
    store: /mnt/snapshots
    into: embed-placeholder

- name: Import an archive the kubelet wrote, under the pod's container name
  warmstart.snapshot.snapshot_import:
    path: /var/lib/kubelet/checkpoints/checkpoint-embed-7d9f_default-server-2026-12-07T10:00:00Z.tar
    container_name: server
    name: embed

- name: Would it import? (reads the archive, writes nothing)
  warmstart.snapshot.snapshot_import:
    path: /var/tmp/embed-checkpoint.tar
  check_mode: true
"""

RETURN = r"""
snapshot:
  description: The snapshot the archive became (in check mode - the one an earlier import of it published, or null).
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
      description: The node recorded as the snapshot's source (the importing node), as M(warmstart.snapshot.checkpoint) returns it.
      type: dict
      returned: always
      sample: {hostname: node-a, arch: x86_64, kernel: 6.18.0, criu_version: 4.2.1}
    targets:
      description: What the snapshot holds - one container.
      type: list
      elements: dict
      returned: always
      sample: [{name: embed, kind: container}]
    path: {description: Directory (or URL) of the published snapshot., type: str, returned: always,
           sample: /mnt/snapshots/snapshots/20261207T211100Z-138715db}
archive:
  description: The archive as it was read.
  returned: success
  type: dict
  contains:
    path: {description: The archive., type: str, returned: always, sample: /var/tmp/embed-checkpoint.tar.gz}
    sha256: {description: SHA256 of the archive file., type: str, returned: always,
             sample: d72ac9b04a84501468483c5a028e0a1b7c3d9e3f0a2b4c6d8e0f1a3b5c7d9e1f}
    size: {description: Bytes in the archive file., type: int, returned: always, sample: 2744320}
    compression: {description: "V(none), V(gzip) or V(zstd).", type: str, returned: always, sample: gzip}
    images: {description: CRIU image files in it., type: int, returned: always, sample: 27}
    passed_over: {description: Members that are not needed for a restore., type: list, elements: str,
                  returned: always, sample: [network.status, ctr.log]}
container:
  description: The container the archive holds, as the snapshot records it.
  returned: success
  type: dict
  contains:
    name: {description: Its name in the snapshot (O(container_name))., type: str, returned: always, sample: embed}
    runtime: {description: The OCI runtime that dumped it., type: str, returned: always, sample: runc}
    id: {description: The container's id where it ran., type: str, returned: always, sample: 907273a9a326eedf}
    image: {description: Its image., type: str, returned: always, sample: "localhost/embed:1"}
    image_id: {description: "Its image id, which a placeholder must run.", type: str, returned: always,
               sample: d63b6af7aa6ab4581bfba271f028c7132aac91a85f79330ebd18ef9edf265330}
    hostname: {description: Its hostname., type: str, returned: always, sample: 907273a9a326}
    cgroup_path: {description: Its cgroup where it ran., type: str, returned: always, sample: /libpod_parent/libpod-907273a9a326}
timings:
  description: Seconds the import took.
  returned: success
  type: dict
  sample: {total: 1.84}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _snapshot_import
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import progress_argument_spec, store_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            name=dict(type="str"),
            labels=dict(type="dict", default={}),
            container_name=dict(type="str"),
            criu_path=dict(type="path"),
            **store_argument_spec(),
            **progress_argument_spec(),
        ),
        supports_check_mode=True,
    )
    run_module(module, _snapshot_import.run, progress=True)


if __name__ == "__main__":
    main()
