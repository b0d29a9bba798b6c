# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""TLS between a page server and the lazy restore it serves: the files CRIU uses, checked before anything starts.

CRIU (built with gnutls) runs mutual TLS when both sides get ``--tls``: the page server requires a client
certificate, and each side verifies the other's against its ``--tls-cacert``. The restoring side also checks
that the page server's certificate names the address it connects to (subjectAltName IP or DNS, else CN); the
page server, started on a handed-over socket, checks no name in the client's certificate (any certificate of
the CA is a client). A client without a certificate, or with one of another CA, fails the handshake on both
sides before a page is sent.

Invariants:

- TLS off: no file is looked at; any of ``tls_ca``/``tls_cert``/``tls_key`` given without ``tls`` is refused.
- TLS on: each file is the one given, else ``<keys dir>/tls/{ca,cert,key}.pem`` (the keys dir is
  E(WARMSTART_KEYS_DIR), else ``/etc/warmstart/keys``; ``node_prep`` puts the files there). Every problem -
  missing, not a regular file, unreadable, not PEM of its kind, a key readable or writable by group or
  others - is listed at once, each with its path, before anything starts.
- Paths handed to CRIU are absolute (CRIU resolves relative ones against its images directory).
- Listening without TLS on anything but a loopback address is refused unless ``insecure`` (``check_listen``).
"""
from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass
from typing import Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._paths import keys_dir

TLS_DIR = "tls"
FILES = {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"}
_PEM_KIND = {"ca": "CERTIFICATE", "cert": "CERTIFICATE", "key": "PRIVATE KEY"}
_READ_LIMIT = 1 << 20


class TlsError(WarmstartError):
    """TLS options that cannot work, or a page server that would listen in the clear."""


@dataclass(frozen=True)
class TlsFiles:
    """The CA (peers' certificates are verified against it), this side's certificate and its private key."""

    ca: str
    cert: str
    key: str

    def criu_args(self) -> List[str]:
        """CRIU's options for mutual TLS with these files."""
        return ["--tls", "--tls-cacert", self.ca, "--tls-cert", self.cert, "--tls-key", self.key]

    def result(self) -> Dict[str, str]:
        """What a module result says about TLS (paths only, never contents)."""
        return {"ca": self.ca, "cert": self.cert, "key": self.key}


def default_paths(keys: Optional[str] = None) -> Dict[str, str]:
    """``<keys dir>/tls/{ca,cert,key}.pem``."""
    base = os.path.join(keys or keys_dir(), TLS_DIR)
    return {kind: os.path.join(base, name) for kind, name in FILES.items()}


def resolve(enabled: bool, ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None,
            keys: Optional[str] = None) -> Optional[TlsFiles]:
    """The checked TLS files when ``enabled``, else None; TlsError with every problem (each path named)."""
    given = {"ca": ca, "cert": cert, "key": key}
    if not enabled:
        named = [f"tls_{kind}" for kind, path in given.items() if path]
        if named:
            raise TlsError(f"{', '.join(named)} given without tls: true; set tls: true to use TLS (or drop them)")
        return None
    defaults = default_paths(keys)
    files = {kind: os.path.abspath(path or defaults[kind]) for kind, path in given.items()}
    problems = [p for kind, path in files.items() for p in _check(kind, path, defaulted=not given[kind])]
    if problems:
        raise TlsError("TLS for the page server cannot be set up", reasons=problems)
    return TlsFiles(**files)


def _check(kind: str, path: str, defaulted: bool) -> List[str]:
    """Problems with one TLS file (none when it is a readable PEM of its kind, a key private to its owner)."""
    label = f"tls_{kind} {path}"
    hint = " (distribute it with warmstart.snapshot.node_prep: node_prep_tls_*)" if defaulted else ""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [f"{label} does not exist{hint}"]
    except OSError as exc:
        return [f"{label} cannot be read: {exc.strerror or exc}"]
    if not stat.S_ISREG(st.st_mode):
        return [f"{label} is not a regular file"]
    problems = []
    if kind == "key" and st.st_mode & 0o077:
        problems.append(f"{label} is readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                        "a private key must be 0600 (chmod 600)")
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            text = handle.read(_READ_LIMIT)
    except OSError as exc:
        return problems + [f"{label} cannot be read: {exc.strerror or exc}"]
    pem = _PEM_KIND[kind]
    if "-----BEGIN " not in text or f"{pem}-----" not in text:
        problems.append(f"{label} is not a PEM {pem.lower()}")
    return problems


def loopback(address: str) -> bool:
    """Whether ``address`` is reachable from this node only (127.0.0.0/8, ::1, localhost)."""
    host = address.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any address


def check_listen(address: str, tls: Optional[TlsFiles], insecure: bool, what: str = "page server") -> None:
    """Refuse to serve pages in the clear beyond this node: a non-loopback ``address`` needs TLS or ``insecure``."""
    if tls is not None or insecure or loopback(address):
        return
    raise TlsError(f"{what}: refusing to listen on {address} without TLS: anyone who can reach it could read "
                   "the snapshot's memory, and anyone who can intercept it could feed the restore other pages. "
                   "Set tls: true (certificates distributed by node_prep, or tls_ca/tls_cert/tls_key), listen on a "
                   "loopback address, or set insecure: true on a network you trust")
