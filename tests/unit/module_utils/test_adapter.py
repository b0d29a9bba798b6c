"""_adapter.run_module: one success shape, one failure shape, warnings and progress on every path."""
from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _adapter
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError


class Double:
    """What the adapter uses of AnsibleModule; exit_json/fail_json end the run like the real ones."""

    def __init__(self, params: Optional[Dict[str, Any]] = None, check_mode: bool = False,
                 returns: bool = False) -> None:
        self.params = params or {}
        self.check_mode = check_mode
        self.returns = returns
        self.warnings: List[str] = []
        self.exited: Optional[Dict[str, Any]] = None
        self.failed: Optional[Dict[str, Any]] = None

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def exit_json(self, **result: Any) -> None:
        self.exited = result
        if not self.returns:
            raise SystemExit(0)

    def fail_json(self, **result: Any) -> None:
        self.failed = result
        if not self.returns:
            raise SystemExit(1)


def raising(exc: BaseException) -> Any:
    """An engine call that raises ``exc``."""
    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        raise exc
    return call


def run(call: Any, module: Optional[Double] = None, progress: bool = False) -> Double:
    module = module or Double()
    with pytest.raises(SystemExit):
        _adapter.run_module(module, call, progress=progress)
    return module


def test_success_passes_params_and_check_mode_and_returns_the_result() -> None:
    seen: List[Any] = []

    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        seen.append((dict(params), check_mode))
        return {"changed": True, "thing": 1}

    module = run(call, Double({"a": 1}, check_mode=True))
    assert seen == [({"a": 1}, True)]
    assert module.exited == {"changed": True, "thing": 1} and module.failed is None


def test_warnings_go_to_module_warn_not_into_the_result() -> None:
    module = run(lambda p, c: {"changed": False, "warnings": ["one", "two"]})
    assert module.warnings == ["one", "two"]
    assert module.exited == {"changed": False}


def test_warmstart_error_gives_message_reasons_log_tail_and_details() -> None:
    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        raise WarmstartError("restore refused", reasons=["arch differs", "kernel too old"],
                             log_tail="line 1\nline 2", target={"pid": 4}, warnings=["careful"])

    module = run(call)
    assert module.exited is None
    assert module.failed == {"msg": "restore refused: arch differs; kernel too old",
                             "reasons": ["arch differs", "kernel too old"],
                             "criu_log_tail": ["line 1", "line 2"], "target": {"pid": 4}}
    assert module.warnings == ["careful"]


def test_warmstart_error_without_reasons_or_tail() -> None:
    module = run(raising(WarmstartError("plain")))
    assert module.failed == {"msg": "plain", "reasons": []}


def test_os_error_names_path_and_cause_with_a_traceback() -> None:
    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        raise PermissionError(errno.EACCES, "Permission denied", "/var/lib/warmstart/store")

    failed = run(call).failed
    assert failed is not None
    assert failed["msg"] == "/var/lib/warmstart/store: Permission denied"
    assert failed["reasons"] == [] and "PermissionError" in failed["exception"]


def test_unexpected_error_is_reported_with_its_type_and_traceback() -> None:
    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        raise KeyError("boom")

    failed = run(call).failed
    assert failed is not None
    assert failed["msg"] == "KeyError: 'boom'"
    assert "Traceback" in failed["exception"] and "KeyError" in failed["exception"]


def test_a_double_that_returns_is_stopped_by_the_adapter() -> None:
    module = Double(returns=True)
    with pytest.raises(SystemExit) as ended:
        _adapter.run_module(module, lambda p, c: {"changed": False})
    assert ended.value.code == 0 and module.exited == {"changed": False}
    module = Double(returns=True)
    with pytest.raises(SystemExit) as ended:
        _adapter.run_module(module, raising(WarmstartError("no")))
    assert ended.value.code == 1 and module.failed is not None


def _progress_seen(path: Path) -> Dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def test_progress_started_and_finished_on_success(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    during: List[bool] = []

    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog  # pylint: disable=import-outside-toplevel
        prog.phase("dump", 10)
        during.append(_progress_seen(path)["phase"] == "dump")
        return {"changed": True}

    run(call, Double({"progress_file": str(path)}), progress=True)
    assert during == [True]
    assert _progress_seen(path)["phase"] == "done"


def test_progress_finished_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"

    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        raise WarmstartError("failed midway")

    module = run(call, Double({"progress_file": str(path)}), progress=True)
    assert module.failed is not None
    assert _progress_seen(path)["phase"] == "done"


def test_without_progress_no_file_is_written(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    run(lambda p, c: {"changed": False}, Double({"progress_file": str(path)}))
    assert not path.exists()


def test_with_context_adds_details_without_overriding_and_wraps_os_errors() -> None:
    exc = WarmstartError("refused", outcome="incompatible")
    assert _adapter.with_context(exc, outcome="failed", target={}) is exc
    assert exc.details == {"outcome": "incompatible", "target": {}}
    wrapped = _adapter.with_context(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), target={})
    assert isinstance(wrapped, WarmstartError)
    assert wrapped.message == "/x: No such file or directory" and wrapped.details == {"target": {}}
    assert isinstance(wrapped.__cause__, FileNotFoundError)
    other = KeyError("k")
    assert _adapter.with_context(other, target={}) is other


def test_durations_reach_the_call_as_seconds_and_a_bad_one_fails_naming_the_option() -> None:
    seen: List[Any] = []

    def call(params: Any, check_mode: bool) -> Dict[str, Any]:
        seen.append(dict(params))
        return {"changed": False}

    module = run(call, Double({"timeout": "1m30s", "ready_timeout": 5, "max_age": "7d", "lazy_timeout": None,
                               "name": "12h"}))
    # every duration option in float seconds; a non-duration option with a duration-like value untouched
    assert seen == [{"timeout": 90.0, "ready_timeout": 5.0, "max_age": 604800.0, "lazy_timeout": None,
                     "name": "12h"}]
    assert module.exited == {"changed": False}

    seen.clear()
    module = run(call, Double({"stop_timeout": "10x"}))
    assert seen == []  # refused before the call
    assert module.failed is not None and module.failed["msg"].startswith("stop_timeout: unknown unit 'x' in '10x'")

    module = run(call, Double({"lazy_timeout": " "}))
    assert seen == []  # an empty value would override the default with None: refused, saying what to do
    assert module.failed is not None and module.failed["msg"].startswith("lazy_timeout: an empty string is no duration")
