# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """Options shared by the modules that use a snapshot store (and CRIU: the CRIU fragment)."""

    DOCUMENTATION = r"""
options:
  store:
    description:
      - Snapshot store - an absolute directory on this node (local disk or a shared mount such as NFS), or an
        S3-compatible bucket as V(s3://bucket/prefix) (see O(store_options)).
      - Laid out as C(snapshots/<id>/) (published, with C(manifest.json) written last) and C(tmp/) (staging).
      - An S3 store keeps a node-local, verified cache of what it downloaded or uploaded
        (O(store_options.cache_dir)); credentials come from O(store_options.access_key_id) and
        O(store_options.secret_access_key) when given, else from the usual AWS variables (E(AWS_ACCESS_KEY_ID),
        E(AWS_SECRET_ACCESS_KEY), E(AWS_PROFILE)) or config files on the node, and are never logged or returned.
    type: str
    default: /var/lib/warmstart/store
"""

    # store_options (with every module that takes store, and alone where the store comes from the cluster)
    OPTIONS = r"""
options:
  store_options:
    description: Settings of an V(s3://) store.
    type: dict
    default: {}
    suboptions:
      endpoint_url:
        description: Endpoint of an S3-compatible service; default E(AWS_ENDPOINT_URL_S3), E(AWS_ENDPOINT_URL), AWS.
        type: str
      region:
        description: Region name.
        type: str
      profile:
        description: AWS profile (from the node's AWS config files) to take credentials from.
        type: str
      cache_dir:
        description: Node-local cache of snapshots (downloaded once, verified, reused).
        type: path
        default: /var/lib/warmstart/cache
      concurrency:
        description: Parallel transfers (multipart parts and byte ranges).
        type: int
        default: 8
      access_key_id:
        description:
          - Access key id to use instead of the node's AWS variables or config files (with
            O(store_options.secret_access_key)); for example from a C(PodSnapshotStorageConfig)'s credentials
            Secret, as M(warmstart.snapshot.pod_snapshot_info) returns them.
        type: str
      secret_access_key:
        description: Secret access key that goes with O(store_options.access_key_id). Never logged or returned.
        type: str
      session_token:
        description: Session token of temporary credentials, with O(store_options.access_key_id). Never logged or returned.
        type: str
"""

    CRIU = r"""
options:
  criu_path:
    description:
      - CRIU binary to use. By default the bundle installed by the P(warmstart.snapshot.node_prep#role) role,
        then C(/usr/local/bin/criu), then C(PATH).
    type: path
"""

    PROGRESS = r"""
options:
  progress_interval:
    description:
      - Seconds between progress lines (phase, bytes done of total, rate) printed in the Ansible output while the
        task runs - the download, checksum, dump, upload and CRIU phases of long snapshots. Runs shorter than this
        print nothing. V(0) turns the lines off.
      - Printed by the collection's action plugin on the controller's standard error (a stdout callback such as
        C(json) stays parseable); the module itself only writes O(progress_file). Tasks run with C(async) print
        no progress.
    type: float
    default: 10
  progress_file:
    description:
      - Write the progress of this run as JSON (C(phase), C(done), C(total), C(rate), C(elapsed), finished
        C(phases) with their seconds) to this file on the node, rewritten atomically at most twice a second, for
        monitors of your own. Set by the action plugin when O(progress_interval) is not V(0).
    type: path
"""
