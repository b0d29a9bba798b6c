# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A ``Store`` that signs what it publishes, checks signatures on every load, and encrypts at rest.

``SecureStore`` wraps any ``_storeapi.Store`` (filesystem or S3); ``_stores.open_store`` puts it
around the backend when the node has a trust set or a signing key, or the store has encryption on.
The engine never knows: it keeps calling the ``Store`` members.

Invariants:

- every manifest this store hands out (``load``, ``list``) passed ``_admit``: its signature checked
  against the trust set (when one is configured) and its encryption matching the store's switch,
  before the engine reads any other field of it;
- what this node publishes is signed last, over the manifest as written (files, digests, node
  fingerprint, encryption block), when a signing key is configured;
- with encryption on, no plaintext byte of a snapshot's files reaches the store: CRIU writes into a
  node-local staging directory (0700) and ``publish`` encrypts into the backend's staging;
- an encrypted snapshot is read through this node's plaintext cache (0700/0600), decrypted and
  checked in one pass; ``reads_in_place`` is then False.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._paths import keys_dir
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _crypt as cr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _encstore as es
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import StoreError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Staging, Store

SIGNING_KEY = "signing.key"                # <keys>/signing.key: Ed25519 private key (PEM), 0600
TRUSTED_KEYS = "trusted"                   # <keys>/trusted/*.pub: the trust set
KEKS = "kek"                               # <keys>/kek/*.key: key-encryption keys


@dataclass(frozen=True)
class SecurityConfig:
    """What a store's security is, from ``store_options`` and the node's keys directory.

    ``signing_key``: a path, or None when this node does not sign. ``trusted_keys``: a directory of
    public keys, or None when no trust set is configured (then signatures are not required).
    ``encryption``: the store's one switch. ``kek_dir``: where the key-encryption keys are.
    ``cache_dir``: where decrypted copies and encrypted-store staging live on this node.
    """

    signing_key: Optional[str] = None
    trusted_keys: Optional[str] = None
    encryption: bool = False
    kek_dir: Optional[str] = None
    kek: Optional[str] = None
    cache_dir: str = _paths.CACHE_DIR

    @property
    def active(self) -> bool:
        """Whether a ``SecureStore`` is needed at all (otherwise the backend is used bare)."""
        return bool(self.signing_key or self.trusted_keys or self.encryption)

    @classmethod
    def from_options(cls, options: Optional[Dict[str, Any]], cache_dir: str) -> "SecurityConfig":
        """Explicit ``store_options`` first; otherwise the node's keys directory, where present."""
        o = options or {}
        base = keys_dir()
        signing = o.get("signing_key") or _present(os.path.join(base, SIGNING_KEY))
        trusted = o.get("trusted_keys") or _present(os.path.join(base, TRUSTED_KEYS))
        return cls(signing_key=signing, trusted_keys=trusted, encryption=bool(o.get("encryption")),
                   kek_dir=o.get("kek_dir") or os.path.join(base, KEKS), kek=o.get("kek"),
                   cache_dir=cache_dir)


def _present(path: str) -> Optional[str]:
    return path if os.path.lexists(path) else None


class SecureStaging:
    """The backend's staging, with the manifest signed (and files encrypted) at publish.

    With encryption (``kek`` given), ``path`` is a node-local plaintext directory (``plain``) for CRIU;
    ``publish`` encrypts what the manifest lists into the backend's staging, adds the encryption block,
    signs last and publishes; the plaintext then becomes this node's decrypted copy. ``abort`` removes both.
    """

    def __init__(self, store: "SecureStore", inner: Staging, plain: Optional[str] = None,
                 kek: Optional[cr.Kek] = None) -> None:
        self.store = store
        self.inner = inner
        self.plain = plain
        self.kek = kek
        self.path = plain or inner.path
        self.snapshot_id = inner.snapshot_id
        self.done = False

    def publish(self, manifest: Dict[str, Any]) -> str:
        enc = self.store.encryption
        try:
            if enc is not None and self.plain and self.kek is not None:
                enc.encrypt_into(self.plain, self.inner.path, manifest, self.kek)
            manifest = self.store._sign(manifest)  # last: over the files as stored and the encryption block
            final = self.inner.publish(manifest)
        except BaseException:
            self.abort()
            raise
        self.done = True
        if enc is not None and self.plain:
            enc.keep_plain(self.plain, manifest)
        return final

    def abort(self) -> None:
        if not self.done:
            self.inner.abort()
            if self.plain:
                shutil.rmtree(self.plain, ignore_errors=True)
            self.done = True


