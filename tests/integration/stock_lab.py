"""Stock servers for the integration tests: installed unmodified from the package index into cached venvs.

``cached_venv`` builds a venv once per package set (keyed by its hash) under /var/cache/warmstart-tests and
renames it into place whole; later runs on this machine reuse it. ``tiny_llama`` writes a small llama-type
GGUF model (random weights from a fixed seed, an SPM vocabulary with byte fallback) with the ``gguf`` package,
so the LLM server needs nothing from a model hub.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

VENVS = Path("/var/cache/warmstart-tests")
# llama.cpp's server through llama-cpp-python (an OpenAI-compatible API on uvicorn), built from its sdist:
# about 4-5 minutes on 2 cores the first time, cached after. LLAVA (multimodal) is not built, nor OpenMP (the
# venv then runs in a container of the node image too, which has no libgomp).
LLAMA = ["llama-cpp-python[server]==0.3.16", "gguf==0.17.1", "numpy==2.4.6"]
LLAMA_BUILD_ENV = {"CMAKE_ARGS": "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_OPENMP=OFF"}

# Seldon's MLServer (the V2 inference protocol, FastAPI on uvicorn with uvloop, a gRPC server beside it) with
# its scikit-learn runtime: a small classifier the test trains with a fixed seed.
MLSERVER = ["mlserver==1.7.1", "mlserver-sklearn==1.7.1"]
MLSERVER_MODEL = r'''
import json, os, sys
import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression
root, http_port, grpc_port, metrics_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(os.path.join(root, "clf"), exist_ok=True)
rng = np.random.default_rng(3)
x = rng.standard_normal((400, 8))
y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).astype(int)
joblib.dump(LogisticRegression().fit(x, y), os.path.join(root, "clf", "model.joblib"))
with open(os.path.join(root, "clf", "model-settings.json"), "w") as out:
    json.dump({"name": "clf", "implementation": "mlserver_sklearn.SKLearnModel",
               "parameters": {"uri": "./model.joblib", "version": "v1"}}, out)
with open(os.path.join(root, "settings.json"), "w") as out:  # one process: MLServer 1.7's worker pool fails here
    json.dump({"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port,
               "parallel_workers": 0}, out)
'''

TINY_LLAMA = r'''
import sys
import numpy as np
import gguf

rng = np.random.default_rng(1234)
n_embd, n_ff, n_layer, n_head, ctx = 64, 128, 2, 4, 512
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["\u2581", "\u2581the", "\u2581cat", "\u2581dog", "\u2581sat", "\u2581on", "\u2581mat", "\u2581warm",
         "\u2581start", "\u2581hello", "\u2581world"] + ["\u2581" + c for c in letters] + list(letters)
tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + words
types = [2, 3, 3] + [6] * 256 + [1] * len(words)
scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_context_length(ctx); w.add_embedding_length(n_embd); w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff); w.add_head_count(n_head); w.add_head_count_kv(n_head)
w.add_rope_dimension_count(n_embd // n_head); w.add_layer_norm_rms_eps(1e-5); w.add_file_type(0)
w.add_tokenizer_model("llama"); w.add_token_list(tokens); w.add_token_scores(scores); w.add_token_types(types)
w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)

def weights(*shape):
    return (rng.standard_normal(shape) * 0.2).astype(np.float32)

w.add_tensor("token_embd.weight", weights(len(tokens), n_embd))
for i in range(n_layer):
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
    for part in ("q", "k", "v", "output"):
        w.add_tensor(f"blk.{i}.attn_{part}.weight", weights(n_embd, n_embd))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", weights(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_up.weight", weights(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_down.weight", weights(n_embd, n_ff))
w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
w.add_tensor("output.weight", weights(len(tokens), n_embd))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
'''


def cached_venv(label: str, packages: List[str], env: Optional[Dict[str, str]] = None) -> Path:
    """The python of a venv holding ``packages`` from the package index, built once per package set.

    Built aside and renamed into place, so its console scripts' ``#!`` lines name the build dir: run one as
    ``[python, venv/bin/<script>, ...]``."""
    key = hashlib.sha256(json.dumps([packages, env or {}]).encode()).hexdigest()[:12]
    venv = VENVS / f"{label}-{key}"
    python = venv / "bin" / "python"
    if python.exists():
        return python
    VENVS.mkdir(parents=True, exist_ok=True)
    building = VENVS / f".{label}-{key}.{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(building)], check=True, capture_output=True)
    # With build settings (env), never a wheel pip cached from another build: its cache key ignores them.
    fresh = ["--no-cache-dir"] if env else []
    done = subprocess.run([str(building / "bin" / "pip"), "install", "-q", *fresh, *packages], capture_output=True,
                          text=True, check=False, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        pytest.fail(f"cannot install the stock server ({' '.join(packages)}) from the package index: "
                    f"{done.stderr[-2000:]}")
    try:
        os.rename(building, venv)  # whole or not at all
    except OSError:  # another worker got there first
        shutil.rmtree(building, ignore_errors=True)
    return python


def tiny_llama(python: Path, path: Path) -> Path:
    """A tiny llama-type GGUF model at ``path``, written by the stock venv's ``gguf`` (fixed seed)."""
    script = path.with_suffix(".py")
    script.write_text(TINY_LLAMA)
    subprocess.run([str(python), str(script), str(path)], check=True, capture_output=True, timeout=120)
    return path


def mlserver_models(python: Path, root: Path, http_port: int, grpc_port: int, metrics_port: int) -> Path:
    """A model repository for MLServer at ``root``: one scikit-learn classifier (fixed seed) and its settings."""
    script = root.parent / "mlserver_model.py"
    script.write_text(MLSERVER_MODEL)
    subprocess.run([str(python), str(script), str(root), str(http_port), str(grpc_port), str(metrics_port)],
                   check=True, capture_output=True, timeout=300)
    return root


def infer(port: int) -> List[float]:
    """MLServer's class probabilities for fixed inputs (V2 protocol)."""
    rows = [[0.1 * (i + j) - 1.0 for j in range(8)] for i in range(16)]
    body = {"inputs": [{"name": "x", "shape": [16, 8], "datatype": "FP64", "data": [v for r in rows for v in r]}],
            "outputs": [{"name": "predict_proba"}]}
    answer = http_json(f"http://127.0.0.1:{port}/v2/models/clf/infer", body)
    return [float(v) for v in answer["outputs"][0]["data"]]


def http_json(url: str, body: Optional[Dict[str, Any]] = None, timeout: float = 60.0) -> Dict[str, Any]:
    """GET (or POST ``body`` as JSON) and the answer's JSON; retries connection refusals until ``timeout``."""
    deadline = time.monotonic() + timeout
    data = json.dumps(body).encode() if body is not None else None
    while True:
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return dict(json.loads(answer.read()))
        except urllib.error.HTTPError:
            raise
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def completion(port: int, prompt: str = "the cat sat on", tokens: int = 24) -> str:
    """The server's completion of ``prompt``, greedy (temperature 0, fixed seed): the same from the same weights."""
    return completion_at("127.0.0.1", port, prompt, tokens)


def completion_at(host: str, port: int = 8000, prompt: str = "the cat sat on", tokens: int = 24) -> str:
    """``completion`` from the server at ``host`` (a container's address)."""
    answer = http_json(f"http://{host}:{port}/v1/completions",
                       {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "seed": 7})
    return str(answer["choices"][0]["text"])
