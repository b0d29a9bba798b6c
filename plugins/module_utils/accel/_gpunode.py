# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""This node's accelerator, as a restore's compatibility check and the GPU placement ask for it: the checkpoint
backend and the devices, probed once and only when asked."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends as cubk
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpu


ACCELERATOR_WORDS = {"cuda": ("CUDA", "GPU"), "ascend": ("Ascend NPU", "NPU")}


class GpuNode:
    """This node's accelerator checkpoint backend and devices, probed once and only when asked (CPU-only restores
    never ask). ``accelerator`` names the kind (cuda, ascend) in every refusal; ``absent`` says why this node may
    have no such device at all (None when it has one or cannot tell)."""

    def __init__(self, availability: Optional[Callable[[], Tuple[Optional[cubk.Backend], str]]] = None,
                 inventory: Optional[Callable[[], Tuple[List[Dict[str, Any]], Optional[str]]]] = None,
                 accelerator: str = "cuda", absent: Optional[Callable[[], Optional[str]]] = None) -> None:
        self._availability = availability or cubk.availability
        self._inventory = inventory or _gpu.node_gpus
        self._backend: Optional[Tuple[Optional[cubk.Backend], str]] = None
        self._gpus: Optional[Tuple[List[Dict[str, Any]], Optional[str]]] = None
        self.accelerator = accelerator
        self.absent = absent or (lambda: None)

    def asked(self, mode: str) -> str:
        """The option as the user set it, for refusals: ``cuda: required`` or ``accelerator: ascend``."""
        return f"cuda: {mode}" if self.accelerator == "cuda" else f"accelerator: {self.accelerator}"

    @property
    def process_word(self) -> str:
        return ACCELERATOR_WORDS.get(self.accelerator, (self.accelerator, ""))[0]

    @property
    def device_word(self) -> str:
        return ACCELERATOR_WORDS.get(self.accelerator, ("", self.accelerator))[1]

    def backend(self) -> Tuple[Optional[cubk.Backend], str]:
        if self._backend is None:
            self._backend = self._availability()
        return self._backend

    def gpus(self) -> Tuple[List[Dict[str, Any]], Optional[str]]:
        if self._gpus is None:
            self._gpus = self._inventory()
        return self._gpus
