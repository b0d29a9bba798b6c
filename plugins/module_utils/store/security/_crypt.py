# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Encryption at rest: the key-encryption-key ring, wrapped data keys, and the chunked file format.

Keys. A node's KEK ring is a directory of ``*.key`` files, each the base64 text of 32 random bytes
(``node_prep`` distributes them, 0600). A KEK's id is the first 16 hex digits of
SHA256(b"warmstart-kek\\0" + key): it names the key without revealing it. Every snapshot gets a random
32-byte data key, wrapped with AES-256-GCM under one KEK (random 12-byte nonce, AAD = snapshot id,
NUL, KEK id); the manifest's ``encryption`` block holds ``alg``, ``chunk``, ``kek_id``, ``wrapped_key``
and ``nonce`` (base64).

Files. Each file is encrypted under its own subkey, HKDF-SHA256(data key, info = b"warmstart-file\\0" +
relative path), in chunks of ``chunk`` plaintext bytes: chunk ``i`` is AES-256-GCM with nonce = ``i`` as
11 bytes big-endian + 1 byte (1 on the last chunk, else 0), AAD = snapshot id; stored as ciphertext +
16-byte tag, back to back. A file of ``n`` bytes has ``max(1, ceil(n / chunk))`` chunks (an empty file is
one empty chunk: 16 bytes stored). Invariants that follow:

- a chunk decrypts only at its own index, in its own file, of its own snapshot: moving, dropping,
  swapping (between files or snapshots) or truncating at a chunk border fails authentication;
- the stored size alone gives the plaintext size (``plain_size``), and an impossible stored size is
  refused before anything is decrypted;
- nothing here writes a key or plaintext anywhere; callers choose where plaintext goes.

Pure apart from reading the KEK ring; ``cryptography`` is imported lazily (only APIs present in 38).
"""
from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

ALG = "AES-256-GCM-chunked-v1"
CHUNK = 4 << 20           # plaintext bytes per chunk
TAG = 16                  # GCM tag bytes after each chunk
KEY_BYTES = 32
KEK_SUFFIX = ".key"
MAX_CHUNK = 64 << 20


class CryptError(WarmstartError):
    """A key or an encrypted file cannot be used; the message names which and why."""


def _aesgcm() -> Any:
    """``AESGCM`` from ``cryptography``, or a CryptError saying how to get it."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise CryptError("encryption at rest needs the Python 'cryptography' library for the module's Python on "
                         "this node (node_prep installs it: apt-get install python3-cryptography)") from None
    return AESGCM


def require() -> None:
    """Raise CryptError (naming node_prep) when ``cryptography`` cannot be imported here."""
    _aesgcm()


def _hkdf(data_key: bytes, info: bytes) -> bytes:
    _aesgcm()  # the same clear error when cryptography is missing
    from cryptography.hazmat.primitives import hashes  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # pylint: disable=import-outside-toplevel
    return bytes(HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(data_key))


def _invalid_tag() -> Any:
    from cryptography.exceptions import InvalidTag  # pylint: disable=import-outside-toplevel
    return InvalidTag


# -- the KEK ring ---------------------------------------------------------------------------------

def kek_id(key: bytes) -> str:
    """The public name of a KEK: first 16 hex of SHA256(b"warmstart-kek\\0" + key)."""
    return hashlib.sha256(b"warmstart-kek\0" + key).hexdigest()[:16]


