# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A target's application profile (``_profile``) in a checkpoint and in a restore.

Checkpoint (``quiesced``): the profile's ``quiesce`` steps run once the target is ready and locked, before
anything is stopped. A quiesce step that fails ends the checkpoint there (nothing was dumped) and the source
hears its ``resume`` steps; so does a source whose checkpoint failed later, and one that keeps running after
its snapshot was published. A source that was ended (``leave_running: false``) hears nothing.

Restore (``release``): once CRIU let the copy go (and its GPU state is back), the ``release`` steps run and
the ``serving`` probe waits until it serves; a failure of either is the restore's failure - the caller kills
the copy. What each step did, and how long, is in the result's ``profile``.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _appsteps as aps
from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap


def _resume(profile: pf.Profile, pid: int, out: Dict[str, Any]) -> str:
    """Run the source's resume steps; '' when they did, else a note saying what failed."""
    if not profile.resume:
        return ""
    try:
        out["resume"] = aps.run_steps(profile.resume, pid, f"profile {profile.name}: resume")
    except aps.AppStepError as exc:
        out["resume_error"] = str(exc)
        return f"the source was not resumed by its profile: {exc}"
    return ""


@contextlib.contextmanager
def quiesced(target: snap.Target, what: str, leave_running: bool, timings: Dict[str, float],
             out: Dict[str, Any]) -> Iterator[None]:
    """The checkpoint's body runs inside: the source quiesced before, resumed after where it still runs.

    ``out`` collects the result's ``app_profile`` section (name, quiesce, resume)."""
    profile = target.profile
    if profile is None:
        yield
        return
    out["name"] = profile.name
    t0 = time.monotonic()
    prog.phase(f"profile {profile.name}: quiesce")
    try:
        out["quiesce"] = aps.run_steps(profile.quiesce, target.pid, f"profile {profile.name}: quiesce")
    except aps.AppStepError as exc:
        note = _resume(profile, target.pid, out)
        raise snap.SnapshotError(f"{what}: {exc}; nothing was dumped, the source keeps running",
                                 reasons=[note] if note else [], step=exc.step) from None
    timings["quiesce"] = time.monotonic() - t0
    try:
        yield
    except BaseException as exc:
        note = _resume(profile, target.pid, out)
        if note and isinstance(exc, WarmstartError):
            exc.reasons.append(note)
        raise
    if leave_running:
        t0 = time.monotonic()
        note = _resume(profile, target.pid, out)
        timings["resume_source"] = time.monotonic() - t0
        if note:
            out["warning"] = note


def restored_profile(target: Dict[str, Any], override: Optional[pf.Profile]) -> Optional[pf.Profile]:
    """The profile a restored copy is released with: the task's, else the one the snapshot recorded (checked)."""
    if override is not None:
        return override
    try:
        return pf.from_record(target.get("app_profile"))
    except pf.ProfileError as exc:
        raise snap.SnapshotError(f"{exc}; nothing was restored", reasons=exc.reasons) from None


def release(profile: Optional[pf.Profile], pid: int, timings: Dict[str, float]) -> Optional[Dict[str, Any]]:
    """The copy's release steps, then its serving probe; the result's ``app_profile`` section (None without one).
    AppStepError names the step that failed: the caller kills the copy."""
    if profile is None:
        return None
    since = aps.log_sizes(pid, profile.serving)
    t0 = time.monotonic()
    prog.phase(f"profile {profile.name}: release")
    done = aps.run_steps(profile.release, pid, f"profile {profile.name}: release")
    timings["release"] = time.monotonic() - t0
    prog.phase(f"profile {profile.name}: serving")
    waited = aps.wait_probe(profile.serving, pid, f"profile {profile.name}: serving", since=since)
    timings["serving"] = waited
    return {"name": profile.name, "release": done, "serving": profile.serving.describe(),
            "serving_after": round(waited, 3)}
