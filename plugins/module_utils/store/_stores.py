# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one place that knows every store backend: ``open_store`` from a module's ``store`` option.

``_store`` (filesystem) and ``_s3store`` (S3) do not import each other's classes; the engine
takes a ``_storeapi.Store`` and never asks which one it got.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.store._peers import PeerConfig
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._s3bucket import CREDENTIAL_OPTIONS, sse_settings
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._s3store import DEFAULT_CACHE, S3Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security._securestore import SecureStore, SecurityConfig
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import FsStore, StoreError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.compression._zstore import CompressedStore, CompressionConfig


def open_store(spec: Any, options: Optional[Dict[str, Any]] = None) -> Store:
    """The backend store of ``spec``, wrapped in a ``SecureStore`` when the node signs or trusts keys or the
    store is encrypted (``_securestore.SecurityConfig``), and that in a ``CompressedStore`` when the options carry
    ``compression`` (``_zstore``: a module's always do; it compresses with ``zstd`` and reads compressed
    snapshots either way). Without it, a compressed snapshot is refused by the backend."""
    cache = (options or {}).get("cache_dir") or DEFAULT_CACHE
    backend = _backend(spec, options)
    config = SecurityConfig.from_options(options, cache)
    store = SecureStore(backend, config) if config.active else backend
    compression = CompressionConfig.from_options(options, cache)
    return CompressedStore(store, compression) if compression.present else store


def _backend(spec: Any, options: Optional[Dict[str, Any]] = None) -> Store:
    """A store from a module's ``store`` option: a path, ``s3://bucket/prefix``, or {'type': 'fs', 'path': ...}.

    ``options`` (``store_options``) configure an S3 store: endpoint_url, region, profile, cache_dir,
    concurrency, and credentials (access_key_id, secret_access_key, session_token) that take the place of the
    node's AWS variables and config files, and server-side encryption (sse, sse_kms_key_id, sse_customer_key),
    which only a bucket has. boto3 is imported only when an S3 store first talks to its bucket.
    """
    o = options or {}
    if isinstance(spec, str) and spec.startswith("s3://"):
        credentials = {k: str(o[k]) for k in CREDENTIAL_OPTIONS if o.get(k)}
        return S3Store(spec, endpoint_url=o.get("endpoint_url"), region=o.get("region"), profile=o.get("profile"),
                       cache=o.get("cache_dir") or DEFAULT_CACHE, concurrency=int(o.get("concurrency") or 8),
                       credentials=credentials or None,
                       sse=sse_settings(o.get("sse"), o.get("sse_kms_key_id"), o.get("sse_customer_key")),
                       peers=PeerConfig.from_options(o))
    sse = [k for k in ("sse", "sse_kms_key_id", "sse_customer_key") if o.get(k)]
    if sse:
        raise StoreError(f"store_options {', '.join(sse)}: server-side encryption applies to s3:// stores only "
                         "(store_options.encryption encrypts any store)")
    if o.get("peers"):
        raise StoreError("store_options peers: nodes share what they download from an s3:// store; a filesystem "
                         "store is read in place by every node (drop peers)")
    if isinstance(spec, str):
        return FsStore(spec)
    if isinstance(spec, dict):
        kind = spec.get("type", "fs")
        if kind == "fs":
            return FsStore(spec.get("path", ""))
        raise StoreError(f"store type {kind!r} is not supported here (supported: fs)")
    raise StoreError(f"store {spec!r} is neither a path nor a mapping")
