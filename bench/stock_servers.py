#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""warmstart benchmark: a stock LLM server, cold start vs restore through its application profile.

Run as root with the Python that has pycriu (the modules' interpreter), from the checkout root:

    /usr/bin/python3 -m bench.stock_servers --server-python /var/cache/warmstart-tests/llama-<hash>/bin/python \\
        [--markdown docs/benchmarks.md]

The server is llama.cpp's OpenAI-compatible server as llama-cpp-python[server] ships it (the venv the tests
build: tests/integration/stock_lab.py). The model is a llama-type GGUF written with fixed-seed random weights
(``--layers`` x ``--embd``; no model hub), loaded without mmap (``--use_mmap false``: the weights are read
into the process, as a GPU server copies them to its device).

Per repetition, side by side, once with the page cache warm and once with it dropped before each start:

cold     engine ``_workload.start`` of the server, to the first answered completion (import, load, warm-up);
eager    engine checkpoint of that warm server (profile ``llama-cpp-python``, leave_running False), then
         ``_restore.restore`` (verify on) to the first answered completion; the restore itself waits for the
         profile's serving probe;
lazy     the same snapshot restored with ``lazy`` (the lazy-pages daemon streams the memory), to the first
         answered completion.

Every restored copy must give the cold server's greedy completion for a fixed prompt and seed. Results go to
<dir>/results.json; ``--markdown`` replaces the section between ``<!-- stock:begin -->`` and
``<!-- stock:end -->``. Standard library and the engine only.
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


