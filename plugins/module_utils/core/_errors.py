# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one root of every error the engine raises on purpose.

Invariants:

- ``str(exc)`` and ``exc.message`` are the one-line cause, naming the object; never the reasons.
- ``exc.reasons`` is a list of strings, every cause at once (empty when the message says it all).
- ``exc.log_tail`` is the end of CRIU's (or a helper's) own log when one failed, else None.
- ``exc.details`` are result fields a caller should still see on failure (what was targeted,
  the partial result); they never hold ``msg``, ``reasons`` or ``criu_log_tail``.

Subclasses keep a second, builtin base (``ValueError``, ``OSError``) where callers or
users catch that; none adds behaviour the module adapter has to know about.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence


class WarmstartError(Exception):
    """An engine refusal or failure: a message, every reason, and CRIU's log tail when it failed."""

    def __init__(self, message: str, reasons: Optional[Sequence[str]] = None, log_tail: Optional[str] = None,
                 **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.reasons: List[str] = [str(r) for r in reasons or []]
        self.log_tail = log_tail
        self.details: Dict[str, Any] = details

    def __str__(self) -> str:
        return self.message

    def with_details(self, **details: Any) -> "WarmstartError":
        """This error, with more result fields for the failure (the caller's context); returns self."""
        self.details.update(details)
        return self

    def full_message(self) -> str:
        """The message followed by every reason, as a module reports it."""
        return self.message + (": " + "; ".join(self.reasons) if self.reasons else "")
