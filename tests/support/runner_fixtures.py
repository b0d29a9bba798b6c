"""Helpers the runner tests (tests/unit/module_utils/test_*_runner.py) share: a failure as the user sees it, a metric."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import failure


def failed(call: Any, params: Dict[str, Any], check_mode: bool = False) -> Dict[str, Any]:
    """``call(params, check_mode)``, which must raise, as the adapter reports it (``_adapter.failure``)."""
    with pytest.raises(Exception) as raised:
        call(params, check_mode)
    return failure(raised.value)


def metric(mdir: Path, sample: str) -> float:
    """The value of one exact sample line's series in the node's metrics file (0 when absent)."""
    for line in (mdir / "warmstart.prom").read_text().splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