def completion(port: int, timeout: float) -> Optional[str]:
    """The completion of PROMPT, or None when nothing answers yet."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(PROMPT).encode(),
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            return str(json.loads(answer.read())["choices"][0]["text"])
    except OSError:
        return None


def first_answer(port: int, since: float, timeout: float = 600.0) -> Dict[str, Any]:
    """Seconds from ``since`` (perf_counter) to the first answered completion, and the completion."""
    deadline = time.perf_counter() + timeout
    while True:
        text = completion(port, 30.0)
        if text is not None:
            return {"seconds": time.perf_counter() - since, "text": text}
        if time.perf_counter() > deadline:
            raise R.BenchError(f"no completion from port {port} within {timeout} s")
        time.sleep(0.05)


def write_model(args: argparse.Namespace) -> str:
    path = os.path.join(args.dir, f"model-{args.layers}x{args.embd}.gguf")
    if not os.path.exists(path):
        script = os.path.join(args.dir, "model.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(MODEL)
        subprocess.run([args.server_python, script, path + ".tmp", str(args.layers), str(args.embd)], check=True)
        os.rename(path + ".tmp", path)
    return path


def drop_caches(cold_disk: bool) -> None:
    """Untimed: dirty pages written back; with ``cold_disk`` the page cache dropped too (model, venv, images)."""
    os.sync()
    if cold_disk:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
            handle.write("3\n")


def one_rep(E: SimpleNamespace, args: argparse.Namespace, model: str, rep: int, cold_disk: bool) -> Dict[str, Any]:
    port = R.free_port()
    profile = E.pf.resolve({"name": "llama-cpp-python", "vars": {"port": port}})
    roots = {k: os.path.join(args.dir, k) for k in ("workloads", "restore", "store")}
    shutil.rmtree(roots["store"], ignore_errors=True)
    store = E.st.FsStore(roots["store"])
    store.ensure()
    command = [args.server_python, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1", "--port",
               str(port), "--n_ctx", "512", "--use_mmap", "false", "--n_threads", str(os.cpu_count() or 2)]
    drop_caches(cold_disk)
    t0 = time.perf_counter()
    info = E.wl.start(roots["workloads"], "llm", command, profile=profile)
    R.LIVE.add(info["pid"])
    cold = first_answer(port, t0)
    out: Dict[str, Any] = {"rep": rep, "cold_disk": cold_disk, "cold_s": cold["seconds"],
                           "rss_mib": R.rss_kib(info["pid"]) / 1024}
    target = E.snap.resolve_target(None, None, "llm", roots["workloads"])
    snap = E.ckpt.checkpoint(store, target, "llm", {}, E.CriuOptions(), leave_running=False, criu_path=args.criu)
    R.LIVE.discard(info["pid"])
    out.update(snapshot_mib=snap["size"] / 2**20, checkpoint_s=snap["timings"]["total"])
    for variant in ("eager", "lazy"):
        drop_caches(cold_disk)
        t0 = time.perf_counter()
        rs = E.rs.restore(store, snapshot_id=snap["id"], criu_path=args.criu, restore_root=roots["restore"],
                          workloads_root=roots["workloads"], lazy=variant == "lazy")
        answered = first_answer(port, t0)
        if answered["text"] != cold["text"]:
            raise R.BenchError(f"{variant} copy answered {answered['text']!r}, the cold server {cold['text']!r}")
        out[f"{variant}_s"] = answered["seconds"]
        out[f"{variant}_restore_s"] = rs["timings"]["total"]
        out[f"{variant}_lazy_used"] = bool((rs.get("lazy") or {}).get("used"))
        R.kill_tree(E, rs["pid"])
        shutil.rmtree(rs["work_dir"], ignore_errors=True)
    R.log(f"rep {rep} ({'page cache dropped' if cold_disk else 'page cache warm'}): cold {out['cold_s']:.2f} s, eager {out['eager_s']:.2f} s, lazy {out['lazy_s']:.2f} s, "
          f"snapshot {out['snapshot_mib']:.0f} MiB")
    return out


def measure(E: SimpleNamespace, args: argparse.Namespace, header: Dict[str, Any]) -> Dict[str, Any]:
    model = write_model(args)
    version = subprocess.run([args.server_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    reps = []
    try:
        for rep in range(args.reps):
            for cold_disk in (False, True):
                reps.append(one_rep(E, args, model, rep, cold_disk))
    finally:
        R.kill_all(E)
    return dict(header, server=f"llama-cpp-python {version}", model_mib=os.path.getsize(model) / 2**20,
                layers=args.layers, embd=args.embd, reps=reps)


def med(results: Dict[str, Any], key: str, cold_disk: Optional[bool] = None) -> float:
    return float(statistics.median(r[key] for r in results["reps"] if cold_disk is None or r["cold_disk"] == cold_disk))


def versus(cold: float, other: float) -> str:
    return f"{cold / other:.2f}x faster" if other <= cold else f"{other / cold:.2f}x slower"


def rows(results: Dict[str, Any], cold_disk: bool) -> List[str]:
    cold, eager, lazy = (med(results, k, cold_disk) for k in ("cold_s", "eager_s", "lazy_s"))
    used = all(r["lazy_lazy_used"] for r in results["reps"])
    where = "page cache dropped before each start" if cold_disk else "page cache warm"
    return [
        f"| {where} | cold start (import, load {results['model_mib']:.0f} MiB without mmap, first completion) | "
        f"{cold:.2f} s | - |",
        f"| {where} | warmstart restore, eager, verify on, released by the profile | {eager:.2f} s | "
        f"{versus(cold, eager)} |",
        f"| {where} | warmstart restore, lazy{'' if used else ' (not used here: eager)'} | {lazy:.2f} s | "
        f"{versus(cold, lazy)} |",
    ]


def markdown(results: Dict[str, Any]) -> str:
    m = results["machine"]
    return "\n".join([
        BEGIN,
        "## Stock servers: cold start vs restore (`python3 -m bench.stock_servers`)",
        "",
        f"{results['server']} as its package ships it, a {results['layers']}-layer, {results['embd']}-wide "
        f"llama-type model ({results['model_mib']:.0f} MiB, fixed-seed weights), profile `llama-cpp-python`; "
        f"{args_reps(results)} repetitions (medians), {m.get('cpu_model', 'this machine')}, "
        f"{m.get('cpus', '?')} CPUs, {results['started_at']}. Time to the first answered completion; every "
        "copy gave the cold server's greedy completion. Snapshot "
        f"{med(results, 'snapshot_mib'):.0f} MiB, checkpoint {med(results, 'checkpoint_s'):.2f} s.",
        "",
        "| disk | start | to first completion | vs cold |",
        "|---|---|---|---|",
        *rows(results, False),
        *rows(results, True),
        "",
        "Read with care: this server's cold start is short (llama.cpp loads a GGUF file with a few large reads "
        "and needs no warm-up compilation), so a restore - which reads back as many bytes as the process holds "
        "- gains most where the cold start does more than read its weights (CUDA graphs, torch.compile, "
        "tokenizer and cache builds, as vLLM and SGLang do). The lazy restore answers first only where a request "
        "touches a small part of the memory; a completion here reads every weight.",
        "",
        f"Command: `{results['command']}`",
        END,
    ])


def args_reps(results: Dict[str, Any]) -> int:
    return len({r["rep"] for r in results["reps"]})


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m bench.stock_servers", description=__doc__.splitlines()[0])
    ap.add_argument("--server-python", help="python of a venv with llama-cpp-python[server] and gguf")
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
    if not args.from_json and not (args.server_python and os.access(args.server_python, os.X_OK)):
        sys.stderr.write("--server-python: the python of a venv with llama-cpp-python[server] and gguf\n")
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
