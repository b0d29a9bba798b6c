"""Fixtures the engine's unit tests share."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st


@pytest.fixture(name="store")
def fixture_store(tmp_path: Path) -> st.FsStore:
    """An empty filesystem store under tmp_path/store, its layout created."""
    store = st.FsStore(str(tmp_path / "store"))
    store.ensure()
    return store
