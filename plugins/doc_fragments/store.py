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
      signing_key:
        description:
          - Ed25519 private key (PEM, PKCS8, unencrypted) this node signs the manifests of its snapshots with; the
            signature covers every file's size and SHA256, the source node's fingerprint and the encryption block.
          - Default C(/etc/warmstart/keys/signing.key) when present (the keys directory is E(WARMSTART_KEYS_DIR)
            when set); distributed by the P(warmstart.snapshot.node_prep#role) role (C(node_prep_signing_key)) to
            the nodes that take snapshots. A key that group or others can read is refused.
        type: path
      trusted_keys:
        description:
          - Directory of the trusted Ed25519 public keys (C(*.pub), PEM). Once a trust set is configured, every
            snapshot is checked before anything else is read, by restores, M(warmstart.snapshot.snapshot_info) and
            the page server, and unsigned snapshots, unknown signers and bad signatures are refused with the
            reason. An empty or unreadable trust set is an error.
          - Default C(/etc/warmstart/keys/trusted) when present; distributed by
            P(warmstart.snapshot.node_prep#role) (C(node_prep_trusted_keys)).
          - Rotation - add the new public key to the trust set on every node, then give the snapshotting nodes the
            new signing key; snapshots signed by the old key still verify (a signature names its key id) until
            the old public key is removed from the trust set, which refuses them from then on.
        type: path
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
