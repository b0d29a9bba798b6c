# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet's signing key on the controller: made once, kept like an SSH key, its public half handed out.

``prepare_nodes`` signs snapshots by default: it calls ``ensure`` on the controller, installs the private key
on the nodes that take snapshots and the public key as every node's trust set (``node_prep``).

Invariants:

- a key is made only where none is: the file is created ``O_EXCL|O_NOFOLLOW`` (0600) in a directory made
  0700 when missing (``_safefs.create_file``), so a second run, a racing run or a planted symlink never replaces or leaks a key;
- an existing key is used only after ``_signing.load_signing_key`` accepted it (a regular Ed25519 PKCS8 key,
  0600 or stricter): a key readable by others is refused, never silently reused;
- check mode makes nothing: it says whether a key would be made.
Pure: no Ansible.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg


@dataclass(frozen=True)
class FleetKey:
    """``path`` of the private key; ``created``; its ``key_id`` and ``public_pem`` (None in check mode before
    the key exists)."""

    path: str
    created: bool
    key_id: Optional[str]
    public_pem: Optional[str]


def _public(key: sg.SigningKey) -> str:
    serialization, _ed, _inv = sg._crypto()  # pylint: disable=protected-access
    pem: bytes = key.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem.decode("ascii")


def _create(path: str) -> None:
    """A new Ed25519 key at ``path`` (0600, the directory 0700 when made); FileExistsError when one is there."""
    serialization, ed25519, _inv = sg._crypto()  # pylint: disable=protected-access
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    base = os.path.dirname(os.path.abspath(path))
    os.makedirs(base, 0o700, exist_ok=True)  # the controller user's own directory, like ~/.ssh
    fd = safefs.create_file(os.path.abspath(path), 0o600)
    try:
        view = memoryview(pem)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, 0o600)
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure(path: str, check_mode: bool = False) -> FleetKey:
    """The fleet key at ``path``, made when missing (not in check mode); KeyFileError when the file there
    cannot be used (unsafe mode, not a key) - it is never replaced."""
    created = False
    if not os.path.lexists(path):
        if check_mode:
            return FleetKey(path=path, created=True, key_id=None, public_pem=None)
        try:
            _create(path)
            created = True
        except FileExistsError:
            pass  # another run made it meanwhile: use theirs
        except OSError as exc:
            raise sg.KeyFileError(f"fleet signing key {path} cannot be created: {exc.strerror or exc}") from None
    key = sg.load_signing_key(path)
    return FleetKey(path=path, created=created, key_id=key.key_id, public_pem=_public(key))
