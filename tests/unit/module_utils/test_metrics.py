"""_metrics: the text exposition format, state across processes under flock, atomic rewrites, the HTTP server."""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import stat
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _metrics as mt

# --- an independent reader of the text format 0.0.4 -------------------------------------------------------
# Written from the format's rules, not from _metrics: metric and label name syntax, label value escapes,
# HELP/TYPE at most once per family and before its samples, each family's lines together, histogram
# series with cumulative buckets ending in le="+Inf" equal to _count, no timestamps (textfile collector).

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
SAMPLE_RE = re.compile(rf"^({NAME})(?:\{{(.*)\}})? (\S+)$")
LABEL_RE = re.compile(rf'\s*({LABEL})="((?:[^"\\]|\\.)*)"\s*(,|$)')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")

Sample = Tuple[str, Dict[str, str], float]


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\":
            nxt = value[i + 1]
            assert nxt in '\\"n', f"bad escape \\{nxt} in {value!r}"
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _labels(text: str) -> Dict[str, str]:
    labels: Dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = LABEL_RE.match(text, pos)
        assert m, f"bad label set {text!r} at {pos}"
        assert m.group(1) not in labels, f"label {m.group(1)} twice"
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def _value(text: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    assert re.match(r"^[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?)$", text), f"bad value {text!r}"
    return float(text)


def parse(text: str) -> Dict[str, Dict[str, object]]:
    """{family: {"type", "help", "samples": [(name, labels, value)]}}; asserts every rule on the way."""
    assert text.endswith("\n"), "the exposition ends with a line feed"
    families: Dict[str, Dict[str, object]] = {}
    done: List[str] = []
    current = None
    for line in text[:-1].split("\n"):
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert re.fullmatch(NAME, name), name
                fam = families.setdefault(name, {"type": "untyped", "help": None, "samples": []})
                assert not fam["samples"], f"{parts[1]} of {name} after its samples"
                assert name not in done or name == current, f"family {name} is split"
                key = "help" if parts[1] == "HELP" else "type"
                assert f"_{key}_seen" not in fam, f"two {parts[1]} lines for {name}"
                fam[f"_{key}_seen"] = True
                if key == "type":
                    assert parts[3] in TYPES, parts[3]
                fam[key] = parts[3] if len(parts) > 3 else ""
                if current != name:
                    if current:
                        done.append(current)
                    current = name
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), _labels(m.group(2) or ""), _value(m.group(3))
        members = (current, f"{current}_bucket", f"{current}_sum", f"{current}_count")
        fam_name = current if current and name in members else name
        if fam_name != current:
            assert fam_name not in done and fam_name not in families, f"family {fam_name} is split"
            if current:
                done.append(current)
            current = fam_name
            families[fam_name] = {"type": "untyped", "help": None, "samples": []}
        samples = families[fam_name]["samples"]
        assert isinstance(samples, list)
        samples.append((name, labels, value))
    for name, fam in families.items():
        if fam["type"] == "histogram":
            _check_histogram(name, fam["samples"])  # type: ignore[arg-type]
        if fam["type"] == "counter":
            assert all(v >= 0 for _n, _l, v in fam["samples"]), name  # type: ignore[attr-defined]
    return families


def _check_histogram(name: str, samples: List[Sample]) -> None:
    series: Dict[str, Dict[str, object]] = {}
    for sname, labels, value in samples:
        key = json.dumps({k: v for k, v in labels.items() if k != "le"}, sort_keys=True)
        entry = series.setdefault(key, {"buckets": []})
        if sname == f"{name}_bucket":
            entry["buckets"].append((_value(labels["le"]), value))  # type: ignore[attr-defined]
        else:
            entry[sname[len(name) + 1:]] = value
    for key, entry in series.items():
        buckets = entry["buckets"]
        assert buckets, f"{name}{key}: no buckets"
        les = [le for le, _v in buckets]  # type: ignore[attr-defined]
        counts = [v for _le, v in buckets]  # type: ignore[attr-defined]
        assert les == sorted(les) and math.isinf(les[-1]), f"{name}{key}: le not ascending to +Inf: {les}"
        assert counts == sorted(counts), f"{name}{key}: buckets not cumulative: {counts}"
        assert counts[-1] == entry["count"], f"{name}{key}: +Inf bucket != _count"
        assert "sum" in entry, f"{name}{key}: no _sum"


