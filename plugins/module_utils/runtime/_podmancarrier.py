# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A carrier container: podman's own checkpoint archive of an inert container of an image, whose container
config (``config.dump``) and OCI spec (``spec.dump``) a snapshot export takes (``_archiveexport``).

Those two files are podman's internal records of a container; rather than write them, the export has podman
write them for a container of the snapshot's image (``sleep infinity``, or what the caller names), started,
checkpointed with ``--export --ignore-rootfs`` and removed - always removed, also when a step fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Optional, Sequence

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

TIMEOUT = 300
LABEL = "io.warmstart.carrier=1"


class CarrierError(WarmstartError):
    """The carrier container could not be made, checkpointed or removed; the message says which and why."""


def _podman() -> str:
    binary = shutil.which("podman")
    if not binary:
        raise CarrierError("podman is not installed on this node (no podman in PATH): an export has podman write "
                           "its container config")
    return binary


def _run(args: Sequence[str], what: str) -> str:
    try:
        res = subprocess.run([_podman(), *args], capture_output=True, text=True, check=False, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CarrierError(f"{what}: podman did not answer within {TIMEOUT} s") from None
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise CarrierError(f"{what}: {tail}")
    return res.stdout.strip()


def image_problem(image_id: str, image: str) -> Optional[str]:
    """Why podman on this node cannot start a container of ``image_id`` (None when it can)."""
    if not image_id or image_id.startswith("-"):
        return "the snapshot records no image id of its container"
    try:
        _podman()
    except CarrierError as exc:
        return str(exc)
    try:
        _run(["image", "exists", image_id], "podman image exists")
    except CarrierError:
        return f"image {image or '?'} ({image_id[:12]}) is not in podman's images on this node: pull or load it first"
    return None


def checkpoint_archive(image_id: str, name: str, command: List[str], dest: str, volumes: Sequence[str] = ()) -> None:
    """Start a carrier ``name`` of ``image_id`` running ``command`` with ``volumes`` (podman ``-v`` specs), export
    its checkpoint archive (uncompressed, no rootfs diff) to ``dest``; the carrier is removed whatever happens."""
    if os.path.lexists(dest):
        raise CarrierError(f"carrier archive {dest} exists")
    bad = [v for v in volumes if not v or v.startswith("-") or ":" not in v]
    if bad:
        raise CarrierError(f"carrier_volumes: {', '.join(map(repr, bad))} is not a podman volume (HOST:CONTAINER[:OPTIONS])")
    binds = [arg for v in volumes for arg in ("-v", v)]
    try:
        _run(["run", "-d", "--name", name, "--label", LABEL, *binds, image_id, *command], f"starting carrier {name}")
        _run(["container", "checkpoint", "--export", dest, "--compress", "none", "--ignore-rootfs", name],
             f"podman checkpoint of carrier {name}")
    finally:
        try:
            _run(["rm", "-f", "--time", "0", name], f"removing carrier {name}")
        except CarrierError:
            pass  # never there (start failed) or gone; a leftover carries LABEL
