"""Both store backends implement the engine's Store protocol (and their staging areas the Staging one)."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, List, Type

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _s3store as s3s
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storeapi as api
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores


def _members(proto: Type[Any]) -> List[str]:
    names = set(getattr(proto, "__annotations__", {})) | {n for n in vars(proto) if not n.startswith("_")}
    return sorted(names)


def _check_signatures(proto: Type[Any], cls: Type[Any]) -> None:
    """Every method of the protocol exists on ``cls`` with the same parameter names, in order."""
    for name in _members(proto):
        wanted = inspect.getattr_static(proto, name, None)
        if not inspect.isfunction(wanted):
            continue
        have = inspect.getattr_static(cls, name)
        assert inspect.isfunction(have), f"{cls.__name__}.{name} is not a method"
        assert list(inspect.signature(have).parameters) == list(inspect.signature(wanted).parameters), name


@pytest.mark.parametrize("cls", [st.FsStore, s3s.S3Store])
def test_both_stores_have_every_member_of_the_protocol(cls: Type[Any]) -> None:
    _check_signatures(api.Store, cls)
    for name in _members(api.Store):
        assert hasattr(cls, name) or name in ("root", "transfer"), f"{cls.__name__} lacks {name}"


def test_instances_satisfy_the_protocols(tmp_path: Path) -> None:
    fs = stores.open_store(str(tmp_path / "store"))
    s3 = stores.open_store("s3://bucket/prefix", {"cache_dir": str(tmp_path / "cache")})
    assert isinstance(fs, st.FsStore) and isinstance(s3, s3s.S3Store)
    for store in (fs, s3):
        assert isinstance(store, api.Store)
        assert set(store.describe()) == {"url", "kind", "exists"}
    assert fs.reads_in_place and not s3.reads_in_place
    assert fs.cache_root() is None and s3.cache_root() == str(tmp_path / "cache" / "s3" / "bucket__prefix")
    staging = fs.stage(mf.new_id())
    assert isinstance(staging, api.Staging)
    staging.abort()
    _check_signatures(api.Staging, st.Staging)
    _check_signatures(api.Staging, s3s.S3Staging)


def test_store_does_not_import_the_s3_backend() -> None:
    source = inspect.getsource(st)
    assert "_s3store" not in source and "S3Store" not in source


def test_check_usable_writes_nothing_and_refuses_what_ensure_would(tmp_path: Path) -> None:
    store = st.FsStore(str(tmp_path / "a" / "store"))
    store.check_usable()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(st.StoreError, match="cannot create"):
        st.FsStore(str(tmp_path / "file")).check_usable()
    with pytest.raises(st.StoreError, match="cannot create"):
        st.FsStore(str(tmp_path / "file")).ensure()
    (tmp_path / "linked").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked" / "snapshots").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(st.StoreError, match="is a symlink"):
        st.FsStore(str(tmp_path / "linked")).check_usable()
