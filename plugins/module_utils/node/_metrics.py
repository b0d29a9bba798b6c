# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Prometheus metrics of checkpoints and restores, kept across processes, exposed the node_exporter way.

Each checkpoint or restore is its own short process (one module run), so nothing can live in memory: every
record is applied to a small JSON state file and the Prometheus text file is rewritten from it, both in one
directory (default ``/var/lib/warmstart/metrics``):

- ``warmstart.prom`` - text exposition format 0.0.4, for node_exporter's textfile collector (point its
  ``--collector.textfile.directory`` here, or set the directory to node_exporter's own); mode 0644;
- ``.warmstart-metrics.json`` - the state (counters, histogram buckets, gauges); node_exporter ignores it;
- ``.warmstart-metrics.lock`` - the lock file, never replaced (a lock on a renamed file would lock nothing).

A long-running process (the EDA event source) can also serve the directory over HTTP: :func:`serve`.

Invariants:

- Every update (read state, add, write state, render, write ``.prom``) happens under one exclusive ``flock``
  of the lock file: concurrent processes never lose an increment.
- Both files are replaced by write-to-temp + fsync + rename in the same directory, so a reader (node_exporter,
  :func:`serve`) sees the old file or the new one, never a partial one. Temp names do not end in ``.prom``.
- Counters only grow. A state file that cannot be read (corrupt, another schema) is moved aside to
  ``<state>.bad`` and counting restarts from zero, which Prometheus treats as a counter reset (``rate`` and
  ``increase`` handle it).
- Durations are histograms, not summaries: a summary's quantiles are computed inside one process over a
  window, which means nothing for processes that observe once and exit, and quantiles cannot be added up
  across nodes; histogram buckets are plain counters that persist in the state, add up across nodes
  (``sum by (le)``) and give any quantile with ``histogram_quantile``.
- Bounded label cardinality: ``outcome`` and ``phase`` values come from this collection's own code and must
  match ``[a-z][a-z0-9_]{0,31}``; the snapshot age gauge is labelled by namespace and snapshot *name* (never
  the id, which is new for every capture), a series not updated for ``AGE_SERIES_TTL`` seconds is dropped and
  at most ``MAX_AGE_SERIES`` are kept (the least recently updated go first).
- No sample carries a timestamp (the textfile collector refuses them).
- ``record_restore`` and ``record_capture`` never raise for what they write: they return None, or the warning
  to show (metrics never fail a checkpoint or a restore). Bad arguments (a label value outside the rules) are
  warnings too.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError

DEFAULT_DIR = _paths.METRICS_DIR
DEFAULT_PORT = 9479
ENV_DIR = "WARMSTART_METRICS_DIR"
PROM_FILE = "warmstart.prom"
STATE_FILE = ".warmstart-metrics.json"
LOCK_FILE = ".warmstart-metrics.lock"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCHEMA = 1
# Seconds: from a fast preflight (milliseconds) to a large GPU snapshot's upload (tens of minutes).
BUCKETS: Tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                              300.0, 600.0, 1800.0)
AGE_SERIES_TTL = 7 * 86400.0
MAX_AGE_SERIES = 256
VALUE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
# name -> (type, help); the order here is the order in the .prom file.
METRICS: Dict[str, Tuple[str, str]] = {
    "warmstart_restores_total": (COUNTER, "Restores on this node by outcome."),
    "warmstart_restore_phase_seconds": (HISTOGRAM, "Seconds per phase of a restore (total = the whole restore)."),
    "warmstart_restore_bytes_total": (COUNTER, "Bytes of the snapshots restored on this node (their size)."),
    "warmstart_restore_ready_seconds": (HISTOGRAM, "Seconds from a placeholder pod running to its restore being "
                                                   "complete."),
    "warmstart_snapshot_age_seconds": (GAUGE, "Age of the snapshot at its latest restore on this node, by "
                                              "namespace and snapshot name."),
    "warmstart_last_restore_timestamp_seconds": (GAUGE, "Unix time of the latest restore on this node by "
                                                        "outcome."),
    "warmstart_captures_total": (COUNTER, "Captures (checkpoints) on this node by outcome."),
    "warmstart_capture_phase_seconds": (HISTOGRAM, "Seconds per phase of a capture (total = the whole capture)."),
    "warmstart_capture_bytes_total": (COUNTER, "Bytes of the snapshots captured on this node (their size)."),
    "warmstart_last_capture_timestamp_seconds": (GAUGE, "Unix time of the latest capture on this node by "
                                                        "outcome."),
}
# Series present from the first write on, so that rate() and absent() work before the first failure.
INITIAL = {"warmstart_restores_total": ("succeeded", "failed"), "warmstart_captures_total": ("succeeded", "failed")}


class MetricsError(WarmstartError, ValueError):
    """A value that cannot become a metric (a label value outside the rules); the message says which."""


