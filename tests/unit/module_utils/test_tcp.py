"""_tcp: keep or close a snapshot's established TCP connections on restore - the default decision table, an
explicit choice, the refusal of keep for a snapshot whose connections were not dumped, and what CRIU is told."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _tcp as tcpm
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions, to_rpc

# (placeholder, node that took the snapshot, this node) -> default mode, its reason
DEFAULTS = [
    (None, "node-a", "node-a", "keep", "restored on node node-a, which took the snapshot, into the host's network namespace"),
    (None, "node-a", "node-b", "close", "restored on node node-b, the snapshot was taken on node node-a"),
    (None, None, "node-b", "close", "the snapshot does not record the node that took it"),
    (None, "", "node-b", "close", "the snapshot does not record the node that took it"),
    ("web-1", "node-a", "node-a", "close",
     "restored into placeholder web-1's network namespace, not the one the connections were dumped in"),
    ("web-1", "node-a", "node-b", "close",
     "restored into placeholder web-1's network namespace, not the one the connections were dumped in"),
    ("web-1", None, "", "close",
     "restored into placeholder web-1's network namespace, not the one the connections were dumped in"),
]


@pytest.mark.parametrize("placeholder, source, here, mode, reason", DEFAULTS)
def test_the_default_closes_unless_the_process_comes_back_where_it_was_dumped(
        placeholder: Optional[str], source: Optional[str], here: str, mode: str, reason: str) -> None:
    assert tcpm.default(placeholder, source, here) == tcpm.TcpPlan(mode, reason)
    got, problems = tcpm.plan(None, "established", placeholder, source, here)
    assert (got, problems) == (tcpm.TcpPlan(mode, reason), [])
    assert got.result() == {"mode": mode, "reason": reason}


@pytest.mark.parametrize("placeholder, source, here, default_mode, reason", DEFAULTS)
@pytest.mark.parametrize("requested", ["keep", "close"])
def test_an_explicit_mode_wins_and_says_what_the_default_was(
        requested: str, placeholder: Optional[str], source: Optional[str], here: str, default_mode: str,
        reason: str) -> None:
    got, problems = tcpm.plan(requested, "established", placeholder, source, here)
    also = "also the default" if requested == default_mode else f"the default would be {default_mode}"
    assert problems == []
    assert got == tcpm.TcpPlan(requested, f"tcp: {requested} was asked for ({also}: {reason})")


@pytest.mark.parametrize("requested, problems", [
    (None, []),
    ("close", []),
    ("keep", ["tcp: keep: the snapshot was taken with tcp: close, so its TCP connections were not dumped and "
              "cannot be kept; restore with tcp: close, or checkpoint with tcp: established"]),
])
def test_a_snapshot_taken_with_tcp_close_can_only_close(requested: Optional[str], problems: List[str]) -> None:
    """CRIU dumped no connection state (dump_one_tcp returns early with tcp_close): nothing to keep."""
    got, found = tcpm.plan(requested, "close", None, "node-a", "node-a")
    assert got == tcpm.TcpPlan("close", "the snapshot was taken with tcp: close, its connections were not dumped")
    assert found == problems


def test_a_snapshot_taken_with_tcp_none_says_it_holds_no_connection() -> None:
    got, problems = tcpm.plan(None, "none", None, "node-a", "node-a")
    assert problems == [] and got.mode == "keep"
    assert got.reason.endswith("; the snapshot holds no established connection (taken with tcp: none)")


def test_an_unknown_mode_is_named() -> None:
    assert tcpm.invalid(None) is None and tcpm.invalid("keep") is None and tcpm.invalid("close") is None
    assert tcpm.invalid("established") == "tcp: 'established' is not one of keep, close"
    got, problems = tcpm.plan("reset", "established", None, "node-a", "node-a")
    assert problems == ["tcp: 'reset' is not one of keep, close"] and got.mode == "keep"


@pytest.mark.parametrize("mode, established, close", [("keep", True, None), ("close", None, True)])
def test_the_mode_becomes_crius_tcp_option(mode: str, established: Optional[bool], close: Optional[bool]) -> None:
    """keep re-creates the connections (tcp_established), close restores them closed (tcp_close); never both."""
    opts = SimpleNamespace(external=[], ext_mnt=[], inherit_fd=[], join_ns=[], cg_root=[])
    to_rpc(CriuOptions(tcp=tcpm.TcpPlan(mode, "why").criu_tcp), opts)
    assert getattr(opts, "tcp_established", None) is established
    assert getattr(opts, "tcp_close", None) is close


def _conn(local: str, remote: str, internal: bool) -> Dict[str, Any]:
    return {"local": local, "remote": remote, "internal": internal}


def test_a_placeholder_keeps_connections_whose_both_ends_are_in_the_snapshot_and_says_so() -> None:
    pair = [_conn("127.0.0.1:44011", "127.0.0.1:58596", True), _conn("127.0.0.1:58596", "127.0.0.1:44011", True)]
    got, problems = tcpm.plan(None, "established", "web-1", "node-a", "node-b", pair)
    assert problems == [] and got.mode == "keep" and got.criu_tcp == "established"
    assert got.reason.startswith("every established connection (2) has both ends in the snapshot, over loopback")
    assert [c["done"] for c in got.result()["connections"]] == ["kept", "kept"]
    got = tcpm.plan("close", "established", "web-1", "node-a", "node-b", pair)[0]  # asked for: asked for wins
    assert got.mode == "close" and got.result()["connections"][0]["done"] == "closed"
    got = tcpm.plan(None, "close", "web-1", "node-a", "node-b", pair)[0]  # not dumped: nothing to keep
    assert got.mode == "close" and "connections" not in got.result()


def test_a_placeholder_keeps_the_loopback_connections_and_closes_those_that_leave() -> None:
    """The shape of a tensor-parallel server: its workers' store over loopback, a client's keep-alive from outside."""
    pair = [_conn("127.0.0.1:29500", "127.0.0.1:58596", True), _conn("127.0.0.1:58596", "127.0.0.1:29500", True)]
    client = _conn("10.88.0.5:8000", "10.88.0.1:40000", False)
    got, problems = tcpm.plan(None, "established", "web-1", "node-a", "node-b", pair + [client])
    assert problems == [] and got.mode == "mixed" and got.criu_tcp == "established"
    assert got.reason == ("2 of the 3 established connections have both ends in the snapshot, over loopback, and are "
                          "kept in placeholder web-1's network namespace; the other 1 lead out of it or use the "
                          "source's own address, and are closed")
    assert [(c["local"], c["done"]) for c in got.result()["connections"]] == [
        ("127.0.0.1:29500", "kept"), ("127.0.0.1:58596", "kept"), ("10.88.0.5:8000", "closed")]
    assert sorted(got.kept) == [("127.0.0.1:29500", "127.0.0.1:58596"), ("127.0.0.1:58596", "127.0.0.1:29500")]
    none_left = tcpm.plan(None, "none", "web-1", "node-a", "node-b", pair + [client])[0]
    assert none_left.mode == "mixed" and none_left.kept == got.kept  # a note on the reason keeps the plan
    asked = tcpm.plan("keep", "established", "web-1", "node-a", "node-b", pair + [client])[0]
    assert asked.mode == "keep" and [c["done"] for c in asked.result()["connections"]] == ["kept"] * 3
    assert asked.reason.startswith("tcp: keep was asked for (the default would be mixed: 2 of the 3")


@pytest.mark.parametrize("conns", [
    [_conn("10.88.0.5:29500", "10.88.0.5:58596", True), _conn("10.88.0.5:58596", "10.88.0.5:29500", True)],
    [_conn("10.88.0.5:8000", "10.88.0.1:40000", False)],
    [_conn("[::1]:8000", "[::1]:40000", False)],  # loopback, but its other end is not in the snapshot
], ids=["inside-over-the-pods-address", "leaving", "loopback-to-outside"])
def test_a_placeholder_closes_what_does_not_stay_inside_over_loopback(conns: List[Dict[str, Any]]) -> None:
    got = tcpm.plan(None, "established", "web-1", "node-a", "node-b", conns)[0]
    assert got.mode == "close" and got.criu_tcp == "close" and got.kept == ()
    assert got.reason == (f"restored into placeholder web-1's network namespace: {len(conns)} of the {len(conns)} "
                          "established connections lead out of the snapshot or use the source's own address")
    assert {c["done"] for c in got.result()["connections"]} == {"closed"}


def test_ipv6_loopback_inside_the_snapshot_stays() -> None:
    pair = [_conn("[::1]:29500", "[::1]:58596", True), _conn("[::1]:58596", "[::1]:29500", True)]
    assert tcpm.plan(None, "established", "web-1", None, "", pair)[0].mode == "keep"
    assert not tcpm.stays_inside(_conn("?:1", "?:2", True))
