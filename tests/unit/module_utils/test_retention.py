"""Retention decisions: keep_last per group, max_age, staging age, filters, broken snapshots, durations."""
from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.catalog import _retention as ret

NOW = datetime.datetime(2026, 12, 2, 12, 0, 0, tzinfo=datetime.timezone.utc).timestamp()
HOUR = 3600.0
DAY = 86400.0


def snap(n: int, name: str = "embed", age: float = 0.0, labels: Optional[Dict[str, str]] = None,
         created_at: Any = "auto") -> Dict[str, Any]:
    """A manifest created ``age`` seconds before NOW; ``n`` makes the id unique."""
    ts = datetime.datetime.fromtimestamp(NOW - age, datetime.timezone.utc)
    doc: Dict[str, Any] = {
        "schema": 1,
        "id": ts.strftime("%Y%m%dT%H%M%SZ") + f"-{n:08x}",
        "name": name,
        "labels": labels or {},
    }
    if created_at == "auto":
        doc["created_at"] = ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    elif created_at is not None:
        doc["created_at"] = created_at
    return doc


def ids(entries: List[Dict[str, Any]]) -> List[str]:
    return [e["id"] for e in entries]


def run(manifests: List[Dict[str, Any]], staging: Optional[List[Dict[str, Any]]] = None,
        restore_dirs: Optional[List[Dict[str, Any]]] = None, **options: Any) -> ret.Plan:
    return ret.plan(manifests, staging or [], ret.policy(**options), now=NOW, restore_dirs=restore_dirs)


# --- durations ----------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    (90, 90.0), (0, 0.0), (1.5, 1.5), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("12h", 43200.0),
    ("7d", 604800.0), ("2w", 1209600.0), ("1d12h", 129600.0), ("1h30m15s", 5415.0), (" 7D ", 604800.0),
    ("1.5h", 5400.0), ("7 d", 604800.0), ("0s", 0.0),
])
def test_parse_duration_accepts(text: Any, seconds: float) -> None:
    assert ret.parse_duration(text, "max_age") == seconds


@pytest.mark.parametrize("text", [None, ""])
def test_parse_duration_unset(text: Any) -> None:
    assert ret.parse_duration(text) is None


@pytest.mark.parametrize("text, fragment", [
    ("7x", "unknown unit 'x'"),
    ("5min", "unknown unit 'min'"),
    ("-5m", "negative"),
    (-1, "negative"),
    ("abc", "is not a duration"),
    ("h", "is not a duration"),
    ("7d!", "is not a duration"),
    ("1h1h", "unit 'h' appears twice"),
    ("1h30", "mixes a number without a unit"),
    ("30 1h", "mixes a number without a unit"),
    (True, "is a boolean"),
    ([1], "is a list, not a duration"),
])
def test_parse_duration_errors_name_the_option(text: Any, fragment: str) -> None:
    with pytest.raises(ret.RetentionError) as err:
        ret.parse_duration(text, "max_age")
    assert str(err.value).startswith("max_age: ")
    assert fragment in str(err.value)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (59, "59s"), (90, "1m30s"), (3600, "1h"),
                                           (8 * DAY + 2 * HOUR + 5, "8d2h"), (-3, "0s")])
def test_format_duration(seconds: float, text: str) -> None:
    assert ret.format_duration(seconds) == text


# --- policy checks ------------------------------------------------------------

@pytest.mark.parametrize("options, fragment", [
    ({"keep_last": -1}, "keep_last: -1 must be a whole number >= 0"),
    ({"keep_last": True}, "keep_last"),
    ({"keep_last": "2"}, "keep_last"),
    ({"max_age": 0}, "max_age: 0 would remove every snapshot"),
    ({"max_age": "0s"}, "max_age: 0 would remove every snapshot"),
    ({"max_age": "week"}, "max_age: 'week' is not a duration"),
    ({"incomplete_older_than": "soon"}, "incomplete_older_than: 'soon'"),
    ({"group_by": ["model", "model"]}, "listed twice"),
    ({"group_by": [""]}, "group_by: '' is not a label key"),
    ({"group_by": ["bad key!"]}, "label key 'bad key!' is not allowed"),
    ({"name": "../etc"}, "snapshot name '../etc' is not allowed"),
    ({"name": "a/b"}, "is not allowed"),
])
def test_policy_rejects_bad_options(options: Dict[str, Any], fragment: str) -> None:
    with pytest.raises(ret.RetentionError, match=None) as err:
        ret.policy(**options)
    assert fragment in str(err.value)