# --- text format -------------------------------------------------------------------

def escape_label(value: str) -> str:
    """A label value as the text format writes it inside double quotes: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A HELP text: backslash and newline escaped (quotes stay)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def labels_key(labels: Mapping[str, str]) -> str:
    """The rendered label set, sorted by name (``a="x",b="y"``); empty values are left out (as Prometheus does)."""
    return ",".join(f'{k}="{escape_label(v)}"' for k, v in sorted(labels.items()) if v != "")


def format_value(value: float) -> str:
    """A sample value: integers without a fraction, ``+Inf`` / ``-Inf`` / ``NaN`` spelt as the format wants."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _sample(name: str, key: str, value: float, extra: str = "") -> str:
    labels = ",".join(p for p in (key, extra) if p)
    return f"{name}{{{labels}}} {format_value(value)}" if labels else f"{name} {format_value(value)}"


def render(state: Mapping[str, Any]) -> str:
    """The text exposition of ``state``: for each metric HELP, TYPE, then its samples sorted by labels."""
    lines: List[str] = []
    for name, (kind, help_text) in METRICS.items():
        lines += [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} {kind}"]
        series = state.get(name) or {}
        for key in sorted(series):
            if kind == HISTOGRAM:
                lines += _render_histogram(name, key, series[key])
            elif kind == GAUGE:
                lines.append(_sample(name, key, float(series[key]["value"])))
            else:
                lines.append(_sample(name, key, float(series[key])))
    return "\n".join(lines) + "\n"


def _render_histogram(name: str, key: str, hist: Mapping[str, Any]) -> List[str]:
    """Cumulative ``_bucket`` lines (``le`` ascending, ``+Inf`` = count), then ``_sum`` and ``_count``."""
    out = [_sample(f"{name}_bucket", key, float(n), f'le="{format_value(le)}"')
           for le, n in zip(BUCKETS, hist["buckets"])]
    out.append(_sample(f"{name}_bucket", key, float(hist["count"]), 'le="+Inf"'))
    out.append(_sample(f"{name}_sum", key, float(hist["sum"])))
    out.append(_sample(f"{name}_count", key, float(hist["count"])))
    return out


# --- the state ---------------------------------------------------------------------

@dataclass
class Update:
    """What one record adds: counter increments, histogram observations, gauge values (each with labels)."""

    counters: List[Tuple[str, Dict[str, str], float]] = field(default_factory=list)
    observations: List[Tuple[str, Dict[str, str], float]] = field(default_factory=list)
    gauges: List[Tuple[str, Dict[str, str], float]] = field(default_factory=list)


def apply(state: Dict[str, Any], update: Update, now: float) -> Dict[str, Any]:
    """``state`` with ``update`` added (in place; returned): counters add, histograms observe, gauges set.

    Also creates the INITIAL series at 0 and expires snapshot age series (see the module docstring).
    """
    for name, outcomes in INITIAL.items():
        for outcome in outcomes:
            state.setdefault(name, {}).setdefault(labels_key({"outcome": outcome}), 0)
    for name, labels, amount in update.counters:
        series = state.setdefault(name, {})
        key = labels_key(labels)
        series[key] = float(series.get(key, 0)) + max(float(amount), 0.0)
    for name, labels, value in update.observations:
        _observe(state.setdefault(name, {}), labels_key(labels), value)
    for name, labels, value in update.gauges:
        state.setdefault(name, {})[labels_key(labels)] = {"value": float(value), "updated": now}
    _expire(state.get("warmstart_snapshot_age_seconds") or {}, now)
    return state


def _observe(series: Dict[str, Any], key: str, value: float) -> None:
    """One observation into the histogram at ``key`` (buckets stored cumulative, as rendered)."""
    hist = series.get(key)
    if not isinstance(hist, dict) or len(hist.get("buckets") or []) != len(BUCKETS):
        hist = series[key] = {"buckets": [0] * len(BUCKETS), "sum": 0.0, "count": 0}
    for i, le in enumerate(BUCKETS):
        if value <= le:
            hist["buckets"][i] += 1
    hist["sum"] = float(hist["sum"]) + value
    hist["count"] = int(hist["count"]) + 1


def _expire(series: Dict[str, Any], now: float) -> None:
    """Drop gauge series older than AGE_SERIES_TTL, then the least recently updated beyond MAX_AGE_SERIES."""
    for key in [k for k, v in series.items() if now - float(v.get("updated", 0)) > AGE_SERIES_TTL]:
        del series[key]
    by_age = sorted(series, key=lambda k: float(series[k].get("updated", 0)))
    for key in by_age[:max(len(series) - MAX_AGE_SERIES, 0)]:
        del series[key]


