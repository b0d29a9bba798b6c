# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restore-pod contract's pure steps as filters: what they need is the pod, not the API server.

``restore_pod_problems``: every way a pod (or pod template) falls short of a restore pod (``_podcontract.validate``);
``restore_pod_outcome``: where a restore pod stands by the reference contract's table (``_podcontract.classify``),
what lost it, and its restore condition. Building a restore pod is ``restore_template``.
"""
from __future__ import annotations

from typing import Any, Dict, List

from ansible.errors import AnsibleFilterError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc


def _pod(value: Any, name: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise AnsibleFilterError(f"{name}: expects a Pod or pod template (a mapping), got {type(value).__name__}")
    return value


def restore_pod_problems(pod: Any, seccomp_profile: str = podapi.SECCOMP_PROFILE) -> List[str]:
    """Every way ``pod`` falls short of the restore-pod contract; [] when it is a restore pod."""
    return pc.validate(_pod(pod, "restore_pod_problems"), seccomp_profile)


def restore_pod_outcome(pod: Any) -> Dict[str, Any]:
    """``pod_outcome`` (Pending, Succeeded, Failed, PartiallySucceeded, Unknown), ``losses``, ``condition`` and
    ``entrypoints`` (the form that keeps each container from starting its workload)."""
    pod = _pod(pod, "restore_pod_outcome")
    return {"pod_outcome": pc.classify(pod), "losses": pc.restore_losses(pod), "condition": pc.restore_condition(pod),
            "entrypoints": pc.entrypoint_forms(pod)}


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"restore_pod_problems": restore_pod_problems, "restore_pod_outcome": restore_pod_outcome}
