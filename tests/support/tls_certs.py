"""Test PKI for the page-server TLS tests: CAs and certificates made with the ``cryptography`` library.

``Pki(root)`` writes ``<name>.pem`` (certificate) and ``<name>.key`` (PKCS8 private key, 0600) under ``root``.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import List, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class Pki:
    """CAs and the certificates they issue, as PEM files under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._cas: dict = {}

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Tuple[Path, Path]:
        pem, keyfile = self.root / f"{name}.pem", self.root / f"{name}.key"
        pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return pem, keyfile

    def ca(self, name: str) -> Path:
        """A self-signed CA ``name``; its certificate's path."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                             crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        self._cas[name] = (cert, key)
        return self._write(name, cert, key)[0]

    def issue(self, name: str, ca: str, ips: Optional[List[str]] = None, dns: Optional[List[str]] = None,
              server: bool = False, both: bool = False) -> Tuple[Path, Path]:
        """A certificate ``name`` issued by CA ``ca`` (its subjectAltName: ``ips`` and ``dns``); (cert, key) paths.
        ``server``: for TLS servers only; ``both``: for servers and clients (a peer node); else clients only."""
        ca_cert, ca_key = self._cas[ca]
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names: List[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips or []]
        names += [x509.DNSName(d) for d in dns or [name]]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if both else \
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return self._write(name, cert, key)