def _load_state(path: str) -> Dict[str, Any]:
    """The state in ``path``; a missing file is empty, an unreadable one is moved to ``<path>.bad`` (see above)."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA and isinstance(doc.get("metrics"), dict):
        return {k: v for k, v in doc["metrics"].items() if k in METRICS and isinstance(v, dict)}
    os.replace(path, path + ".bad")
    return {}


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text``: a temp file in the same directory, fsync'd, chmod'ed, renamed over it."""
    safefs.write_file(os.path.abspath(path), text.encode("utf-8"), mode, sync=True)


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """An exclusive flock on the directory's lock file (created 0644 with the directory 0755 when missing)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd = safefs.open_file(os.path.join(os.path.abspath(directory), LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def update(directory: str, change: Update, now: Optional[float] = None) -> None:
    """Apply ``change`` to the directory's state and rewrite state and ``.prom`` file, under the lock.

    Raises OSError when the directory cannot be written; the ``record_*`` functions turn that into a warning.
    """
    now = time.time() if now is None else now
    with locked(directory):
        state_path = os.path.join(directory, STATE_FILE)
        try:
            state = apply(_load_state(state_path), change, now)
            text = render(state)
        except (TypeError, KeyError, AttributeError, ValueError):  # valid JSON, but not our shape
            os.replace(state_path, state_path + ".bad")
            state = apply({}, change, now)
            text = render(state)
        write_atomic(state_path, json.dumps({"schema": SCHEMA, "metrics": state}, sort_keys=True), 0o644)
        write_atomic(os.path.join(directory, PROM_FILE), text, 0o644)


# --- records -----------------------------------------------------------------------

def _check(what: str, value: str) -> str:
    if not VALUE_RE.match(value):
        raise MetricsError(f"metrics: {what} {value!r} is not a short lower-case word ([a-z][a-z0-9_]{{0,31}})")
    return value


def _phases(name: str, phases: Optional[Mapping[str, Any]]) -> List[Tuple[str, Dict[str, str], float]]:
    """One observation per phase whose value is a finite number of seconds >= 0 (others are skipped)."""
    out = []
    for phase, seconds in sorted((phases or {}).items()):
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
                and seconds >= 0:
            out.append((name, {"phase": _check("phase", str(phase))}, float(seconds)))
    return out


def restore_update(outcome: str, phases: Optional[Mapping[str, Any]] = None, bytes_: int = 0,
                   snapshot_age_s: Optional[float] = None, namespace: str = "", snapshot: str = "",
                   ready_seconds: Optional[float] = None, now: Optional[float] = None) -> Update:
    """What one restore adds (MetricsError for a bad ``outcome`` or phase name)."""
    out = _outcome_update("restore", outcome, phases, bytes_, now)
    if snapshot_age_s is not None and snapshot and snapshot_age_s >= 0:
        out.gauges.append(("warmstart_snapshot_age_seconds", {"namespace": namespace, "snapshot": snapshot},
                           snapshot_age_s))
    if ready_seconds is not None and ready_seconds >= 0:
        out.observations.append(("warmstart_restore_ready_seconds", {}, ready_seconds))
    return out


def capture_update(outcome: str, phases: Optional[Mapping[str, Any]] = None, bytes_: int = 0,
                   now: Optional[float] = None) -> Update:
    """What one capture adds (MetricsError for a bad ``outcome`` or phase name)."""
    return _outcome_update("capture", outcome, phases, bytes_, now)


def _outcome_update(what: str, outcome: str, phases: Optional[Mapping[str, Any]], bytes_: int,
                    now: Optional[float]) -> Update:
    """What every restore or capture adds: its count and time by outcome, its phases, its bytes."""
    now = time.time() if now is None else now
    out = Update()
    label = {"outcome": _check("outcome", outcome)}
    out.counters.append((f"warmstart_{what}s_total", label, 1))
    out.gauges.append((f"warmstart_last_{what}_timestamp_seconds", label, now))
    out.observations += _phases(f"warmstart_{what}_phase_seconds", phases)
    if bytes_ > 0:
        out.counters.append((f"warmstart_{what}_bytes_total", {}, bytes_))
    return out


def _guarded(directory: Optional[str], build: Callable[[], Update], now: Optional[float]) -> Optional[str]:
    """Build and write an update; None when written (or ``directory`` is empty: metrics off), else the warning."""
    if not directory:
        return None
    try:
        update(directory, build(), now)
    except (OSError, ValueError, TypeError) as exc:  # MetricsError is a ValueError; TypeError: a bad argument
        where = getattr(exc, "filename", None) or directory
        return f"metrics not recorded in {where}: {getattr(exc, 'strerror', None) or exc}"
    return None


def record_restore(directory: Optional[str], outcome: str, phases: Optional[Mapping[str, Any]] = None,
                   bytes_: int = 0, snapshot_age_s: Optional[float] = None, namespace: str = "",
                   snapshot: str = "", ready_seconds: Optional[float] = None,
                   now: Optional[float] = None) -> Optional[str]:
    """Count one restore in ``directory`` (None or empty: metrics off). Returns None, or a warning; never raises.

    ``outcome``: succeeded, failed, incompatible, partially_succeeded, ... (a short word); ``phases``: seconds
    by phase (a result's ``timings``); ``bytes_``: the snapshot's size; ``snapshot_age_s``: its age now, set as
    the gauge of (``namespace``, ``snapshot`` name); ``ready_seconds``: placeholder running -> restore complete.
    """
    return _guarded(directory, lambda: restore_update(outcome, phases, bytes_, snapshot_age_s, namespace, snapshot,
                                                      ready_seconds, now), now)


def record_capture(directory: Optional[str], outcome: str, phases: Optional[Mapping[str, Any]] = None,
                   bytes_: int = 0, now: Optional[float] = None) -> Optional[str]:
    """Count one capture in ``directory`` (None or empty: metrics off). Returns None, or a warning; never raises."""
    return _guarded(directory, lambda: capture_update(outcome, phases, bytes_, now), now)


def resolve_dir(option: Optional[str], environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The metrics directory of a module run: the option, else E(WARMSTART_METRICS_DIR), else None (off)."""
    env = os.environ if environ is None else environ
    return option or env.get(ENV_DIR) or None


# --- serving a directory -----------------------------------------------------------

def _family(name: str, current: Optional[str], kind: Optional[str]) -> str:
    """The family a sample line belongs to: the current TYPE'd family when its name fits, else its own name."""
    if current is not None and (name == current or (kind == HISTOGRAM and name in (
            f"{current}_bucket", f"{current}_sum", f"{current}_count")) or (kind == "summary" and name in (
            f"{current}_sum", f"{current}_count"))):
        return current
    return name


def merge(texts: Sequence[str]) -> str:
    """Several exposition texts as one: each family's HELP and TYPE once, all its samples together.

    Concatenating files would repeat a family that two files both carry, which the format forbids. Comments
    other than HELP and TYPE are dropped; a family's first HELP and first TYPE win; families keep the order in
    which they first appear.
    """
    heads: Dict[str, Dict[str, str]] = {}
    kinds: Dict[str, str] = {}
    samples: Dict[str, List[str]] = {}
    for text in texts:
        current: Optional[str] = None
        for line in text.splitlines():
            parts = line.split(None, 3)
            if not parts:
                continue
            if line.startswith("#"):
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    heads.setdefault(current, {}).setdefault(parts[1], line)
                    samples.setdefault(current, [])
                    if parts[1] == "TYPE" and len(parts) > 3:
                        kinds.setdefault(current, parts[3].strip())
                continue
            current = _family(re.split(r"[{\s]", line, maxsplit=1)[0], current, kinds.get(current or ""))
            samples.setdefault(current, []).append(line)
    lines = []
    for fam in samples:
        lines += [heads[fam][w] for w in ("HELP", "TYPE") if w in heads.get(fam, {})] + samples[fam]
    return "\n".join(lines) + "\n" if lines else ""


def collect(directory: str) -> str:
    """The directory's ``*.prom`` files (sorted by name), merged; an unreadable file is skipped."""
    texts = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".prom") and not n.startswith("."))
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                texts.append(handle.read())
        except (OSError, UnicodeDecodeError):
            continue
    return merge(texts)


