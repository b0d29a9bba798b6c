"""runners/_snapshot_info: list, filter, verify and query a real temporary filesystem store.

What a user sees on failure is pinned through the adapter's failure shape (``_adapter.failure``).
"""
from __future__ import annotations

import os
from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _snapshot_info
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from tests.support.runner_fixtures import failed
from tests.support.store_fixtures import make_snapshot

STORE_OPTIONS: Dict[str, Any] = {}


def info_params(store: st.FsStore, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, name=None, labels={}, details=False,
                     verify=False, query=None), **over)


def test_snapshot_info_lists_newest_first_and_verifies(store: st.FsStore) -> None:
    first = make_snapshot(store, "embed", {"model": "a"})
    second = make_snapshot(store, "embed", {"model": "b"})
    result = _snapshot_info.run(info_params(store, verify=True), True)
    assert result["changed"] is False
    assert result["store"] == {"url": store.root, "kind": "fs", "exists": True}
    assert {s["id"] for s in result["snapshots"]} == {first["id"], second["id"]}
    assert result["count"] == 2 and result["broken"] == [] and result["staging"] == []
    assert all(s["intact"] and s["problems"] == [] for s in result["snapshots"])
    assert result["snapshots"][0]["path"] == store.snapshot_dir(result["snapshots"][0]["id"])
    only_b = _snapshot_info.run(info_params(store, labels={"model": "b"}, query="[].id"), False)
    assert only_b["query_result"] == [second["id"]]


def test_snapshot_info_query_failure_carries_the_result(store: st.FsStore) -> None:
    make_snapshot(store)
    out = failed(_snapshot_info.run, info_params(store, query="[?"))
    assert "is not valid JMESPath" in out["msg"]
    assert out["count"] == 1 and len(out["snapshots"]) == 1 and out["changed"] is False
    assert "store" in out and "broken" in out and "staging" in out


def test_snapshot_info_refuses_an_empty_name(store: st.FsStore) -> None:
    out = failed(_snapshot_info.run, info_params(store, name=" "))
    assert out["msg"].startswith("empty value for name")


def test_snapshot_info_reports_a_broken_snapshot(store: st.FsStore) -> None:
    doc = make_snapshot(store)
    os.unlink(os.path.join(store.snapshot_dir(doc["id"]), "manifest.json"))
    result = _snapshot_info.run(info_params(store), False)
    assert result["count"] == 0 and [b["id"] for b in result["broken"]] == [doc["id"]]
    assert result["broken"][0]["newer_schema"] is False
