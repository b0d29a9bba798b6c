"""runners/_page_server: the page_server module's call against a real temporary filesystem store (CRIU found by a
stub, never run): check mode verifies and starts nothing; refusals.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _page_server
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from tests.support.runner_fixtures import failed
from tests.support.store_fixtures import make_snapshot, tree

STORE_OPTIONS: Dict[str, Any] = {}


def page_params(store: st.FsStore, tmp_path: Path, snapshot: str, **over: Any) -> Dict[str, Any]:
    return dict(dict(store=store.root, store_options=STORE_OPTIONS, snapshot=snapshot, address="127.0.0.1",
                     port=27000, timeout=5, verify=True, criu_path=None, log_dir=str(tmp_path / "logs")), **over)


def test_page_server_check_mode_verifies_and_starts_nothing(store: st.FsStore, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: "/usr/local/bin/criu")
    doc = make_snapshot(store)
    before = tree(tmp_path)
    result = _page_server.run(page_params(store, tmp_path, doc["id"]), True)
    assert result == {"changed": True, "page_server": {"snapshot_id": doc["id"], "address": "127.0.0.1",
                                                       "port": 27000, "tls": False}}
    assert tree(tmp_path) == before


def test_page_server_refusals(store: st.FsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: "/usr/local/bin/criu")
    doc = make_snapshot(store)
    out = failed(_page_server.run, page_params(store, tmp_path, doc["id"], port=0))
    assert out["msg"] == "port: 0 is not a TCP port (1-65535)"
    with open(os.path.join(store.snapshot_dir(doc["id"]), "containers", "embed", "criu", "pages-1.img"), "ab") as fh:
        fh.write(b"more")
    out = failed(_page_server.run, page_params(store, tmp_path, doc["id"]), check_mode=True)
    assert out["msg"].startswith(f"snapshot {doc['id']} is not intact: ") and out["reasons"]
    monkeypatch.setattr("ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._pageserver.find_criu",
                        lambda path: None)
    out = failed(_page_server.run, page_params(store, tmp_path, doc["id"]))
    assert out["msg"].startswith("no CRIU found on this node")
