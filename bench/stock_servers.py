#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: stock inference servers, cold start vs restore through their application profiles.

Run as root with the Python that has pycriu (the modules' interpreter), from the checkout root, with the venvs
the tests build (tests/integration/stock_lab.py, under /var/cache/warmstart-tests):

    /usr/bin/python3 -m bench.stock_servers --server-python /var/cache/warmstart-tests/llama-<hash>/bin/python \\
        --mlserver-python /var/cache/warmstart-tests/mlserver-<hash>/bin/python [--markdown docs/benchmarks.md]

Servers (either or both):

llama    llama.cpp's OpenAI-compatible server as llama-cpp-python[server] ships it; a llama-type GGUF written
         with fixed-seed random weights (``--layers`` x ``--embd``; no model hub), loaded without mmap (the
         weights read into the process, as a GPU server copies them to its device); asked for a greedy
         completion.
mlserver Seldon's MLServer with its scikit-learn runtime, serving a ``--trees``-tree random forest trained with
         a fixed seed; asked for class probabilities of fixed rows (V2 protocol).

Per server and repetition, side by side, once with the page cache warm and once with it dropped before each
start: cold (engine ``_workload.start`` with the profile, to the first answer), eager (engine checkpoint,
leave_running False, then ``_restore.restore`` with verify on, to the first answer; the restore itself waits
for the profile's serving probe) and lazy (the same snapshot restored lazily). Every copy must give the cold
server's answer. Results go to <dir>/results.json; ``--markdown`` replaces the section between
``<!-- stock:begin -->`` and ``<!-- stock:end -->``. Standard library and the engine only.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from . import run as R

BEGIN, END = "<!-- stock:begin -->", "<!-- stock:end -->"
PROMPT = {"prompt": "the cat sat on", "max_tokens": 16, "temperature": 0, "seed": 7}
MODEL = r'''
import sys
import numpy as np
import gguf
path, n_layer, n_embd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(1234)
n_ff, n_head = n_embd * 3, max(1, n_embd // 64)
words = ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + words
w = gguf.GGUFWriter(path, "llama")
w.add_context_length(512); w.add_embedding_length(n_embd); w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff); w.add_head_count(n_head); w.add_head_count_kv(n_head)
w.add_rope_dimension_count(n_embd // n_head); w.add_layer_norm_rms_eps(1e-5); w.add_file_type(0)
w.add_tokenizer_model("llama"); w.add_token_list(tokens)
w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(words))])
w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(words))
w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
def t(*shape):
    return (rng.standard_normal(shape, dtype=np.float32) * 0.05)
w.add_tensor("token_embd.weight", t(len(tokens), n_embd))
for i in range(n_layer):
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
    for part in ("q", "k", "v", "output"):
        w.add_tensor(f"blk.{i}.attn_{part}.weight", t(n_embd, n_embd))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", t(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_up.weight", t(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_down.weight", t(n_embd, n_ff))
w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
w.add_tensor("output.weight", t(len(tokens), n_embd))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
'''


FOREST = r'''
import json, os, sys
import joblib
import numpy as np
from sklearn.ensemble import RandomForestClassifier
root, trees, http_port, grpc_port, metrics_port = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
os.makedirs(os.path.join(root, "forest"), exist_ok=True)
path = os.path.join(root, "forest", "model.joblib")
if not os.path.exists(path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20000, 16))
    y = ((x[:, 0] * x[:, 1] + np.sin(x[:, 2]) - x[:, 3]) > 0).astype(int)
    joblib.dump(RandomForestClassifier(n_estimators=trees, random_state=5, n_jobs=-1).fit(x, y), path)
with open(os.path.join(root, "forest", "model-settings.json"), "w") as out:
    json.dump({"name": "forest", "implementation": "mlserver_sklearn.SKLearnModel",
               "parameters": {"uri": "./model.joblib", "version": "v1"}}, out)
with open(os.path.join(root, "settings.json"), "w") as out:
    json.dump({"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port,
               "parallel_workers": 0}, out)
'''
ROWS = [[0.25 * ((i * 7 + j * 3) % 11) - 1.25 for j in range(16)] for i in range(32)]


def post_json(url: str, body: Dict[str, Any], timeout: float) -> Optional[Dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            return dict(json.loads(answer.read()))
    except OSError:
        return None


def probabilities(port: int, timeout: float) -> Optional[str]:
    """MLServer's class probabilities for fixed rows (V2 protocol), or None when nothing answers yet."""
    answer = post_json(f"http://127.0.0.1:{port}/v2/models/forest/infer", {
        "inputs": [{"name": "x", "shape": [len(ROWS), 16], "datatype": "FP64", "data": [v for r in ROWS for v in r]}],
        "outputs": [{"name": "predict_proba"}]}, timeout)
    return json.dumps(answer["outputs"][0]["data"]) if answer else None


def completion(port: int, timeout: float) -> Optional[str]:
    """The completion of PROMPT, or None when nothing answers yet."""
    answer = post_json(f"http://127.0.0.1:{port}/v1/completions", PROMPT, timeout)
    return str(answer["choices"][0]["text"]) if answer else None


def first_answer(ask: Any, port: int, since: float, timeout: float = 600.0) -> Dict[str, Any]:
    """Seconds from ``since`` (perf_counter) to the first answer of ``ask``, and the answer."""
    deadline = time.perf_counter() + timeout
    while True:
        text = ask(port, 30.0)
        if text is not None:
            return {"seconds": time.perf_counter() - since, "text": text}
        if time.perf_counter() > deadline:
            raise R.BenchError(f"no answer from port {port} within {timeout} s")
        time.sleep(0.05)


def servers(args: argparse.Namespace) -> List[SimpleNamespace]:
    """The servers this run measures: what starts each (a port in), what asks it, its profile and version."""
    out = []
    if args.server_python:
        model = os.path.join(args.dir, f"model-{args.layers}x{args.embd}.gguf")
        if not os.path.exists(model):
            script = os.path.join(args.dir, "model.py")
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(MODEL)
            subprocess.run([args.server_python, script, model + ".tmp", str(args.layers), str(args.embd)], check=True)
            os.rename(model + ".tmp", model)
        out.append(SimpleNamespace(
            key="llama", profile="llama-cpp-python", ask=completion, answer="completion",
            version="llama-cpp-python " + _version(args.server_python, "llama_cpp"),
            what=f"a {args.layers}-layer, {args.embd}-wide llama-type model ({os.path.getsize(model) / 2**20:.0f} MiB, "
                 "fixed-seed weights, loaded without mmap)",
            command=lambda port: [args.server_python, "-m", "llama_cpp.server", "--model", model, "--host",
                                  "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--use_mmap", "false",
                                  "--n_threads", str(os.cpu_count() or 2)]))
    if args.mlserver_python:
        repo = os.path.join(args.dir, "mlserver-models")
        script = os.path.join(args.dir, "forest.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(FOREST)

        def command(port: int) -> List[str]:  # the model once; settings.json with this run's ports each time
            subprocess.run([args.mlserver_python, script, repo, str(args.trees), str(port), str(R.free_port()),
                            str(R.free_port())], check=True)
            script_path = os.path.join(os.path.dirname(args.mlserver_python), "mlserver")
            return [args.mlserver_python, script_path, "start", repo]
        out.append(SimpleNamespace(
            key="mlserver", profile="mlserver", ask=probabilities, answer="class probabilities", command=command,
            version="MLServer " + _version(args.mlserver_python, "mlserver"),
            what=f"its scikit-learn runtime serving a {args.trees}-tree random forest (fixed seed)"))
    return out


def _version(python: str, module: str) -> str:
    return subprocess.run([python, "-c", f"import {module}; print({module}.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()


def drop_caches(cold_disk: bool) -> None:
    """Untimed: dirty pages written back; with ``cold_disk`` the page cache dropped too (model, venv, images)."""
    os.sync()
    if cold_disk:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
            handle.write("3\n")


def one_rep(E: SimpleNamespace, args: argparse.Namespace, server: SimpleNamespace, rep: int,
            cold_disk: bool) -> Dict[str, Any]:
    port = R.free_port()
    profile = E.pf.resolve({"name": server.profile, "vars": {"port": port}})
    roots = {k: os.path.join(args.dir, k) for k in ("workloads", "restore", "store")}
    shutil.rmtree(roots["store"], ignore_errors=True)
    store = E.st.FsStore(roots["store"])
    store.ensure()
    command = server.command(port)
    drop_caches(cold_disk)
    t0 = time.perf_counter()
    info = E.wl.start(roots["workloads"], server.key, command, profile=profile, chdir=args.dir)
    R.LIVE.add(info["pid"])
    cold = first_answer(server.ask, port, t0)
    out: Dict[str, Any] = {"server": server.key, "rep": rep, "cold_disk": cold_disk, "cold_s": cold["seconds"],
                           "rss_mib": R.rss_kib(info["pid"]) / 1024}
    target = E.snap.resolve_target(None, None, server.key, roots["workloads"])
    snap = E.ckpt.checkpoint(store, target, server.key, {}, E.CriuOptions(), leave_running=False,
                             criu_path=args.criu)
    R.LIVE.discard(info["pid"])
    out.update(snapshot_mib=snap["size"] / 2**20, checkpoint_s=snap["timings"]["total"])
    for variant in ("eager", "lazy"):
        drop_caches(cold_disk)
        t0 = time.perf_counter()
        rs = E.rs.restore(store, snapshot_id=snap["id"], criu_path=args.criu, restore_root=roots["restore"],
                          workloads_root=roots["workloads"], lazy=variant == "lazy")
        answered = first_answer(server.ask, port, t0)
        if answered["text"] != cold["text"]:
            raise R.BenchError(f"{variant} copy answered {answered['text']!r}, the cold server {cold['text']!r}")
        out[f"{variant}_s"] = answered["seconds"]
        out[f"{variant}_restore_s"] = rs["timings"]["total"]
        out[f"{variant}_lazy_used"] = bool((rs.get("lazy") or {}).get("used"))
        R.kill_tree(E, rs["pid"])
        shutil.rmtree(rs["work_dir"], ignore_errors=True)
    R.log(f"{server.key} rep {rep} ({'page cache dropped' if cold_disk else 'page cache warm'}): "
          f"cold {out['cold_s']:.2f} s, eager {out['eager_s']:.2f} s, lazy {out['lazy_s']:.2f} s, "
          f"snapshot {out['snapshot_mib']:.0f} MiB")
    return out


def measure(E: SimpleNamespace, args: argparse.Namespace, header: Dict[str, Any]) -> Dict[str, Any]:
    chosen = servers(args)
    reps = []
    try:
        for server in chosen:
            for rep in range(args.reps):
                for cold_disk in (False, True):
                    reps.append(one_rep(E, args, server, rep, cold_disk))
    finally:
        R.kill_all(E)
    return dict(header, servers={s.key: {"version": s.version, "what": s.what, "profile": s.profile,
                                         "answer": s.answer} for s in chosen}, reps=reps)


def med(results: Dict[str, Any], server: str, key: str, cold_disk: Optional[bool] = None) -> float:
    return float(statistics.median(r[key] for r in results["reps"] if r["server"] == server and
                                   (cold_disk is None or r["cold_disk"] == cold_disk)))


def versus(cold: float, other: float) -> str:
    return f"{cold / other:.2f}x faster" if other <= cold else f"{other / cold:.2f}x slower"


def rows(results: Dict[str, Any], server: str, cold_disk: bool) -> List[str]:
    cold, eager, lazy = (med(results, server, k, cold_disk) for k in ("cold_s", "eager_s", "lazy_s"))
    used = all(r["lazy_lazy_used"] for r in results["reps"] if r["server"] == server)
    where = "dropped" if cold_disk else "warm"
    return [
        f"| {where} | cold start (imports, model load, first answer) | {cold:.2f} s | - |",
        f"| {where} | warmstart restore, eager, verify on, released by the profile | {eager:.2f} s | "
        f"{versus(cold, eager)} |",
        f"| {where} | warmstart restore, lazy{'' if used else ' (not used here: eager)'} | {lazy:.2f} s | "
        f"{versus(cold, lazy)} |",
    ]


def server_section(results: Dict[str, Any], key: str) -> List[str]:
    s = results["servers"][key]
    return [
        f"### {s['version']}, profile `{s['profile']}`",
        "",
        f"{s['version']} with {s['what']}. Time to the first answered request; "
        f"every copy gave the cold server's {s['answer']}. Snapshot {med(results, key, 'snapshot_mib'):.0f} MiB, "
        f"checkpoint {med(results, key, 'checkpoint_s'):.2f} s.",
        "",
        "| page cache | start | to first answer | vs cold |",
        "|---|---|---|---|",
        *rows(results, key, False),
        *rows(results, key, True),
        "",
    ]


def markdown(results: Dict[str, Any]) -> str:
    m = results["machine"]
    reps = len({r["rep"] for r in results["reps"]})
    body = [line for key in results["servers"] for line in server_section(results, key)]
    return "\n".join([
        BEGIN,
        "## Stock servers: cold start vs restore (`python3 -m bench.stock_servers`)",
        "",
        f"Servers as their packages ship them, started by the engine as workloads with their application profile; "
        f"{reps} repetitions (medians) with the page cache warm and {reps} with it dropped before each start, "
        f"{m.get('cpu_model', 'this machine')}, {m.get('cpus', '?')} CPUs, {results['started_at']}.",
        "",
        *body,
        "Read with care: llama.cpp's cold start is short (a GGUF file read with a few large reads, no warm-up "
        "compilation), so a restore - which reads back as many bytes as the process holds - gains most where the "
        "cold start does more than read its weights (imports, model registries, CUDA graphs, torch.compile, as "
        "MLServer here, or vLLM and SGLang on a GPU). The lazy restore answers first only where a request touches "
        "a small part of the memory; a completion reads every weight.",
        "",
        f"Command: `{results['command']}`",
        END,
    ])


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m bench.stock_servers", description=__doc__.splitlines()[0])
    ap.add_argument("--server-python", help="python of a venv with llama-cpp-python[server] and gguf")
    ap.add_argument("--mlserver-python", help="python of a venv with mlserver and mlserver-sklearn")
    ap.add_argument("--trees", type=int, default=300, help="trees of MLServer's random forest")
    ap.add_argument("--dir", default="/var/tmp/warmstart-bench-stock")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--criu", default=None)
    ap.add_argument("--markdown", help="replace the stock section of this markdown file")
    ap.add_argument("--from-json", help="render a previous results.json")
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    given = [p for p in (args.server_python, args.mlserver_python) if p]
    if not args.from_json and (not given or not all(os.access(p, os.X_OK) for p in given)):
        sys.stderr.write("--server-python (llama-cpp-python[server] and gguf) and/or --mlserver-python (mlserver, "
                         "mlserver-sklearn): the python of the venv that has it\n")
        return 2

    def run() -> Dict[str, Any]:
        E, header = R.prepare_run(args, "bench.stock_servers", argv)
        E.pf = importlib.import_module("ansible_collections.warmstart.snapshot.plugins.module_utils.node._profile")
        results = measure(E, args, header)
        R.save_results(args, results)
        return results
    return R.bench_main(args, "bench.stock_servers", run, markdown, markdown, BEGIN, END)


if __name__ == "__main__":
    sys.exit(main())