def read_kek(path: str) -> bytes:
    """The 32-byte key in ``path`` (base64 text); refused when a symlink, not a regular file, accessible
    by group or others, or not the base64 of exactly 32 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise CryptError(f"key-encryption key {path}: cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CryptError(f"key-encryption key {path}: not a regular file")
        if info.st_mode & 0o077:
            raise CryptError(f"key-encryption key {path}: mode {stat.S_IMODE(info.st_mode):04o} lets group or others "
                             "read it; refusing it (chmod 600)")
        text = handle.read(4096)
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise CryptError(f"key-encryption key {path}: not base64 text") from None
    if len(key) != KEY_BYTES:
        raise CryptError(f"key-encryption key {path}: {len(key)} bytes, expected {KEY_BYTES}")
    return key


@dataclass(frozen=True)
class Kek:
    """One key of the ring: its file name (without ``.key``), id and bytes (never shown)."""

    name: str
    kid: str
    key: bytes

    def __repr__(self) -> str:
        return f"Kek(name={self.name!r}, kid={self.kid!r})"


def load_ring(kek_dir: Optional[str]) -> List[Kek]:
    """Every ``*.key`` of ``kek_dir``, sorted by name; any unusable key file refuses the ring (named)."""
    if not kek_dir:
        raise CryptError("no key-encryption key directory (store_options.kek_dir, or node_prep's <keys>/kek)")
    try:
        names = sorted(n for n in os.listdir(kek_dir) if n.endswith(KEK_SUFFIX))
    except OSError as exc:
        raise CryptError(f"key-encryption keys: cannot read {kek_dir}: {exc.strerror} "
                         "(node_prep distributes them: node_prep_keks)") from None
    ring = []
    for name in names:
        key = read_kek(os.path.join(kek_dir, name))
        ring.append(Kek(name[:-len(KEK_SUFFIX)], kek_id(key), key))
    return ring


def writing_kek(kek_dir: Optional[str], name: Optional[str]) -> Kek:
    """The KEK new snapshots are wrapped with: ``name`` (a file name, with or without ``.key``), or the
    only one in the ring; none, or several without a choice, is refused."""
    ring = load_ring(kek_dir)
    if name:
        want = name[:-len(KEK_SUFFIX)] if name.endswith(KEK_SUFFIX) else name
        for kek in ring:
            if kek.name == want:
                return kek
        raise CryptError(f"key-encryption key {want!r} (store_options.kek) is not in {kek_dir} "
                         f"(there: {', '.join(k.name for k in ring) or 'none'})")
    if not ring:
        raise CryptError(f"no key-encryption key in {kek_dir} (node_prep distributes them: node_prep_keks)")
    if len(ring) > 1:
        raise CryptError(f"several key-encryption keys in {kek_dir} ({', '.join(k.name for k in ring)}): "
                         "name the one that encrypts new snapshots (store_options.kek)")
    return ring[0]


def find_kek(kek_dir: Optional[str], kid: str) -> Kek:
    """The KEK of id ``kid`` in the ring, or a CryptError naming the ids there are."""
    ring = load_ring(kek_dir)
    for kek in ring:
        if kek.kid == kid:
            return kek
    there = ", ".join(f"{k.name} ({k.kid})" for k in ring) or "none"
    raise CryptError(f"its data key is wrapped by key-encryption key {kid}, which is not in {kek_dir} "
                     f"(there: {there})")


# -- data keys --------------------------------------------------------------------------------------

def _aad(snapshot_id: str, kid: str) -> bytes:
    return snapshot_id.encode() + b"\0" + kid.encode()


def new_data_key() -> bytes:
    return os.urandom(KEY_BYTES)


def wrap(data_key: bytes, kek: Kek, snapshot_id: str, chunk: int = CHUNK) -> Dict[str, Any]:
    """The manifest's ``encryption`` block for ``data_key`` wrapped under ``kek``."""
    nonce = os.urandom(12)
    wrapped = _aesgcm()(kek.key).encrypt(nonce, data_key, _aad(snapshot_id, kek.kid))
    return {"alg": ALG, "chunk": chunk, "kek_id": kek.kid,
            "wrapped_key": base64.b64encode(wrapped).decode(), "nonce": base64.b64encode(nonce).decode()}


def _b64(block: Dict[str, Any], field: str, size: int, out: List[str]) -> bytes:
    value = block.get(field)
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        out.append(f"encryption.{field}: not the base64 of {size} bytes")
    return raw


def check_block(block: Any) -> List[str]:
    """Every problem of a manifest's ``encryption`` block (empty = usable)."""
    if not isinstance(block, dict):
        return ["encryption: not a mapping"]
    out: List[str] = []
    if block.get("alg") != ALG:
        out.append(f"encryption.alg {block.get('alg')!r} is not {ALG} (a newer warmstart wrote it?)")
    chunk = block.get("chunk")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or not 4096 <= chunk <= MAX_CHUNK:
        out.append(f"encryption.chunk: not an integer from 4096 to {MAX_CHUNK}")
    kid = block.get("kek_id")
    if not isinstance(kid, str) or len(kid) != 16 or any(c not in "0123456789abcdef" for c in kid):
        out.append("encryption.kek_id: not 16 lowercase hex digits")
    _b64(block, "wrapped_key", KEY_BYTES + TAG, out)
    _b64(block, "nonce", 12, out)
    return out


def unwrap(block: Dict[str, Any], kek: Kek, snapshot_id: str) -> bytes:
    """The data key of ``block`` (checked with ``check_block`` first), or CryptError when it does not unwrap."""
    problems = check_block(block)
    if problems:
        raise CryptError(problems[0], reasons=problems)
    try:
        return bytes(_aesgcm()(kek.key).decrypt(base64.b64decode(block["nonce"]), base64.b64decode(block["wrapped_key"]),
                                                _aad(snapshot_id, kek.kid)))
    except _invalid_tag():
        raise CryptError(f"its data key does not unwrap with key-encryption key {kek.name} ({kek.kid}): "
                         "wrong key, or the encryption block was altered or copied from another snapshot") from None


# -- the chunked file format ------------------------------------------------------------------------

def plain_size(stored: int, chunk: int) -> int:
    """The plaintext size of a file stored in ``stored`` bytes, or CryptError when no file has that size."""
    full, rest = divmod(stored, chunk + TAG)
    if stored == TAG:
        return 0
    if (rest == 0 and full >= 1) or TAG < rest < chunk + TAG:
        return full * chunk + max(0, rest - TAG)
    raise CryptError(f"{stored} bytes cannot be an encrypted file (chunks of {chunk} + {TAG}): truncated or replaced")