class MetricsServer(ThreadingHTTPServer):
    """Serves ``collect(directory)`` at ``/metrics`` from a daemon thread; ``close()`` stops it."""

    daemon_threads = True
    directory = DEFAULT_DIR
    thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """``http://host:port/metrics`` of the bound socket (the port chosen when 0 was asked)."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        """``/metrics``: the merged files; ``/``: a pointer to it; anything else: 404."""
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, collect(self.server.directory), CONTENT_TYPE)
        elif path == "/":
            self._send(200, "warmstart metrics: /metrics\n", "text/plain; charset=utf-8")
        else:
            self._send(404, "not found: try /metrics\n", "text/plain; charset=utf-8")

    def _send(self, code: int, text: str, ctype: str) -> None:
        body = text.encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        """No access log: a scrape every few seconds would flood the agent's output."""


def serve(directory: str, host: str = "0.0.0.0", port: int = DEFAULT_PORT) -> MetricsServer:
    """Serve the directory's ``*.prom`` files at ``http://host:port/metrics`` from a daemon thread.

    Returns the started server (``server.url``, ``server.server_address``; port 0 picks a free one);
    ``server.close()`` stops it. The directory need not exist yet (an empty page until it does).
    """
    server = MetricsServer((host, port), _Handler)
    server.directory = directory
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                     name="warmstart-metrics", daemon=True)
    server.thread.start()
    return server