class SecureStore:
    """``inner`` with signatures and encryption (see the module docstring); implements ``Store``."""

    def __init__(self, inner: Store, config: SecurityConfig) -> None:
        self.inner = inner
        self.config = config
        self.root = inner.root
        self.kind = inner.kind
        self.transfer = inner.transfer
        setattr(inner, "admits_encrypted", True)  # its manifests are judged here (_check_encryption)
        self.encryption = es.Encryption(inner, config.kek_dir, config.kek, config.cache_dir) if config.encryption \
            else None
        self._signing_key: Optional[sg.SigningKey] = None   # loaded once, on first use
        self._trust_set: Optional[sg.TrustSet] = None
        self._admitted: Dict[str, Dict[str, Any]] = {}       # id -> the manifest whose signature was checked

    # -- admission: every manifest read from the store ------------------------------------------
    def _admit(self, doc: Dict[str, Any]) -> Dict[str, Any]:
        """``doc`` if its signature and encryption are acceptable here; raise with every reason otherwise."""
        self._check_signature(doc)
        self._check_encryption(doc)
        return doc

    def _check_signature(self, doc: Dict[str, Any]) -> None:
        """Signing (``_signing``): refuse ``doc`` unless its signature verifies against the trust set (if any)."""
        trust = self._trust()
        if trust is not None:
            sg.check(doc, trust, self.root)
            self._admitted[str(doc["id"])] = doc

    def _pinned(self, snapshot_id: str, path: str) -> str:
        """``path``, this node's copy of ``snapshot_id``, once the manifest the copy was made from is the one
        admitted. A backend that copies (S3) reads the manifest again in ``local_dir``: a manifest changed in
        the store between the two reads is refused here, and the copy made from it removed."""
        if self.inner.reads_in_place or self._trust() is None:
            return path
        copied = mf.load(os.path.join(path, mf.MANIFEST))
        admitted = self._admitted.get(snapshot_id)
        try:
            if admitted is None:
                self._check_signature(copied)
            elif sg.canonical(copied) != sg.canonical(admitted) or copied.get("signature") != admitted.get("signature"):
                raise sg.SignatureError(f"snapshot {snapshot_id} ({self.root}) is refused: its manifest changed in "
                                        "the store while this node read it (the copy no longer matches the manifest "
                                        "whose signature was checked); the copy was removed")
        except sg.SignatureError:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return path

    def _trust(self) -> Optional[sg.TrustSet]:
        """The trust set (loaded once), or None when none is configured; KeyFileError when it cannot be used."""
        if self._trust_set is None and self.config.trusted_keys:
            self._trust_set = sg.load_trust_set(self.config.trusted_keys)
        return self._trust_set

    def _signer(self) -> Optional[sg.SigningKey]:
        """This node's signing key (loaded once), or None when it does not sign; KeyFileError when unusable."""
        if self._signing_key is None and self.config.signing_key:
            self._signing_key = sg.load_signing_key(self.config.signing_key)
        return self._signing_key

    def _check_encryption(self, doc: Dict[str, Any]) -> None:
        """Encryption (``_crypt``): refuse ``doc`` when it is encrypted and this store is not, or the reverse, or
        when no KEK of this node unwraps its data key (all at load, before anything else is read)."""
        if self.encryption is not None:
            self.encryption.admit(doc)
        elif doc.get("encryption") is not None:
            raise StoreError(f"snapshot {doc.get('id')} in store {self.root} is encrypted: set "
                             "store_options.encryption (with this node's key-encryption keys, node_prep_keks)")

    def _sign(self, manifest: Dict[str, Any]) -> Dict[str, Any]:
        """Signing: ``manifest`` with its signature, when this node has a signing key (called last in publish)."""
        key = self._signer()
        return sg.sign(manifest, key) if key is not None else manifest

    def load(self, snapshot_id: str) -> Dict[str, Any]:
        return self._admit(self.inner.load(snapshot_id))

    def list(self) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        self._trust()  # a trust set that cannot be used fails the listing, not each snapshot
        for doc in self.inner.list():
            if "error" in doc and "files" not in doc:
                out.append(doc)
                continue
            try:
                out.append(self._admit(doc))
            except Exception as exc:  # noqa: BLE001 - any refusal is shown as this snapshot's error
                out.append({"id": doc.get("id"), "error": str(exc)})
        return out

    # -- writing ----------------------------------------------------------------------------------
    def stage(self, snapshot_id: str) -> Staging:
        """Encryption owns this (node-local staging, encrypted into the backend's at publish); signing happens
        through ``SecureStaging.publish`` calling ``_sign`` last."""
        self._signer()  # an unusable signing key refuses the checkpoint before CRIU runs
        if self.encryption is None:
            return SecureStaging(self, self.inner.stage(snapshot_id))
        kek = self.encryption.check_writable()  # no KEK to write with: refused before CRIU runs
        inner = self.inner.stage(snapshot_id)
        return SecureStaging(self, inner, self.encryption.new_staging(), kek)

    # -- plain delegation ---------------------------------------------------------------------------
    @property
    def snapshots(self) -> str:
        return self.inner.snapshots

    @property
    def reads_in_place(self) -> bool:
        return self.inner.reads_in_place and not self.config.encryption

    def describe(self) -> Dict[str, Any]:
        return self.inner.describe()

    def cache_root(self) -> Optional[str]:
        return self.encryption.plain_root if self.encryption is not None else self.inner.cache_root()

    def snapshot_dir(self, snapshot_id: str) -> str:
        return self.inner.snapshot_dir(snapshot_id)

    def check_usable(self) -> None:
        self._signer()
        self.inner.check_usable()
        if self.encryption is not None:
            self.encryption.check_writable()

    def ensure(self) -> None:
        self.inner.ensure()

    def exists(self, snapshot_id: str) -> bool:
        return self.inner.exists(snapshot_id)

    # -- reading: an encrypted snapshot through this node's decrypted copy ------------------------------
    def _doc(self, enc: es.Encryption, snapshot_id: str) -> Dict[str, Any]:
        """The admitted manifest of ``snapshot_id`` (loaded, and so admitted, when this object has not yet)."""
        return enc.docs.get(snapshot_id) or self.load(snapshot_id)

    def local_dir(self, snapshot_id: str) -> str:
        if self.encryption is None:
            return self._pinned(snapshot_id, self.inner.local_dir(snapshot_id))
        return self.encryption.local_dir(self._doc(self.encryption, snapshot_id))

    def verify(self, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
        if self.encryption is None or not fetch:
            problems = self.inner.verify(doc, fetch=fetch, cached=cached)  # check mode: the stored bytes
            if fetch:
                self._pinned(doc["id"], self.inner.local_dir(doc["id"]))
            return problems
        if doc.get("id") not in self.encryption.keys:
            self._admit(doc)  # a manifest this object did not load: its key comes from admission
        return self.encryption.verify(doc, cached)

    def fetch_file(self, snapshot_id: str, entry: Dict[str, Any], path: str, verify: bool = True) -> None:
        if self.encryption is None:
            self.inner.fetch_file(snapshot_id, entry, path, verify=verify)
            return
        self._doc(self.encryption, snapshot_id)
        self.encryption.fetch_file(snapshot_id, entry, path)  # always checked: decrypting authenticates

    def read_range(self, snapshot_id: str, rel: str, offset: int, length: int) -> bytes:
        if self.encryption is None:
            return self.inner.read_range(snapshot_id, rel, offset, length)
        self._doc(self.encryption, snapshot_id)
        return self.encryption.read_range(snapshot_id, rel, offset, length)

    def staging_entries(self) -> List[Dict[str, Any]]:
        entries = self.inner.staging_entries()
        return self.encryption.staging_entries(entries) if self.encryption is not None else entries

    def delete(self, snapshot_id: str) -> int:
        size = self.inner.delete(snapshot_id)
        if self.encryption is not None:
            self.encryption.forget(snapshot_id)
        return size

    def delete_staging(self, path: str) -> int:
        if self.encryption is not None and self.encryption.owns_staging(path):
            return self.encryption.delete_staging(path)
        return self.inner.delete_staging(path)
