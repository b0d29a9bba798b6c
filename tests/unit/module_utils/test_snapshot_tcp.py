"""The restore paths' ``tcp`` (_tcp decides): a process restore and a restore into placeholders hand CRIU the
decided mode, report it and why, refuse ``keep`` of a snapshot whose connections were not dumped together with
every other reason, and refuse an unknown mode before anything is touched. CRIU itself is stubbed."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _restore as restore_runner
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _placeholder as ph
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._runtime import ContainerInfo
from tests.support.store_fixtures import make_snapshot

SAME_NODE = "restored on node node-a, which took the snapshot, into the host's network namespace"
OTHER_NODE = "restored on node node-b, the snapshot was taken on node node-a"


# --- a process restore ----------------------------------------------------------

@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """This node as the process restore sees it (hostname node-a: the node that took make_snapshot's snapshots)."""
    here = {"hostname": "node-a"}
    monkeypatch.setattr(snap, "find_criu", lambda path=None: "/usr/local/bin/criu")
    monkeypatch.setattr(rs, "describe_node", lambda criu=None: dict(here))
    return here


def recorded(store: st.FsStore, tcp: str) -> Dict[str, Any]:
    """A published snapshot whose manifest says it was dumped with ``tcp``."""
    doc = make_snapshot(store)
    doc["targets"][0]["criu"] = {"version": "4.2.1", "options": CriuOptions(tcp=tcp).as_dict()}
    path = Path(store.snapshot_dir(doc["id"])) / "manifest.json"
    path.write_text(json.dumps(doc))
    return doc


@pytest.mark.parametrize("here, asked, mode, reason", [
    ("node-a", None, "keep", SAME_NODE),
    ("node-b", None, "close", OTHER_NODE),
    ("node-a", "close", "close", f"tcp: close was asked for (the default would be keep: {SAME_NODE})"),
    ("node-b", "keep", "keep", f"tcp: keep was asked for (the default would be close: {OTHER_NODE})"),
])
def test_check_mode_says_what_a_process_restore_would_do(
        store: st.FsStore, node: Dict[str, Any], tmp_path: Path, here: str, asked: Optional[str], mode: str,
        reason: str) -> None:
    doc = recorded(store, "established")
    node["hostname"] = here
    result = rs.restore(store, doc["id"], skip_compat=True, restore_root=str(tmp_path / "restore"), tcp=asked,
                        check_mode=True)
    assert result["tcp"] == {"mode": mode, "reason": reason}


@pytest.mark.parametrize("here, asked, criu_tcp", [
    ("node-a", None, "established"), ("node-b", None, "close"), ("node-a", "close", "close"),
    ("node-b", "keep", "established"),
])
def test_a_process_restore_hands_criu_the_decided_mode(store: st.FsStore, node: Dict[str, Any], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, here: str,
                                                       asked: Optional[str], criu_tcp: str) -> None:
    doc = recorded(store, "established")
    node["hostname"] = here
    seen: List[CriuOptions] = []

    def criu(criu_path: str, images: str, work: str, opts: CriuOptions, session: Any, pidfile: Any,
             *_held: Any) -> int:
        seen.append(opts)
        raise CriuError("CRIU restore failed: stubbed")

    monkeypatch.setattr(rs, "_run_criu", criu)
    with pytest.raises(CriuError, match="stubbed"):
        rs.restore(store, doc["id"], skip_compat=True, restore_root=str(tmp_path / "restore"), tcp=asked)
    assert [o.tcp for o in seen] == [criu_tcp]
    assert seen[0].ext_unix_sk is True, "the other recorded options stay as the manifest has them"


def test_keep_of_a_snapshot_taken_with_tcp_close_is_refused_with_every_reason(
        store: st.FsStore, node: Dict[str, Any], tmp_path: Path) -> None:
    doc = recorded(store, "close")
    with open(Path(store.snapshot_dir(doc["id"])) / "containers/embed/criu/pages-1.img", "ab") as handle:
        handle.write(b"tampered")
    for check_mode in (True, False):
        with pytest.raises(WarmstartError) as err:
            rs.restore(store, doc["id"], skip_compat=True, restore_root=str(tmp_path / "restore"), tcp="keep",
                       check_mode=check_mode)
        assert err.value.details["outcome"] == "incompatible"
        assert any("pages-1.img" in r for r in err.value.reasons), err.value.reasons
        assert [r for r in err.value.reasons if r.startswith("tcp:")] == [
            "tcp: keep: the snapshot was taken with tcp: close, so its TCP connections were not dumped and cannot "
            "be kept; restore with tcp: close, or checkpoint with tcp: established"]
    assert not (tmp_path / "restore").exists()


def test_an_unknown_tcp_mode_is_refused_before_anything(store: st.FsStore, node: Dict[str, Any],
                                                        tmp_path: Path) -> None:
    doc = recorded(store, "established")
    with pytest.raises(WarmstartError, match="tcp: 'established' is not one of keep, close") as err:
        rs.restore(store, doc["id"], restore_root=str(tmp_path / "restore"), tcp="established")
    assert err.value.details["outcome"] == "failed"
    assert not (tmp_path / "restore").exists()


# --- a restore into placeholders --------------------------------------------------

def container_doc(tcp: str) -> Dict[str, Any]:
    return {"id": "20261203T000000Z-abcdef01", "name": "embed", "source": {"hostname": "node-a"},
            "targets": [{"name": "app", "kind": "container", "path": "app",
                         "criu": {"options": CriuOptions(tcp=tcp).as_dict()}}]}


@pytest.fixture
def placeholders(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """restore_into with CRIU, node, store and runtime faked; ``calls['opts']`` is what each restore was given."""
    calls: Dict[str, Any] = {"opts": [], "doc": container_doc("established")}
    monkeypatch.setattr(rinto, "find_criu", lambda path: "/usr/local/bin/criu")
    monkeypatch.setattr(rinto, "describe_node", lambda criu: {"hostname": "node-a"})
    monkeypatch.setattr(pf, "select", lambda *a, **kw: calls["doc"])
    monkeypatch.setattr(rinto, "incompatibilities", lambda source, node: [])
    monkeypatch.setattr(rinto.ck, "verify_local", lambda store, doc, fetch, cached: [])
    monkeypatch.setattr(rinto, "get_runtime", lambda name: object())
    info = ContainerInfo(id="c" * 64, name="web-1", runtime="podman", image="i", image_id="x", running=True,
                         status="running", pid=4242, cgroup_path="/cg", rootfs="/r", upper_dir=None, hostname="h")
    monkeypatch.setattr(ph, "check_destination",
                        lambda runtime, target, dest, skip: (ph.Destination(source=target, name=dest, info=info), []))

    def restored(runtime: Any, criu: str, store: Any, doc: Dict[str, Any], d: Any, opts: CriuOptions,
                 *rest: Any) -> Dict[str, Any]:
        calls["opts"].append(opts)
        return {"container": d.name, "source": d.source["name"], "result": "succeeded"}

    monkeypatch.setattr(rinto, "_restore_exclusive", restored)
    return calls


PLACEHOLDER = "restored into placeholder web-1's network namespace, not the one the connections were dumped in"


@pytest.mark.parametrize("asked, mode, reason", [
    (None, "close", PLACEHOLDER),
    ("close", "close", f"tcp: close was asked for (also the default: {PLACEHOLDER})"),
    ("keep", "keep", f"tcp: keep was asked for (the default would be close: {PLACEHOLDER})"),
])
def test_a_placeholder_restore_closes_by_default(placeholders: Dict[str, Any], asked: Optional[str], mode: str,
                                                 reason: str) -> None:
    """Even on the node that took the snapshot: the placeholder's network namespace is not the dump's."""
    result = rinto.restore_into(object(), "app=ph", snapshot_id="x", tcp=asked)
    assert result["outcome"] == "succeeded"
    assert result["destinations"] == [{"container": "ph", "source": "app", "result": "succeeded",
                                       "tcp": {"mode": mode, "reason": reason}}]
    assert [o.tcp for o in placeholders["opts"]] == ["established" if mode == "keep" else "close"]
    would = rinto.restore_into(object(), "app=ph", snapshot_id="x", tcp=asked, check_mode=True)
    assert would["destinations"][0]["tcp"] == {"mode": mode, "reason": reason}
    assert len(placeholders["opts"]) == 1, "check mode restored nothing"


def test_keep_into_a_placeholder_of_a_snapshot_taken_with_tcp_close_is_refused(placeholders: Dict[str, Any]) -> None:
    placeholders["doc"] = container_doc("close")
    result = rinto.restore_into(object(), "app=ph", snapshot_id="x", tcp="keep")
    assert result["outcome"] == "failed" and placeholders["opts"] == []
    dest = result["destinations"][0]
    assert dest["result"] == "refused" and dest["reasons"][0].startswith("tcp: keep: the snapshot was taken with tcp: close")
    closed = rinto.restore_into(object(), "app=ph", snapshot_id="x")
    assert closed["destinations"][0]["tcp"]["mode"] == "close" and [o.tcp for o in placeholders["opts"]] == ["close"]


def test_an_unknown_tcp_mode_into_a_placeholder_is_refused_before_anything(
        placeholders: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rinto, "find_criu", lambda path: pytest.fail("looked for CRIU"))
    with pytest.raises(WarmstartError, match="tcp: 'reset' is not one of keep, close") as err:
        rinto.restore_into(object(), "app=ph", snapshot_id="x", tcp="reset")
    assert err.value.details["outcome"] == "failed" and placeholders["opts"] == []


# --- the module's option -----------------------------------------------------------

@pytest.mark.parametrize("into", [None, {"container": "ph", "container_map": None, "pod": None, "runtime": "podman",
                                         "skip_image_check": False, "kill_placeholder_on_failure": True}],
                         ids=["process", "into"])
@pytest.mark.parametrize("tcp", [None, "keep", "close"])
def test_the_restore_module_hands_its_tcp_option_to_the_engine(store: st.FsStore, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               into: Optional[Dict[str, Any]], tcp: Optional[str]) -> None:
    seen: Dict[str, Any] = {}

    def engine(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        seen.update(kwargs)
        return {"id": "i", "name": "embed", "outcome": "succeeded",
                "destinations": [{"container": "ph", "source": "app", "result": "succeeded"}]}

    monkeypatch.setattr(restore_runner.rs, "restore", engine)
    monkeypatch.setattr(restore_runner.rinto, "restore_into", engine)
    params = {"store": store.root, "store_options": None, "snapshot": None, "name": "embed", "labels": None,
              "verify": True, "skip_compat_check": False, "criu_path": None, "restore_root": str(tmp_path / "r"),
              "into": into, "tcp": tcp}
    assert restore_runner.run(params, False)["outcome"] == "succeeded"
    assert "tcp" in seen and seen["tcp"] == tcp