def test_policy_defaults() -> None:
    pol = ret.policy()
    assert pol.keep_last == 0 and pol.max_age is None and pol.group_by == []
    assert pol.incomplete_older_than == 3600.0
    assert ret.policy(keep_last=None, incomplete_older_than=None).incomplete_older_than == 3600.0
    assert ret.policy(max_age="7d", incomplete_older_than="30m").max_age == 7 * DAY
    assert ret.policy(labels={"model": 1}).labels == {"model": "1"}


# --- keep_last ------------------------------------------------------------------

def test_keep_last_per_name_keeps_the_newest() -> None:
    a = [snap(i, "embed", age=i * HOUR) for i in range(1, 5)]      # a[0] newest
    b = [snap(10 + i, "chat", age=i * DAY) for i in range(1, 3)]
    plan = run(a + b, keep_last=2)
    assert ids(plan.remove) == [a[2]["id"], a[3]["id"]]
    assert set(plan.kept) == {a[0]["id"], a[1]["id"], b[0]["id"], b[1]["id"]}
    by_id = {e["id"]: e for e in plan.remove}
    assert by_id[a[2]["id"]]["reason"] == "keep_last=2 for name=embed (it is the 3rd newest)"
    assert by_id[a[3]["id"]]["reason"] == "keep_last=2 for name=embed (it is the 4th newest)"
    assert by_id[a[2]["id"]]["name"] == "embed" and by_id[a[2]["id"]]["group"] == "name=embed"


def test_keep_last_order_does_not_depend_on_input_order() -> None:
    docs = [snap(i, age=i * 60) for i in range(1, 6)]
    forward = run(docs, keep_last=1)
    backward = run(list(reversed(docs)), keep_last=1)
    assert forward.kept == backward.kept == [docs[0]["id"]]
    assert ids(forward.remove) == ids(backward.remove) == [d["id"] for d in docs[1:]]


def test_keep_last_zero_keeps_everything() -> None:
    docs = [snap(i, age=i * DAY * 100) for i in range(1, 4)]
    plan = run(docs, keep_last=0)
    assert plan.remove == [] and plan.kept == [d["id"] for d in docs] and plan.empty


def test_keep_last_larger_than_group() -> None:
    docs = [snap(i, age=i) for i in range(3)]
    assert run(docs, keep_last=5).remove == []


def test_keep_last_by_label_group() -> None:
    m1 = [snap(i, name=f"n{i}", age=i * HOUR, labels={"model": "m1", "gpu": "h100"}) for i in range(1, 4)]
    m2 = [snap(10 + i, name=f"x{i}", age=i * HOUR, labels={"model": "m2", "gpu": "h100"}) for i in range(1, 3)]
    m1_other_gpu = [snap(20, name="y", age=9 * HOUR, labels={"model": "m1", "gpu": "a10"})]
    unlabelled = [snap(30 + i, name="z", age=i * HOUR) for i in range(1, 3)]
    plan = run(m1 + m2 + m1_other_gpu + unlabelled, keep_last=1, group_by=["model", "gpu"])
    assert set(ids(plan.remove)) == {m1[1]["id"], m1[2]["id"], m2[1]["id"], unlabelled[1]["id"]}
    assert set(plan.kept) == {m1[0]["id"], m2[0]["id"], m1_other_gpu[0]["id"], unlabelled[0]["id"]}
    groups = {e["id"]: e["group"] for e in plan.remove}
    assert groups[m1[1]["id"]] == "model=m1,gpu=h100"
    assert groups[unlabelled[1]["id"]] == "model=(unset),gpu=(unset)"


