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
    description: Settings of an V(s3://) store, and the store's signing, trust set, encryption and compression at rest.
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
      peers:
        description:
          - The nodes restoring this snapshot together from an V(s3://) store, as C(host:port) each - the same
            list on every node, this node's own entry included. Each node downloads its share of the page images'
            64 MiB chunks from the bucket and gets the other chunks from the nodes that downloaded them, while it
            serves its own on its entry's address; the bucket sends each chunk about once, however many nodes
            restore.
          - A chunk from a peer is used only once its SHA256 matched the manifest's; a peer that is down, slow
            (O(store_options.peer_wait)) or sends other bytes is replaced by the bucket for that chunk.
          - Shared are the stored bytes of files with chunk digests (page images), compressed or not. With
            O(store_options.encryption) the nodes share the encrypted chunks (no plaintext travels between
            nodes), then each decrypts its own copy; an encrypted snapshot whose manifest has no chunk digests of
            its stored bytes (taken by an older version) is read from the bucket by each node.
          - In the clear a node serves on a loopback address only; across nodes set O(store_options.peer_tls)
            (or O(store_options.peer_insecure) on a network you trust). The playbook
            C(warmstart.snapshot.restore) fills this in with C(warmstart_restore_share).
        type: list
        elements: str
      peer_listen:
        description: This node's entry of O(store_options.peers); default the entry whose host is an address of this node.
        type: str
      peer_tls:
        description:
          - Mutual TLS between the nodes of O(store_options.peers), with the node's CA, certificate and key in
            C(<keys dir>/tls/) (C(ca.pem), C(cert.pem), C(key.pem); distributed by
            P(warmstart.snapshot.node_prep#role), C(node_prep_tls_*)). Each certificate must name its node's
            address in O(store_options.peers).
        type: bool
        default: false
      peer_insecure:
        description:
          - Serve chunks in the clear on a non-loopback address. Anyone who can reach the port can read the
            snapshot's memory while the restore runs; use only on a network you trust.
        type: bool
        default: false
      peer_wait:
        description: Seconds a node waits for a chunk its owner has not fetched yet before it reads it from the store.
        type: float
        default: 60
      peer_linger:
        description:
          - Seconds a node that has every chunk keeps serving after the last request, while the other nodes are not
            all done.
        type: float
        default: 10
      encryption:
        description:
          - Encrypt snapshots at rest (any store). Every file is encrypted on this node before it reaches the store,
            with AES-256-GCM in 4 MiB chunks under a random per-snapshot data key, which is wrapped by a
            key-encryption key (KEK) of this node's ring (O(store_options.kek_dir)); nothing else in the store is
            plaintext but the manifest (names, sizes and digests of the encrypted files, the wrapped key).
          - Restores decrypt into this node's cache (O(store_options.cache_dir), C(plain/), 0700/0600) in the same
            pass that checks the stored bytes against the manifest; lazy restores and the page server serve from
            that copy. The node that took a snapshot keeps its plaintext copy there (a restore on it decrypts
            nothing).
          - The switch must match the store - an encrypted snapshot is refused by a store without it, and a
            plaintext snapshot (which anyone who can write the store could plant) by a store with it. A snapshot
            whose KEK this node lacks, or whose data key does not unwrap, is refused before anything is touched.
        type: bool
        default: false
      compression:
        description:
          - Compress snapshots at rest (any store) with zstd, on this node before they reach the store (and before
            encryption, when both are on). Page images and files of 1 MiB or more are stored as independent zstd
            frames of 4 MiB of plaintext each; smaller files as they are. The manifest (signed, when signing is on)
            records each compressed file's plaintext size, SHA256 and frame sizes.
          - Restores decompress on every core into this node's cache (O(store_options.cache_dir),
            C(plain/zstd/), 0700/0600) after the stored bytes were checked, and check the plaintext SHA256 before
            CRIU reads it; no frame may inflate past its declared size. The node that took a snapshot keeps its
            plaintext copy (a restore on it decompresses nothing).
          - Reading does not depend on this switch - a compressed snapshot restores wherever the node has the
            Python zstandard library (roles/node_prep installs it), and an uncompressed one everywhere.
          - When not given, the default of the store's kind - V(none) for both filesystem and V(s3://) stores, set
            from C(docs/benchmarks.md) (Compression) - turn V(zstd) on for an object store reached at 1 Gbit/s or
            less per node when the workload's memory compresses (the demo server's moved 5x faster there).
        type: str
        choices: [none, zstd]
      compression_level:
        description: The zstd level O(store_options.compression) writes with (1-19; higher is smaller and slower).
        type: int
        default: 3
      kek_dir:
        description:
          - Directory of the key-encryption keys (C(*.key), each the base64 text of 32 random bytes, mode 0600; a
            key that group or others can read is refused). Default C(/etc/warmstart/keys/kek) (the keys directory
            is E(WARMSTART_KEYS_DIR) when set), where the P(warmstart.snapshot.node_prep#role) role puts them
            (C(node_prep_keks)).
          - Rotation - add the new KEK to every node, then name it in O(store_options.kek); snapshots wrapped by an
            older KEK restore as long as it stays in the directory (the manifest names its KEK by id).
        type: path
      kek:
        description:
          - The key-encryption key new snapshots are wrapped with, by file name in O(store_options.kek_dir)
            (with or without C(.key)). Default - the only one there; several without this option is an error.
        type: str
      sse:
        description:
          - Server-side encryption of an V(s3://) store's objects by the provider, on every upload - V(AES256)
            (SSE-S3) or V(aws:kms) (SSE-KMS, with O(store_options.sse_kms_key_id) or the bucket's default key).
            Independent of O(store_options.encryption), which encrypts before anything leaves the node.
        type: str
        choices: [AES256, aws:kms]
      sse_kms_key_id:
        description: KMS key (id, ARN or alias) for O(store_options.sse=aws:kms).
        type: str
      sse_customer_key:
        description:
          - SSE-C - a customer-provided 32-byte key sent with every upload, download and ranged read of an
            V(s3://) store's objects (boto3 adds its MD5). Give the base64 of 32 bytes, or 32 characters used as
            they are. Excludes O(store_options.sse). Never logged or returned; losing it loses the snapshots.
        type: str
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
