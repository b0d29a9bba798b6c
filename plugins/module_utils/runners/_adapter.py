# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way a module runs the engine: params in, result dict out.

A module's ``main()`` is its argument spec and one call::

    run_module(module, engine_call, progress=True)

``engine_call(params, check_mode)`` returns the module result (it must say ``changed``). Invariants:

- Check mode is decided once, by the engine call, from its ``check_mode`` argument.
- ``warnings`` in the result (or in a failure's details) are handed to ``module.warn``, not returned as a key.
- A ``WarmstartError`` becomes one failure shape: ``msg`` (message and every reason), ``reasons`` (the list),
  ``criu_log_tail`` (lines, when CRIU or a helper failed) and the error's ``details``.
- An ``OSError`` is reported by path and cause; anything else as its type and text. Both carry the
  traceback in ``exception``, so ``-vvv`` shows where it came from.
- Progress (``progress_file``) is started before the call and finished whatever happens.
- Durations (``_duration.OPTIONS``: seconds, or ``30m``, ``12h``, ``7d``...) reach the call as float seconds; one
  that is none fails the task naming the option, before the call.

No Ansible import here: ``module`` is anything with ``params``, ``check_mode``, ``warn``, ``exit_json`` and
``fail_json`` (the ``Module`` protocol: an ``AnsibleModule``, or a test double).
"""
from __future__ import annotations

import traceback
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Protocol

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _duration as dur
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

Params = Mapping[str, Any]
Result = Dict[str, Any]
EngineCall = Callable[[Params, bool], Result]


class Module(Protocol):
    """What the adapter uses of an ``AnsibleModule``; a test double needs no more."""

    @property
    def params(self) -> Params:
        """The module's options, validated against its argument spec."""

    @property
    def check_mode(self) -> bool:
        """Whether the task runs in check mode."""

    def warn(self, warning: str) -> None:
        """Add a warning to the task's result."""

    def exit_json(self, **kwargs: Any) -> Any:
        """End the module with this result (does not return)."""

    def fail_json(self, **kwargs: Any) -> Any:
        """End the module with this failure (does not return)."""


def failure(exc: BaseException) -> Result:
    """The ``fail_json`` arguments for ``exc`` (see the module docstring)."""
    if isinstance(exc, WarmstartError):
        out: Result = {k: v for k, v in exc.details.items() if k not in ("msg", "reasons", "criu_log_tail")}
        out.update(msg=exc.full_message(), reasons=list(exc.reasons))
        if exc.log_tail:
            out["criu_log_tail"] = exc.log_tail.splitlines()
        return out
    if isinstance(exc, OSError):
        return {"msg": os_error_message(exc), "reasons": [], "exception": _traceback(exc)}
    return {"msg": f"{type(exc).__name__}: {exc}", "reasons": [], "exception": _traceback(exc)}


def os_error_message(exc: OSError) -> str:
    """An OSError as a module reports it: the path, then the cause."""
    return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")


def with_context(exc: Exception, **details: Any) -> Exception:
    """``exc`` carrying ``details`` for its failure (details the error already has win); returns what to raise.

    A ``WarmstartError`` gets the details added; an ``OSError`` becomes a ``WarmstartError`` with the message
    :func:`failure` would give it, so that the context reaches the result; anything else is returned unchanged
    (it is a bug, reported with its traceback).
    """
    if isinstance(exc, OSError) and not isinstance(exc, WarmstartError):
        wrapped = WarmstartError(os_error_message(exc))
        wrapped.__cause__ = exc
        exc = wrapped
    if isinstance(exc, WarmstartError):
        for key, value in details.items():
            exc.details.setdefault(key, value)
    return exc


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def run_module(module: Module, call: EngineCall, *, progress: bool = False) -> NoReturn:
    """Run ``call(module.params, module.check_mode)`` and end the module with its result or its failure."""
    if progress:
        prog.start(module.params.get("progress_file"))
    try:
        result = call(dur.options_in_seconds(module.params), bool(module.check_mode))
    except Exception as exc:  # pylint: disable=broad-exception-caught  # reported, with a traceback when unexpected
        _end(module, failure(exc), progress, module.fail_json, 1)
    _end(module, result, progress, module.exit_json, 0)


def _end(module: Module, result: Result, progress: bool, end: Callable[..., Any], code: int) -> NoReturn:
    """Finish progress, hand over the warnings, then ``end`` (exit_json or fail_json) with ``result``."""
    if progress:
        prog.finish()
    _warn(module, result)
    end(**result)
    raise SystemExit(code)  # exit_json / fail_json do not return; a test double that does is stopped here


def _warn(module: Module, result: Result) -> None:
    """Hand ``result``'s ``warnings`` to ``module.warn`` (on success and on failure) and drop the key."""
    warnings: List[str] = list(result.pop("warnings", None) or [])
    for warning in warnings:
        module.warn(warning)