def test_group_by_label_ignores_names() -> None:
    docs = [snap(1, name="a", age=10, labels={"model": "m"}), snap(2, name="b", age=20, labels={"model": "m"})]
    plan = run(docs, keep_last=1, group_by=["model"])
    assert plan.kept == [docs[0]["id"]] and ids(plan.remove) == [docs[1]["id"]]


def test_same_second_ties_break_by_id() -> None:
    docs = [snap(1, age=5), snap(2, age=5)]
    plan = run(docs, keep_last=1)
    assert plan.kept == [docs[1]["id"]]


def test_created_at_missing_or_malformed_falls_back_to_the_id_time() -> None:
    old = snap(1, age=3 * DAY, created_at=None)
    odd = snap(2, age=2 * DAY, created_at="yesterday")
    new = snap(3, age=HOUR)
    plan = run([new, odd, old], keep_last=1)
    assert plan.kept == [new["id"]]
    assert ids(plan.remove) == [odd["id"], old["id"]]
    assert ret.created_ts(old) == pytest.approx(NOW - 3 * DAY, abs=1)


# --- max_age ----------------------------------------------------------------

def test_max_age_removes_older_snapshots_in_every_group() -> None:
    docs = [snap(1, "a", age=HOUR), snap(2, "a", age=8 * DAY), snap(3, "b", age=30 * DAY)]
    plan = run(docs, max_age="7d")
    assert ids(plan.remove) == [docs[1]["id"], docs[2]["id"]]
    assert plan.kept == [docs[0]["id"]]
    assert plan.remove[0]["reason"] == "older than max_age=7d (age 8d)"


def test_max_age_in_seconds_and_boundary() -> None:
    docs = [snap(1, age=100), snap(2, age=101)]
    plan = run(docs, max_age=100)
    assert ids(plan.remove) == [docs[1]["id"]]


def test_keep_last_and_max_age_combine_with_both_reasons() -> None:
    docs = [snap(1, age=HOUR), snap(2, age=2 * HOUR), snap(3, age=10 * DAY)]
    plan = run(docs, keep_last=2, max_age="1d")
    assert ids(plan.remove) == [docs[2]["id"]]
    assert plan.remove[0]["reason"] == ("keep_last=2 for name=embed (it is the 3rd newest); "
                                        "older than max_age=1d (age 10d)")


def test_max_age_can_empty_a_group() -> None:
    docs = [snap(1, age=2 * DAY), snap(2, age=3 * DAY)]
    plan = run(docs, keep_last=1, max_age="1d")
    assert plan.kept == [] and len(plan.remove) == 2


# --- filters ------------------------------------------------------------------

def test_name_filter_leaves_other_names_alone() -> None:
    docs = [snap(1, "a", age=1), snap(2, "a", age=2), snap(3, "b", age=1), snap(4, "b", age=2)]
    plan = run(docs, keep_last=1, name="a")
    assert ids(plan.remove) == [docs[1]["id"]]
    assert plan.kept == [docs[0]["id"]]  # b's are neither kept nor removed: not considered


def test_labels_filter() -> None:
    docs = [snap(1, age=1, labels={"env": "prod"}), snap(2, age=2, labels={"env": "prod"}),
            snap(3, age=3, labels={"env": "dev"}), snap(4, age=4, labels={"env": "prod", "x": "y"})]
    plan = run(docs, keep_last=1, labels={"env": "prod"})
    assert plan.kept == [docs[0]["id"]]
    assert ids(plan.remove) == [docs[1]["id"], docs[3]["id"]]
    assert docs[2]["id"] not in plan.kept + ids(plan.remove)


def test_filter_matching_nothing_is_an_empty_plan() -> None:
    plan = run([snap(1, age=DAY * 400)], max_age="1d", name="other")
    assert plan.empty and plan.kept == [] and plan.remove == []


# --- broken snapshots -------------------------------------------------------------

BROKEN = {"id": "20261101T000000Z-deadbeef", "error": "manifest cannot be read: Expecting value"}
NEWER = {"id": "20261101T000000Z-0000beef",
         "error": "x: manifest schema 2 is newer than this warmstart understands (1); upgrade the collection"}


