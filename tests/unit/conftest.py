"""Unit tests keep the node's verified-files record (``_checksums.VerifiedFiles``) to themselves."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _checksums as ck


@pytest.fixture(autouse=True)
def _own_verified_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.VERIFIED_DIR_ENV, str(tmp_path / "verified"))
