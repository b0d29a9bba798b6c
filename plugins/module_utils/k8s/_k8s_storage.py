# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where snapshots go, from the cluster: a PodSnapshotPolicy or a PodSnapshotStorageConfig -> store and store_options.

A policy names its store inline (``spec.storeUrl``, kept for compatibility) or through a cluster-scoped
``PodSnapshotStorageConfig`` (``spec.storageConfigName``) - as GKE's policies do. The storage config holds the
store URL (an absolute directory every node mounts, ``file:///dir`` for the same, or ``s3://bucket/prefix``), the
options of an S3 store (``endpointUrl``, ``region``, ``profile``, ``cacheDir``, ``concurrency``: the modules'
``store_options``) and ``credentialsSecretRef`` - a Secret whose keys hold the access key id, the secret access key
and an optional session token. ``resolve_store`` turns either into the ``store`` and ``store_options`` options of
the checkpoint / restore / cleanup modules.

Invariants:

- Secret values go only into the returned ``store_options`` (``access_key_id``, ``secret_access_key``,
  ``session_token``); no message, reason or other field ever carries one (key names and Secret names only).
- Every refusal names what to fix: a policy with both (or neither) of storeUrl and storageConfigName names both;
  a missing storage config names the policy that points to it; a missing Secret or key names the Secret, the key
  (and which credential it is) and the storage config.
- Reads only.
"""
from __future__ import annotations

import base64
import binascii
from typing import Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s._k8s_client import JSON, Cluster, K8sError, ref

# storage config spec.options (camelCase) -> store_options (the modules' names)
OPTION_NAMES = {"endpointUrl": "endpoint_url", "region": "region", "profile": "profile", "cacheDir": "cache_dir",
                "concurrency": "concurrency"}
# credentialsSecretRef.keys field -> (store_options name, default key in the Secret, required)
CREDENTIALS: Dict[str, Tuple[str, str, bool]] = {
    "accessKeyId": ("access_key_id", "AWS_ACCESS_KEY_ID", True),
    "secretAccessKey": ("secret_access_key", "AWS_SECRET_ACCESS_KEY", True),
    "sessionToken": ("session_token", "AWS_SESSION_TOKEN", False),
}
SECRET_OPTIONS = tuple(name for name, _key, _required in CREDENTIALS.values())


def store_url(url: str, what: str) -> str:
    """The ``store`` option for a storage URL: a directory (``/dir`` or ``file:///dir``) or ``s3://bucket/prefix``."""
    text = str(url or "").strip()
    if text.startswith("file://"):
        path = text[len("file://"):]
        if not path.startswith("/"):
            raise K8sError(f"{what}: store URL {url!r} is not file:///absolute/path", what)
        return path
    if text.startswith("/") or text.startswith("s3://"):
        return text
    raise K8sError(f"{what}: store URL {url!r} is neither an absolute directory (/dir, file:///dir) nor "
                   "s3://bucket/prefix", what)


def policy_store_source(policy: JSON) -> Tuple[Optional[str], Optional[str]]:
    """``(storeUrl, storageConfigName)`` of a PodSnapshotPolicy: exactly one is set, else refused naming both."""
    spec = policy.get("spec") or {}
    what = podapi.object_ref(policy, podapi.KIND_POLICY)
    url, config = spec.get("storeUrl") or None, spec.get("storageConfigName") or None
    if url and config:
        raise K8sError(f"{what} sets both storeUrl ({url!r}) and storageConfigName ({config!r}): set only one of "
                       "them", what)
    if not url and not config:
        raise K8sError(f"{what} sets neither storeUrl nor storageConfigName: set one of them", what)
    return url, config


def resolve_store(cluster: Cluster, namespace: str, policy: Optional[str] = None,
                  storage_config: Optional[str] = None) -> JSON:
    """The store of PodSnapshotPolicy ``namespace/policy`` or of PodSnapshotStorageConfig ``storage_config``.

    Returns ``{"store", "store_options", "storage_config", "credentials_secret", "source"}``: ``store`` and
    ``store_options`` as the store modules take them (``store_options`` holds the credentials when the config
    names a Secret: never log it); ``storage_config`` the config's name (None for an inline storeUrl);
    ``credentials_secret`` ``namespace/name`` of the Secret (None without one); ``source`` says where it came from.
    Both given: the storage config is the one named, and the policy must name the same (or none).
    """
    if not policy and not storage_config:
        raise K8sError("resolve a store from a PodSnapshotPolicy (policy) or a PodSnapshotStorageConfig "
                       "(storage_config): neither was given", podapi.KIND_STORAGE_CONFIG)
    named_by = None
    if policy:
        doc = cluster.get(podapi.KIND_POLICY, policy, namespace)
        named_by = podapi.object_ref(doc, podapi.KIND_POLICY)
        url, config = policy_store_source(doc)
        if storage_config and config != storage_config:
            raise K8sError(f"{named_by} uses {'storageConfigName ' + repr(config) if config else 'storeUrl ' + repr(url)}"
                           f", not PodSnapshotStorageConfig {storage_config!r}", named_by)
        if url:
            return {"store": store_url(url, named_by), "store_options": {}, "storage_config": None,
                    "credentials_secret": None, "source": f"{named_by} storeUrl"}
        storage_config = config
    return storage_config_store(cluster, str(storage_config), namespace, named_by)


def storage_config_store(cluster: Cluster, name: str, namespace: str, named_by: Optional[str] = None) -> JSON:
    """``resolve_store`` of one PodSnapshotStorageConfig; the Secret's namespace defaults to ``namespace``."""
    what = ref(podapi.KIND_STORAGE_CONFIG, name)
    config = cluster.find(podapi.KIND_STORAGE_CONFIG, name)
    if config is None:
        raise K8sError(f"{what} not found" + (f" (named by {named_by} in storageConfigName)" if named_by else ""),
                       what, 404)
    spec = config.get("spec") or {}
    store = store_url(str(spec.get("storeUrl") or ""), what)
    options: JSON = {OPTION_NAMES[k]: v for k, v in (spec.get("options") or {}).items()
                     if k in OPTION_NAMES and v not in (None, "")}
    secret_ref = spec.get("credentialsSecretRef") or None
    secret_name = None
    if secret_ref:
        if not store.startswith("s3://"):
            raise K8sError(f"{what} names credentialsSecretRef {secret_ref.get('name')!r}, but its store {store!r} "
                           "is a directory: credentials are for an s3:// store only", what)
        secret_ns = str(secret_ref.get("namespace") or namespace)
        secret_name = f"{secret_ns}/{secret_ref.get('name')}"
        options.update(_credentials(cluster, secret_ref, secret_ns, what))
    return {"store": store, "store_options": options, "storage_config": name, "credentials_secret": secret_name,
            "source": what + (f" (storageConfigName of {named_by})" if named_by else "")}


def _credentials(cluster: Cluster, secret_ref: JSON, namespace: str, what: str) -> Dict[str, str]:
    """The credentials in the Secret ``secret_ref`` names, by store option; every missing key is one reason."""
    name = str(secret_ref.get("name") or "")
    sref = ref("Secret", name, namespace)
    secret = cluster.find("Secret", name, namespace)
    if secret is None:
        raise K8sError(f"{sref} not found (credentialsSecretRef of {what}): create it with the keys "
                       f"{', '.join(_wanted_keys(secret_ref))} or fix credentialsSecretRef", sref, 404)
    data = secret.get("data") or {}
    plain = secret.get("stringData") or {}
    keys = secret_ref.get("keys") or {}
    out: Dict[str, str] = {}
    problems: List[str] = []
    for field, (option, default, required) in CREDENTIALS.items():
        key = str(keys.get(field) or default)
        if key in data:
            try:
                out[option] = base64.b64decode(str(data[key]), validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                problems.append(f"{sref} key {key!r} ({field}) is not base64-encoded UTF-8 text")
        elif key in plain:
            out[option] = str(plain[key])
        elif required or keys.get(field):
            problems.append(f"{sref} has no key {key!r} (credentialsSecretRef.keys.{field} of {what}); its keys: "
                            f"{', '.join(sorted(set(data) | set(plain))) or 'none'}")
    if problems:
        raise K8sError(f"{sref} does not hold the credentials {what} needs", sref, reasons=problems)
    return out


def _wanted_keys(secret_ref: JSON) -> List[str]:
    keys = secret_ref.get("keys") or {}
    return [str(keys.get(field) or default) for field, (_o, default, required) in CREDENTIALS.items()
            if required or keys.get(field)]