def test_broken_snapshots_are_reported_not_removed() -> None:
    plan = run([BROKEN, snap(1)], keep_last=1, max_age="1s")
    assert plan.broken == [{"id": BROKEN["id"], "error": BROKEN["error"], "remove": False,
                            "reason": "unreadable snapshot; kept (set remove_broken to remove it)"}]
    assert BROKEN["id"] not in ids(plan.remove) + plan.kept
    assert plan.empty


def test_remove_broken_marks_them() -> None:
    plan = run([BROKEN, NEWER], remove_broken=True)
    by_id = {b["id"]: b for b in plan.broken}
    assert by_id[BROKEN["id"]]["remove"] is True
    assert by_id[BROKEN["id"]]["reason"] == "unreadable snapshot (remove_broken)"
    assert not plan.empty


def test_newer_schema_is_never_removed() -> None:
    plan = run([NEWER, dict(BROKEN, newer_schema=True)], remove_broken=True)
    assert [b["remove"] for b in plan.broken] == [False, False]
    assert plan.broken[0]["reason"] == "written by a newer warmstart; never removed here"
    assert plan.empty


def test_broken_with_filters_still_reported() -> None:
    plan = run([BROKEN], name="embed", remove_broken=True)
    assert plan.broken[0]["remove"] is True


# --- staging and restore dirs -------------------------------------------------------

def staging(name: str, age: float, newest_age: Optional[float] = None, size: int = 10) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"path": f"/store/tmp/{name}", "mtime": NOW - age, "size": size}
    if newest_age is not None:
        entry["newest_mtime"] = NOW - newest_age
    return entry


def test_staging_older_than_default_hour_goes() -> None:
    fresh, old = staging("a" * 32, 10 * 60), staging("b" * 32, 2 * HOUR, size=99)
    plan = run([], [fresh, old])
    assert plan.kept_staging == [fresh["path"]]
    assert plan.remove_staging == [{
        "path": old["path"], "age": 7200.0, "size": 99,
        "reason": "incomplete snapshot, unchanged for 2h (incomplete_older_than=1h)"}]
    assert not plan.empty


def test_staging_with_recent_writes_inside_is_kept() -> None:
    running = staging("c" * 32, 5 * HOUR, newest_age=30)
    plan = run([], [running])
    assert plan.remove_staging == [] and plan.kept_staging == [running["path"]]


def test_staging_threshold_option() -> None:
    entry = staging("d" * 32, 20 * 60)
    assert run([], [entry], incomplete_older_than="15m").remove_staging[0]["path"] == entry["path"]
    assert run([], [entry], incomplete_older_than="30m").remove_staging == []
    assert len(run([], [staging("e" * 32, 1)], incomplete_older_than=0).remove_staging) == 1


def test_interrupted_delete_leftovers_go_at_any_age() -> None:
    entry = staging("deleting-20261101T000000Z-deadbeef-1a2b3c4d", 1)
    plan = run([], [entry])
    assert plan.remove_staging[0]["reason"] == "left over from an interrupted delete"


def test_restore_dirs_by_age_and_name_pattern() -> None:
    old = {"path": "/r/20261101T000000Z-deadbeef-1a2b3c4d", "mtime": NOW - DAY, "size": 5}
    fresh = {"path": "/r/20261101T000000Z-deadbeef-2a2b3c4d", "mtime": NOW - DAY, "newest_mtime": NOW - 5}
    foreign = {"path": "/r/important-data", "mtime": NOW - 100 * DAY}
    plan = run([], restore_dirs=[old, fresh, foreign])
    assert [e["path"] for e in plan.remove_restore_dirs] == [old["path"]]
    assert plan.remove_restore_dirs[0]["reason"] == "restore work dir unchanged for 1d (incomplete_older_than=1h)"


def test_plan_as_dict_and_default_clock() -> None:
    real_now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    recent, ancient = snap(1, age=NOW - real_now + 60), snap(2, age=NOW - real_now + 2 * DAY)
    plan = ret.plan([recent, ancient], [], ret.policy(max_age="1d"))
    assert plan.as_dict()["kept"] == [recent["id"]]
    assert ids(plan.as_dict()["remove"]) == [ancient["id"]]
    assert set(plan.as_dict()) == {"remove", "kept", "broken", "remove_staging", "kept_staging",
                                   "remove_restore_dirs"}


