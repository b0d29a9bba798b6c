"""Ed25519 keys for the signing tests: a keys directory laid out as node_prep writes it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Tuple

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg


def new_key() -> Tuple[bytes, bytes, str]:
    """(private PEM PKCS8, public PEM, key id) of a fresh Ed25519 key."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key()
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, pem, sg.key_id(raw)


def write_signing_key(keys: Path, private: bytes) -> Path:
    """``<keys>/signing.key``, 0600."""
    keys.mkdir(parents=True, exist_ok=True)
    path = keys / "signing.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    os.chmod(path, 0o600)
    return path


def trust(keys: Path, name: str, public: bytes) -> Path:
    """``<keys>/trusted/<name>.pub``."""
    (keys / "trusted").mkdir(parents=True, exist_ok=True)
    path = keys / "trusted" / f"{name}.pub"
    path.write_bytes(public)
    return path


def keys_dir(keys: Path, name: str = "fleet-1") -> str:
    """A keys directory whose signing key is also its only trusted key; returns that key id."""
    private, public, kid = new_key()
    write_signing_key(keys, private)
    trust(keys, name, public)
    return kid
