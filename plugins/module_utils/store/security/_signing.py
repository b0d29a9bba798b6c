# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Signed manifests: the fleet's Ed25519 signing key, the node's trust set, ``sign`` and ``check``.

A manifest lists every file of a snapshot with its size and SHA256, the source node's fingerprint
and (when encrypted) the encryption block; signing the manifest therefore signs the snapshot.

Invariants:

- the signed message is ``CONTEXT`` followed by ``canonical(doc)``: the manifest without its
  ``signature`` field, as JSON with sorted keys, no whitespace, non-ASCII kept, UTF-8. Any change
  to any other field (a file's digest, the id, the source, the encryption block) breaks the
  signature; a signature copied from another snapshot does not verify (its id differs);
- a key id is the first 16 hex digits of SHA256 of the raw 32-byte public key; a signature names
  the key id that made it, so several keys can be trusted at once (rotation) and one removed;
- ``check`` refuses, with the reason in the message: an unsigned manifest, an unsupported
  algorithm, a key id outside the trust set (unknown or removed signer, the trusted ids listed),
  and a signature that does not verify;
- a private key file is used only when it is a regular file that neither group nor others can
  read or write; a configured trust set that cannot be read or holds no key is an error, never
  "trust nothing" or "trust everything".

``cryptography`` is imported only when a key is loaded; without it the error names node_prep.
Pure: no Ansible, no store; the caller passes paths and documents.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

ALG = "ed25519"
CONTEXT = b"warmstart.snapshot manifest v1\0"   # domain separation: a manifest signature signs nothing else
MAX_KEY_FILE = 64 << 10
PUB_SUFFIX = ".pub"


class SignatureError(WarmstartError, ValueError):
    """A snapshot refused by the signature check: unsigned, unknown signer, or a bad signature."""


class KeyFileError(WarmstartError):
    """A signing key or trust set that cannot be used (missing, unsafe mode, malformed, empty)."""


def _crypto() -> Tuple[Any, Any, Any]:
    """(serialization, ed25519, InvalidSignature) from ``cryptography``, or KeyFileError naming node_prep."""
    try:
        # pylint: disable-next=import-outside-toplevel
        from cryptography.exceptions import InvalidSignature
        # pylint: disable-next=import-outside-toplevel
        from cryptography.hazmat.primitives import serialization
        # pylint: disable-next=import-outside-toplevel
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise KeyFileError("signed snapshots need the Python 'cryptography' library on this node "
                           "(python3-cryptography); prepare the node with warmstart.snapshot.node_prep") from None
    return serialization, ed25519, InvalidSignature


def key_id(raw_public: bytes) -> str:
    """The key id of a raw 32-byte Ed25519 public key: the first 16 hex digits of its SHA256."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


def _raw_public(public: Any) -> bytes:
    serialization, _ed, _inv = _crypto()
    raw: bytes = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


@dataclass(frozen=True)
class SigningKey:
    """A loaded private key: ``key_id`` of its public half, ``path`` it came from, ``private`` (cryptography's)."""

    key_id: str
    path: str
    private: Any = field(repr=False)


@dataclass(frozen=True)
class TrustSet:
    """Trusted public keys by key id (``keys``), the file each came from (``files``), and the directory."""

    path: str
    keys: Dict[str, Any] = field(repr=False)
    files: Dict[str, str]

    @property
    def ids(self) -> List[str]:
        return sorted(self.keys)


def _read_key_file(path: str, private: bool) -> bytes:
    """The bytes of a key file: a regular file (symlinks followed), private ones 0600 or stricter."""
    what = "signing key" if private else "trusted key"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise KeyFileError(f"{what} {path} cannot be read: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise KeyFileError(f"{what} {path} is not a regular file; refusing to use it")
    with os.fdopen(fd, "rb") as handle:
        if private and info.st_mode & 0o077:
            raise KeyFileError(f"{what} {path} is accessible by group or others (mode "
                               f"{stat.S_IMODE(info.st_mode):04o}); refusing to use it: chmod 600 it")
        if info.st_size > MAX_KEY_FILE:
            raise KeyFileError(f"{what} {path} is larger than {MAX_KEY_FILE >> 10} KiB: not a key")
        return handle.read(MAX_KEY_FILE)


def load_signing_key(path: str) -> SigningKey:
    """The Ed25519 private key (PEM, PKCS8, unencrypted) at ``path``; KeyFileError saying why not."""
    data = _read_key_file(path, private=True)
    serialization, ed25519, _inv = _crypto()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"signing key {path} is not an unencrypted PEM (PKCS8) private key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path} is not an Ed25519 key ({type(key).__name__})")
    return SigningKey(key_id=key_id(_raw_public(key.public_key())), path=path, private=key)


def load_public_key(path: str) -> Tuple[str, Any]:
    """(key id, public key) of the Ed25519 PEM public key at ``path``."""
    data = _read_key_file(path, private=False)
    serialization, ed25519, _inv = _crypto()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"trusted key {path} is not a PEM public key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise KeyFileError(f"trusted key {path} is not an Ed25519 key ({type(key).__name__})")
    return key_id(_raw_public(key)), key


def load_trust_set(path: str) -> TrustSet:
    """Every ``*.pub`` key in the directory ``path``; KeyFileError (every reason) when unreadable or empty."""
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(PUB_SUFFIX))
    except OSError as exc:
        raise KeyFileError(f"trust set {path} cannot be read: {exc.strerror}; fix it or leave trusted_keys "
                           "unset (then signatures are not checked)") from None
    keys: Dict[str, Any] = {}
    files: Dict[str, str] = {}
    problems: List[str] = []
    for name in names:
        full = os.path.join(path, name)
        try:
            kid, key = load_public_key(full)
        except KeyFileError as exc:
            problems.append(str(exc))
            continue
        keys[kid] = key
        files[kid] = full
    if problems:
        raise KeyFileError(f"trust set {path}: {len(problems)} key file(s) cannot be used", reasons=problems)
    if not keys:
        raise KeyFileError(f"trust set {path} holds no *{PUB_SUFFIX} public key: every snapshot would be "
                           "refused; add keys (node_prep_trusted_keys) or leave trusted_keys unset")
    return TrustSet(path=path, keys=keys, files=files)


def canonical(doc: Dict[str, Any]) -> bytes:
    """The bytes a signature covers: ``doc`` without ``signature``, sorted keys, no whitespace, UTF-8."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def sign(doc: Dict[str, Any], key: SigningKey) -> Dict[str, Any]:
    """A copy of ``doc`` with ``signature: {alg, key_id, value}`` (any previous signature replaced)."""
    value = key.private.sign(CONTEXT + canonical(doc))
    return dict(doc, signature={"alg": ALG, "key_id": key.key_id, "value": base64.b64encode(value).decode("ascii")})


def check(doc: Dict[str, Any], trust: TrustSet, where: str) -> str:
    """The key id that signed ``doc`` (named ``where`` in errors); SignatureError with the reason otherwise."""
    what = f"snapshot {doc.get('id')} ({where})"
    sig = doc.get("signature")
    if sig is None:
        raise SignatureError(f"{what} is refused: it is not signed, and this node trusts only snapshots signed "
                             f"by a key of its trust set {trust.path} ({', '.join(trust.ids)})")
    if not isinstance(sig, dict) or sig.get("alg") != ALG:
        alg = sig.get("alg") if isinstance(sig, dict) else None
        raise SignatureError(f"{what} is refused: signature algorithm {alg!r} is not supported (only {ALG})")
    kid = sig.get("key_id")
    if kid not in trust.keys:
        raise SignatureError(f"{what} is refused: it is signed by key {kid}, which is not in the trust set "
                             f"{trust.path} (an unknown signer, or a key removed from the trust set on "
                             f"rotation); trusted key ids: {', '.join(trust.ids)}")
    try:
        value = base64.b64decode(str(sig.get("value")), validate=True)
    except (binascii.Error, ValueError):
        value = b""
    _ser, _ed, invalid = _crypto()
    try:
        trust.keys[kid].verify(value, CONTEXT + canonical(doc))
    except invalid:
        raise SignatureError(f"{what} is refused: bad signature by key {kid} - the manifest (or a file's "
                             "digest in it) was changed after it was signed, or the signature belongs to "
                             "another snapshot") from None
    return str(kid)