def samples_of(text: str, family: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    fam = parse(text)[family]
    return {(n, tuple(sorted(lb.items()))): v for n, lb, v in fam["samples"]}  # type: ignore[attr-defined]


def prom(directory: Path) -> str:
    return (directory / mt.PROM_FILE).read_text()


# --- fixtures ---------------------------------------------------------------------------------------------

@pytest.fixture(name="mdir")
def fixture_mdir(tmp_path: Path) -> Path:
    """A metrics directory that does not exist yet (the first record creates it)."""
    return tmp_path / "metrics"


@pytest.fixture(name="server")
def fixture_server(mdir: Path) -> Iterator[mt.MetricsServer]:
    server = mt.serve(str(mdir), "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.close()


# --- format -----------------------------------------------------------------------------------------------

def test_a_restore_and_a_capture_give_a_valid_exposition(mdir: Path) -> None:
    assert mt.record_restore(str(mdir), "succeeded", {"preflight": 0.02, "restore": 0.4, "total": 0.5},
                             bytes_=4096, snapshot_age_s=120.0, namespace="ml", snapshot="embed",
                             ready_seconds=0.8, now=1000.0) is None
    assert mt.record_capture(str(mdir), "succeeded", {"dump": 0.3, "total": 0.6}, bytes_=8192, now=1001.0) is None
    text = prom(mdir)
    families = parse(text)
    assert set(families) == set(mt.METRICS)
    for name, (kind, _help) in mt.METRICS.items():
        assert families[name]["type"] == kind and families[name]["help"], name
    restores = samples_of(text, "warmstart_restores_total")
    assert restores[("warmstart_restores_total", (("outcome", "succeeded"),))] == 1
    assert restores[("warmstart_restores_total", (("outcome", "failed"),))] == 0  # present before any failure
    phases = samples_of(text, "warmstart_restore_phase_seconds")
    assert phases[("warmstart_restore_phase_seconds_count", (("phase", "restore"),))] == 1
    assert phases[("warmstart_restore_phase_seconds_sum", (("phase", "restore"),))] == pytest.approx(0.4)
    assert phases[("warmstart_restore_phase_seconds_bucket", (("le", "0.25"), ("phase", "restore")))] == 0
    assert phases[("warmstart_restore_phase_seconds_bucket", (("le", "0.5"), ("phase", "restore")))] == 1
    assert samples_of(text, "warmstart_restore_bytes_total")[("warmstart_restore_bytes_total", ())] == 4096
    assert samples_of(text, "warmstart_capture_bytes_total")[("warmstart_capture_bytes_total", ())] == 8192
    age = samples_of(text, "warmstart_snapshot_age_seconds")
    assert age == {("warmstart_snapshot_age_seconds", (("namespace", "ml"), ("snapshot", "embed"))): 120}
    ready = samples_of(text, "warmstart_restore_ready_seconds")
    assert ready[("warmstart_restore_ready_seconds_count", ())] == 1
    last = samples_of(text, "warmstart_last_capture_timestamp_seconds")
    assert last == {("warmstart_last_capture_timestamp_seconds", (("outcome", "succeeded"),)): 1001}
    assert not re.search(r"^\S+(\{.*\})? \S+ \S+$", text, re.M), "no sample carries a timestamp"


def test_counters_add_up_across_calls(mdir: Path) -> None:
    for outcome in ("succeeded", "succeeded", "failed", "incompatible"):
        assert mt.record_restore(str(mdir), outcome, {"total": 1.0}, bytes_=100) is None
    text = prom(mdir)
    restores = samples_of(text, "warmstart_restores_total")
    outcomes = ("succeeded", "failed", "incompatible")
    assert [restores[("warmstart_restores_total", (("outcome", o),))] for o in outcomes] == [2, 1, 1]
    assert samples_of(text, "warmstart_restore_bytes_total")[("warmstart_restore_bytes_total", ())] == 400
    assert samples_of(text, "warmstart_restore_phase_seconds")[
        ("warmstart_restore_phase_seconds_count", (("phase", "total"),))] == 4


def test_label_values_are_escaped_and_read_back(mdir: Path) -> None:
    tricky = 'we"ird\\name\nx'
    assert mt.record_restore(str(mdir), "succeeded", snapshot_age_s=5, namespace=tricky, snapshot="s") is None
    text = prom(mdir)
    assert 'namespace="we\\"ird\\\\name\\nx"' in text
    (key, value), = samples_of(text, "warmstart_snapshot_age_seconds").items()
    assert dict(key[1]) == {"namespace": tricky, "snapshot": "s"} and value == 5


def test_empty_label_values_are_left_out(mdir: Path) -> None:
    mt.record_restore(str(mdir), "succeeded", snapshot_age_s=5, namespace="", snapshot="embed")
    assert 'warmstart_snapshot_age_seconds{snapshot="embed"} 5' in prom(mdir)


def test_values_are_spelt_as_the_format_wants() -> None:
    assert [mt.format_value(v) for v in (3.0, 0.25, float("inf"), float("-inf"), float("nan"), 1e20)] == \
        ["3", "0.25", "+Inf", "-Inf", "NaN", "1e+20"]
    assert mt.escape_help("a\\b\nc \"d\"") == 'a\\\\b\\nc "d"'


def test_phases_that_are_not_durations_are_skipped(mdir: Path) -> None:
    mt.record_capture(str(mdir), "succeeded", {"dump": 0.1, "odd": "x", "neg": -1, "flag": True,
                                               "nan": float("nan")})
    phases = {dict(lb)["phase"] for (_n, lb) in samples_of(prom(mdir), "warmstart_capture_phase_seconds")}
    assert phases == {"dump"}


@pytest.mark.parametrize("outcome, phases", [
    ("Succeeded", None), ("a b", None), ("x" * 40, None), ("succeeded", {"Bad Phase": 1.0}), ("", None)])
def test_unbounded_label_values_are_refused_with_a_warning(mdir: Path, outcome: str, phases: object) -> None:
    warning = mt.record_restore(str(mdir), outcome, phases)  # type: ignore[arg-type]
    assert warning and "metrics not recorded" in warning and "short lower-case word" in warning
    assert not (mdir / mt.PROM_FILE).exists()


def test_arguments_of_the_wrong_type_are_a_warning_too(mdir: Path) -> None:
    warning = mt.record_restore(str(mdir), "succeeded", bytes_=None, snapshot_age_s="old",  # type: ignore[arg-type]
                                snapshot="s")
    assert warning and warning.startswith("metrics not recorded in ")


def test_no_directory_means_metrics_off(tmp_path: Path) -> None:
    assert mt.record_restore(None, "succeeded") is None
    assert mt.record_capture("", "succeeded") is None
    assert not list(tmp_path.iterdir())


def test_the_directory_option_then_the_environment() -> None:
    assert mt.resolve_dir("/a", {mt.ENV_DIR: "/b"}) == "/a"
    assert mt.resolve_dir(None, {mt.ENV_DIR: "/b"}) == "/b"
    assert mt.resolve_dir(None, {mt.ENV_DIR: ""}) is None
    assert mt.resolve_dir(None, {}) is None


def test_a_directory_that_cannot_be_written_is_a_warning_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    warning = mt.record_restore(str(blocker / "metrics"), "succeeded")
    assert warning and warning.startswith("metrics not recorded in ") and str(blocker) in warning


# --- state ------------------------------------------------------------------------------------------------

def test_a_corrupt_state_file_is_set_aside_and_counting_restarts(mdir: Path) -> None:
    mt.record_restore(str(mdir), "succeeded")
    (mdir / mt.STATE_FILE).write_text("{not json")
    assert mt.record_restore(str(mdir), "succeeded") is None
    assert (mdir / (mt.STATE_FILE + ".bad")).read_text() == "{not json"
    restores = samples_of(prom(mdir), "warmstart_restores_total")
    assert restores[("warmstart_restores_total", (("outcome", "succeeded"),))] == 1


def test_a_state_of_the_wrong_shape_is_set_aside_too(mdir: Path) -> None:
    mdir.mkdir()
    (mdir / mt.STATE_FILE).write_text(json.dumps({"schema": 1, "metrics": {
        "warmstart_restores_total": {'outcome="succeeded"': "many"},
        "warmstart_restore_phase_seconds": {'phase="total"': [1, 2]}}}))
    assert mt.record_restore(str(mdir), "succeeded", {"total": 1}) is None
    assert (mdir / (mt.STATE_FILE + ".bad")).exists()
    parse(prom(mdir))


def test_age_series_expire_and_are_capped(mdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mt, "MAX_AGE_SERIES", 3)
    for i in range(5):
        mt.record_restore(str(mdir), "succeeded", snapshot_age_s=1, namespace="ns", snapshot=f"s{i}", now=100.0 + i)
    ages = samples_of(prom(mdir), "warmstart_snapshot_age_seconds")
    assert sorted(dict(k[1])["snapshot"] for k in ages) == ["s2", "s3", "s4"]  # least recently updated went
    mt.record_restore(str(mdir), "succeeded", snapshot_age_s=1, namespace="ns", snapshot="s9",
                      now=104.0 + mt.AGE_SERIES_TTL + 1)
    ages = samples_of(prom(mdir), "warmstart_snapshot_age_seconds")
    assert [dict(k[1])["snapshot"] for k in ages] == ["s9"]


# --- files ------------------------------------------------------------------------------------------------

def test_files_are_world_readable_and_no_temp_file_is_left(mdir: Path) -> None:
    mt.record_capture(str(mdir), "failed")
    assert stat.S_IMODE((mdir / mt.PROM_FILE).stat().st_mode) == 0o644
    assert sorted(p.name for p in mdir.iterdir()) == sorted([mt.PROM_FILE, mt.STATE_FILE, mt.LOCK_FILE])


def test_a_failed_rewrite_leaves_the_old_file_whole(mdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mt.record_restore(str(mdir), "succeeded")
    before = prom(mdir)

    def broken_rename(src: str, dst: str, **_fds: Any) -> None:  # the rename safefs.write_file ends with
        raise OSError(28, "No space left on device", dst)

    monkeypatch.setattr(mt.safefs.os, "rename", broken_rename)
    warning = mt.record_restore(str(mdir), "failed")
    monkeypatch.undo()
    assert warning and "No space left on device" in warning
    assert prom(mdir) == before
    assert not [p for p in mdir.iterdir() if ".tmp" in p.name]


def test_readers_never_see_a_partial_file(mdir: Path) -> None:
    mt.record_restore(str(mdir), "succeeded")
    stop = threading.Event()
    seen: List[str] = []

    def reader() -> None:
        while not stop.is_set():
            seen.append(prom(mdir))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(60):
            mt.record_restore(str(mdir), "succeeded", {"total": i / 10}, snapshot_age_s=i, namespace="ns",
                              snapshot=f"s{i % 7}")
    finally:
        stop.set()
        thread.join()
    assert len(seen) > 10
    for text in seen:
        parse(text)


def _worker(args: Tuple[str, int, int]) -> int:
    directory, worker, count = args
    failures = 0
    for i in range(count):
        if worker % 2:
            failures += mt.record_restore(directory, "succeeded", {"total": 0.01 * i}, bytes_=10) is not None
        else:
            failures += mt.record_capture(directory, "succeeded", {"dump": 0.01 * i}, bytes_=1) is not None
    return failures


def test_concurrent_processes_lose_no_increment(mdir: Path) -> None:
    workers, count = 6, 25
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        failures = pool.map(_worker, [(str(mdir), w, count) for w in range(workers)])
    assert failures == [0] * workers
    text = prom(mdir)
    restores = samples_of(text, "warmstart_restores_total")
    captures = samples_of(text, "warmstart_captures_total")
    assert restores[("warmstart_restores_total", (("outcome", "succeeded"),))] == 3 * count
    assert captures[("warmstart_captures_total", (("outcome", "succeeded"),))] == 3 * count
    assert samples_of(text, "warmstart_restore_bytes_total")[("warmstart_restore_bytes_total", ())] == 30 * count
    assert samples_of(text, "warmstart_capture_phase_seconds")[
        ("warmstart_capture_phase_seconds_count", (("phase", "dump"),))] == 3 * count


# --- merge and serve --------------------------------------------------------------------------------------

def test_merge_keeps_each_family_together() -> None:
    a = "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\"} 1\n# TYPE h histogram\n" \
        "h_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n"
    b = "# some comment\n# HELP x_total X again.\n# TYPE x_total counter\nx_total{a=\"2\"} 5\nplain 3\n"
    merged = mt.merge([a, b])
    families = parse(merged)
    assert merged.count("# TYPE x_total counter") == 1 and "X again" not in merged
    assert [s[1]["a"] for s in families["x_total"]["samples"]] == ["1", "2"]  # type: ignore[attr-defined]
    assert families["h"]["type"] == "histogram" and families["plain"]["type"] == "untyped"
    assert mt.merge([]) == ""


def test_serve_answers_the_directory_over_http(mdir: Path, server: mt.MetricsServer) -> None:
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        assert resp.status == 200 and resp.read() == b""  # no directory yet: an empty page
    mt.record_restore(str(mdir), "succeeded", {"total": 0.3})
    (mdir / "other.prom").write_text('# TYPE warmstart_restores_total counter\n'
                                     'warmstart_restores_total{outcome="cold_start"} 2\nnode_other 1\n')
    (mdir / "ignored.txt").write_text("not_a_metric 1\n")
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        assert resp.headers["Content-Type"] == mt.CONTENT_TYPE
        text = resp.read().decode()
    restores = samples_of(text, "warmstart_restores_total")
    assert restores[("warmstart_restores_total", (("outcome", "cold_start"),))] == 2
    assert restores[("warmstart_restores_total", (("outcome", "succeeded"),))] == 1
    assert "node_other 1" in text and "not_a_metric" not in text
    host, port = server.server_address[:2]
    assert host == "127.0.0.1" and port != 0
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
    assert err.value.code == 404
    assert server.thread is not None and server.thread.daemon


def test_the_server_stops_on_close(mdir: Path) -> None:
    server = mt.serve(str(mdir), "127.0.0.1", 0)
    port = server.server_address[1]
    server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    assert not os.path.exists(mdir)
