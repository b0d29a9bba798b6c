# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What more than one runner needs: the store, the TLS files, refusing empty options, warnings.

Each module's ``main()`` is its argument spec and ``_adapter.run_module(module, _<module>.run)``: one runner
file per module (``runners/_<module>.py``), which imports only the engine files that module needs, so that
Ansible ships only those (``test_code_shape`` checks it). Every runner's ``run(params, check_mode) -> result``
translates the module's options into engine calls and shapes their result into the module result (always
with ``changed``; ``warnings`` for ``module.warn``). Invariants every runner keeps:

- Nothing in a runner exits, reports or catches to report: failures are raised (``WarmstartError`` with every
  reason, or ``OSError``) and the adapter turns them into the one failure shape.
- Context a failure must still carry (checkpoint's ``target``, restore's ``outcome``, the container
  restore's ``restore``) is added to the raised error's details (``_adapter.with_context``), never reported.
- Check mode is passed down; the engine decides what it means.
- A refusal is raised before anything is written, and options that only make sense together are checked in
  the runner, not in ``main()`` (``count`` at least 1, ``failed_reason`` only with ``ready=false``).
"""
from __future__ import annotations

from typing import Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _tls
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import Params
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._manifest import ManifestError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._storeapi import Store
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store


def store_from(p: Params) -> Store:
    """The store that ``store`` and ``store_options`` name."""
    return open_store(p["store"], p.get("store_options"))


def tls_files(p: Params) -> Optional[_tls.TlsFiles]:
    """The checked TLS files the options name (None: TLS off); TlsError with every problem."""
    return _tls.resolve(bool(p.get("tls")), p.get("tls_ca"), p.get("tls_cert"), p.get("tls_key"))


def refuse_empty(p: Params, *keys: str) -> None:
    """An empty string is refused, never read as 'any': every such option named at once."""
    empty = [k for k in keys if isinstance(p.get(k), str) and not p[k].strip()]
    empty += [f"{k} (an element)" for k in keys if isinstance(p.get(k), list) and any(not str(v).strip() for v in p[k])]
    if empty:
        raise ManifestError(f"empty value for {', '.join(empty)}: give a snapshot id or name, or leave the option out")


def with_warning(exc: Exception, *warnings: Optional[str]) -> Exception:
    """``exc`` with ``warnings`` added to its failure's warnings (a WarmstartError's details); returns it."""
    if isinstance(exc, WarmstartError):
        exc.details.setdefault("warnings", []).extend(w for w in warnings if w)
    return exc