def stored_size(plain: int, chunk: int) -> int:
    """The stored size of a file of ``plain`` bytes."""
    return plain + TAG * max(1, -(-plain // chunk))


def chunk_count(stored: int, chunk: int) -> int:
    return max(1, -(-plain_size(stored, chunk) // chunk))


def spans(stored: int, chunk: int, first: int = 0, last: Optional[int] = None) -> List[Tuple[int, int, int]]:
    """(index, offset, length) of the stored chunks ``first``..``last`` (default: all) of a file."""
    n = chunk_count(stored, chunk)
    last = n - 1 if last is None else min(last, n - 1)
    return [(i, i * (chunk + TAG), min(stored, (i + 1) * (chunk + TAG)) - i * (chunk + TAG))
            for i in range(first, last + 1)]


def _nonce(index: int, last: bool) -> bytes:
    return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


class FileCipher:
    """One file's chunks: ``seal``/``open`` chunk ``index`` (``last`` on the final one)."""

    def __init__(self, data_key: bytes, snapshot_id: str, rel: str) -> None:
        self._aead = _aesgcm()(_hkdf(data_key, b"warmstart-file\0" + rel.encode()))
        self._aad = snapshot_id.encode()
        self.rel = rel

    def seal(self, index: int, last: bool, plain: bytes) -> bytes:
        return bytes(self._aead.encrypt(_nonce(index, last), plain, self._aad))

    def open(self, index: int, last: bool, sealed: bytes) -> bytes:
        try:
            return bytes(self._aead.decrypt(_nonce(index, last), sealed, self._aad))
        except _invalid_tag():
            raise CryptError(f"{self.rel}: chunk {index} does not authenticate (altered, moved, truncated, or from "
                             "another file or snapshot)") from None


def _chunks_of(handle: Any, chunk: int) -> Iterator[Tuple[bytes, bool]]:
    """(plaintext, is last) for each chunk of an open file: at least one, possibly empty."""
    current = handle.read(chunk)
    while True:
        following = handle.read(chunk) if len(current) == chunk else b""
        yield current, not following
        if not following:
            return
        current = following


def encrypt_file(src: str, dst: str, cipher: FileCipher, chunk: int = CHUNK,
                 progress: Optional[Callable[[int], None]] = None, digest_chunk: Optional[int] = None) -> Dict[str, Any]:
    """Encrypt ``src`` into ``dst`` (new, 0600, not fsynced); returns the manifest entry of the stored bytes
    (``path`` the cipher's file, ``size``, ``sha256`` and, past ``digest_chunk`` bytes (default
    ``_digest.CHUNK_SIZE``), ``chunks``: what an object store's download checks range by range and nodes share)."""
    hasher = dg.ChunkedHasher(digest_chunk or dg.CHUNK_SIZE)
    with open(src, "rb", buffering=0) as inp, \
            os.fdopen(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as out, \
            concurrent.futures.ThreadPoolExecutor(max_workers=1) as hashing:
        hashed: Optional[concurrent.futures.Future[None]] = None
        for index, (plain, last) in enumerate(_chunks_of(inp, chunk)):
            sealed = cipher.seal(index, last, plain)
            if hashed is not None:
                hashed.result()
            hashed = hashing.submit(hasher.update, sealed)  # on another core while the next chunk is sealed
            out.write(sealed)
            if progress:
                progress(len(plain))
        if hashed is not None:
            hashed.result()
    return hasher.entry(cipher.rel)  # not fsynced, as the backend's own files: a store's reader checks digests


def decrypt_stream(sealed_chunks: Iterable[bytes], cipher: FileCipher, count: int, write: Callable[[bytes], Any],
                   progress: Optional[Callable[[int], None]] = None) -> str:
    """Authenticate and decrypt ``count`` stored chunks in order, passing the plaintext to ``write``;
    returns the SHA256 of the stored bytes (the caller compares it with the manifest)."""
    digest, index = hashlib.sha256(), 0
    for sealed in sealed_chunks:
        if index >= count:
            raise CryptError(f"{cipher.rel}: more chunks than its size allows")
        digest.update(sealed)
        write(cipher.open(index, index == count - 1, sealed))
        if progress:
            progress(len(sealed))
        index += 1
    if index != count:
        raise CryptError(f"{cipher.rel}: {index} of {count} chunks read (truncated)")
    return digest.hexdigest()


def read_plain(read: Callable[[int, int], bytes], cipher: FileCipher, stored: int, chunk: int,
               offset: int, length: int) -> bytes:
    """``length`` plaintext bytes at ``offset`` of a file of ``stored`` bytes, decrypting only the chunks
    covering them (``read(offset, length)`` returns stored bytes)."""
    total = plain_size(stored, chunk)
    end = min(total, offset + length)
    if length <= 0 or offset >= total:
        return b""
    count = chunk_count(stored, chunk)
    parts = []
    for index, off, size in spans(stored, chunk, offset // chunk, (end - 1) // chunk):
        sealed = read(off, size)
        if len(sealed) != size:
            raise CryptError(f"{cipher.rel}: chunk {index}: short read ({len(sealed)} of {size} bytes)")
        parts.append(cipher.open(index, index == count - 1, sealed))
    data = b"".join(parts)
    start = offset - (offset // chunk) * chunk
    return data[start:start + end - offset]