def test_kubernetes_timestamps_order_by_time_not_by_name() -> None:
    """PodSnapshot createdAt has no fraction ("...:28Z"); it used to parse as 0 and ties went by name."""
    docs = [{"id": "embed-r-1-20261203t162427z-5bf50d6b", "name": "embed-r-1", "labels": {"model": "m"},
             "created_at": "2026-12-03T16:24:28Z"},
            {"id": "embed-0-20261203t162433z-157666d5", "name": "embed-0", "labels": {"model": "m"},
             "created_at": "2026-12-03T16:24:33Z"}]
    assert ret.created_ts(docs[1]) - ret.created_ts(docs[0]) == 5
    decision = ret.plan(docs, [], ret.policy(keep_last=1, group_by=["model"]), now=ret.created_ts(docs[1]) + 60)
    assert [e["id"] for e in decision.remove] == ["embed-r-1-20261203t162427z-5bf50d6b"]


# --- last_access_timeout (GKE's retentionConfig.lastAccessTimeout) ---------------------------------

def accessed(doc: Dict[str, Any], ago: Optional[float]) -> Dict[str, Any]:
    """``doc`` last restored from ``ago`` seconds before NOW (None: never), as a PodSnapshot summary says it."""
    if ago is not None:
        stamp = datetime.datetime.fromtimestamp(NOW - ago, datetime.timezone.utc)
        doc["last_access_at"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    return doc


def test_last_access_timeout_counts_from_the_last_access_else_from_creation() -> None:
    docs = [accessed(snap(1, age=10 * DAY), 1 * HOUR),      # old, restored from lately: kept
            accessed(snap(2, age=10 * DAY), 4 * DAY),       # restored from, but not for 4 days: goes
            accessed(snap(3, age=4 * DAY), None),           # never restored from, created 4 days ago: goes
            accessed(snap(4, age=1 * DAY), None)]           # never restored from, created yesterday: kept
    out = ret.plan(docs, [], ret.policy(last_access_timeout="72h"), now=NOW)
    reasons = {d["id"]: d["reason"] for d in out.remove}
    assert set(reasons) == {docs[1]["id"], docs[2]["id"]}
    assert reasons[docs[1]["id"]] == "not restored from for 4d (last_access_timeout=3d)"
    assert reasons[docs[2]["id"]] == "never restored from, created 4d ago (last_access_timeout=3d)"
    assert set(out.kept) == {docs[0]["id"], docs[3]["id"]}


def test_last_access_timeout_combines_with_keep_last() -> None:
    docs = [accessed(snap(1, age=1 * HOUR), None), accessed(snap(2, age=2 * HOUR), 10 * DAY),
            accessed(snap(3, age=3 * HOUR), 1 * HOUR)]
    out = ret.plan(docs, [], ret.policy(keep_last=2, last_access_timeout=DAY), now=NOW)
    reasons = {d["id"]: d["reason"] for d in out.remove}
    assert reasons == {docs[1]["id"]: "not restored from for 10d (last_access_timeout=1d)",
                       docs[2]["id"]: "keep_last=2 for name=embed (it is the 3rd newest)"}


def test_last_access_timeout_options() -> None:
    assert ret.policy(last_access_timeout="1d12h").last_access_timeout == 1.5 * DAY
    assert ret.policy().last_access_timeout is None and ret.policy(last_access_timeout="").last_access_timeout is None
    with pytest.raises(ret.RetentionError, match="last_access_timeout: 0 would remove every snapshot"):
        ret.policy(last_access_timeout=0)
    with pytest.raises(ret.RetentionError, match="last_access_timeout: unknown unit"):
        ret.policy(last_access_timeout="3 fortnights")
    assert ret.accessed_ts({"last_access_at": "garbage", "created_at": "2026-12-02T12:00:00Z"}) == (NOW, False)
