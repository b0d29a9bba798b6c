# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CRIU image files as protobuf entries: read, and rewritten in place.

An image is an 8-byte header (``IMG_COMMON`` magic, the image's own magic;
``inventory.img`` has only its own) followed by entries, each a little-endian u32 length and a protobuf message.
``decode`` / ``encode`` keep the header and every field they do not touch;
messages come from pycriu's generated modules only (works across protobuf
versions, unlike pycriu's dict decoder). Used by the pstree rewrite
(``_pstree``) and by the checkpoint archive's key mapping (``external_keys``).
"""
from __future__ import annotations

import glob
import os
import struct
from typing import Any, Callable, Dict, List, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

HEADER = 8


class ImageError(WarmstartError):
    """An image that cannot be read or rewritten; the message names it and the cause."""


def message(module: str, name: str) -> Any:
    """pycriu's generated message class ``name`` of ``pycriu.images.<module>``."""
    try:
        mod = __import__(f"pycriu.images.{module}", fromlist=[name])
    except ImportError as exc:
        raise ImageError(f"pycriu's images are not importable ({exc}); prepare the node with "
                         "warmstart.snapshot.node_prep") from None
    return getattr(mod, name)


def decode(data: bytes, entry_type: Any, where: str, header: int = HEADER) -> Tuple[bytes, List[Any]]:
    """(header, entries) of an image's bytes; ``header``: its length (4 for ``inventory.img``, which has only
    its own magic)."""
    if len(data) < header:
        raise ImageError(f"{where} of {len(data)} bytes has no header")
    out, off = [], header
    while off < len(data):
        if off + 4 > len(data):
            raise ImageError(f"{where} truncated at byte {off}")
        (size,) = struct.unpack_from("<I", data, off)
        body = data[off + 4:off + 4 + size]
        if len(body) != size:
            raise ImageError(f"{where} truncated in the entry at byte {off}")
        entry = entry_type()
        try:
            entry.ParseFromString(body)
        except Exception as exc:  # pylint: disable=broad-except  # protobuf's DecodeError differs by version
            raise ImageError(f"{where}: the entry at byte {off} cannot be decoded ({exc})") from None
        out.append(entry)
        off += 4 + size
    return data[:header], out


def encode(header: bytes, entries: List[Any]) -> bytes:
    parts = [header]
    for entry in entries:
        body = entry.SerializeToString()
        parts.append(struct.pack("<I", len(body)) + body)
    return b"".join(parts)


def load(path: str, entry_type: Any) -> Tuple[bytes, List[Any]]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ImageError(f"{path}: {exc.strerror or exc}") from None
    return decode(data, entry_type, path)


def rewrite(path: str, entry_type: Any, change: Callable[[List[Any]], bool]) -> bool:
    """Decode ``path``, let ``change`` edit its entries in place (it returns whether it changed any), and
    replace the file atomically (mode kept) when it did."""
    header, entries = load(path, entry_type)
    if not change(entries):
        return False
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, os.stat(path).st_mode & 0o777)
    with os.fdopen(fd, "wb") as handle:
        handle.write(encode(header, entries))
    os.rename(tmp, path)
    return True


def _mount_images(images_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(glob.escape(images_dir), "mountpoints-*.img")))


def _netns_images(images_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(glob.escape(images_dir), "netns-*.img")))


def is_key_image(name: str) -> bool:
    """Whether the image file ``name`` is one ``external_keys`` reads."""
    return name.endswith(".img") and (name.startswith("mountpoints-") or name.startswith("netns-"))


def external_keys(images: Dict[str, bytes]) -> Dict[str, Any]:
    """What a dump declared external, from its images' bytes by file name (``is_key_image``; others are
    ignored): ``{"net": [keys of external network namespaces], "mounts": [{mountpoint, key, fstype, root}]}``
    (fstype as CRIU numbers it; root: the part of its file system that was mounted)."""
    mnt_entry = message("mnt_pb2", "mnt_entry")
    net_entry = message("netdev_pb2", "netns_entry")
    mounts, net = [], []
    for name, data in sorted(images.items()):
        if name.startswith("mountpoints-"):
            for e in decode(data, mnt_entry, name)[1]:
                if e.HasField("ext_key") or e.ext_mount:
                    mounts.append({"mountpoint": _mountpoint(e.mountpoint), "key": e.ext_key, "fstype": e.fstype,
                                   "root": e.root})
        elif name.startswith("netns-"):
            net += [e.ext_key for e in decode(data, net_entry, name)[1] if e.HasField("ext_key")]
    return {"net": net, "mounts": mounts}


def _mountpoint(value: str) -> str:
    """CRIU records mountpoints relative to the dumped root, with a leading '.' in older images."""
    value = value[1:] if value.startswith(".") else value
    return value if value.startswith("/") else "/" + value


def rekey(images_dir: str, net: Dict[str, str], mounts: Dict[str, str]) -> int:
    """Rename external keys: of network namespaces (old key -> new), of mounts (mountpoint -> new key); the
    number of entries changed."""
    changed = [0]
    mnt_entry = message("mnt_pb2", "mnt_entry")
    net_entry = message("netdev_pb2", "netns_entry")

    def mount_keys(entries: List[Any]) -> bool:
        before = changed[0]
        for e in entries:
            new = mounts.get(_mountpoint(e.mountpoint))
            if new is not None and e.HasField("ext_key") and e.ext_key != new:
                e.ext_key = new
                changed[0] += 1
        return changed[0] > before

    def net_keys(entries: List[Any]) -> bool:
        before = changed[0]
        for e in entries:
            if e.HasField("ext_key") and e.ext_key in net:
                e.ext_key = net[e.ext_key]
                changed[0] += 1
        return changed[0] > before

    for path in _mount_images(images_dir):
        rewrite(path, mnt_entry, mount_keys)
    for path in _netns_images(images_dir):
        rewrite(path, net_entry, net_keys)
    return changed[0]
