#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU inference server of the end-to-end device run (tests/device/e2e.py), started as a warmstart workload.

It has the parts a real server's cold start has: imports (PyTorch, transformers), a decoder of a real
architecture (Llama, from its config, weights from a fixed seed - no download) built on the device in bf16,
a pre-allocated "KV cache" (device tensors from a fixed seed, like vLLM's), a warm-up that runs the model and
captures a CUDA graph of a fixed-shape forward pass (vLLM captures graphs too), then an HTTP endpoint.

    GET /generate  -> the logits of a fixed prompt (graph replay) as SHA256, 8 greedy tokens (eager forward),
                      integer checksums of the KV tensors, and the seconds taken: bit-equal before and after a
                      restore, or the restore lost something
    GET /stats     -> the cold start's phases and the device memory held

``--model-gib 0`` serves the KV tensors only (the memory-scaling runs). ``--device cpu`` (the dry run without
a GPU) builds the same model in float32 on the CPU, without graphs. It writes ``ready-for-snapshot`` into
$SNAPSHOT_CONTROL_DIR once warm.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Dict, List

T0 = time.time()
PHASES: Dict[str, float] = {}


def mark(name: str, since: float) -> float:
    now = time.monotonic()
    PHASES[name] = round(now - since, 3)
    return now


def decoder_config(model_gib: float, tiny: bool) -> Any:
    """A Llama decoder whose bf16 weights take about ``model_gib`` GiB (hidden 2048, vocab 32000); tiny for CPU."""
    from transformers import LlamaConfig  # pylint: disable=import-outside-toplevel
    if tiny:
        return LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
    hidden, vocab = 2048, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * 5632          # attention + MLP parameters
    embeddings = 2 * vocab * hidden                              # input embeddings + LM head (untied)
    layers = max(1, round((model_gib * (1 << 30) / 2 - embeddings) / per_layer))
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=5632, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        t = time.monotonic()
        import torch  # pylint: disable=import-outside-toplevel
        import transformers  # pylint: disable=import-outside-toplevel,unused-import
        self.torch = torch
        t = mark("import", t)
        self.dev = torch.device(args.device)
        gpu = self.dev.type == "cuda"
        dtype = torch.bfloat16 if gpu else torch.float32
        torch.manual_seed(args.seed)
        self.model = None
        if args.model_gib > 0:
            from transformers import LlamaForCausalLM  # pylint: disable=import-outside-toplevel
            config = decoder_config(args.model_gib, not gpu)
            with torch.device(self.dev):
                self.model = LlamaForCausalLM(config).to(dtype).eval()
            self.params = sum(p.numel() for p in self.model.parameters())
            if gpu:
                torch.cuda.synchronize()
            t = mark("model", t)
            gen = torch.Generator(device="cpu").manual_seed(args.seed)
            self.prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=gen).to(self.dev)
        else:
            self.params = 0
        self.kv = self._kv(args, dtype)
        t = mark("kv_cache", t)
        self.graph = None
        if self.model is not None:
            with torch.inference_mode():
                for _warm in range(3):  # warm-up: kernels chosen, caches filled
                    self.model(self.prompt, use_cache=False)
                if gpu:
                    torch.cuda.synchronize()
            t = mark("warmup", t)
            if gpu and args.graphs:
                self.static_in = self.prompt.clone()
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream), torch.inference_mode():
                    for _capture in range(2):
                        self.model(self.static_in, use_cache=False)
                torch.cuda.current_stream().wait_stream(stream)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph), torch.inference_mode():
                    self.static_out = self.model(self.static_in, use_cache=False).logits
                self.graph.replay()
                torch.cuda.synchronize()
                t = mark("cuda_graphs", t)
        PHASES["total"] = round(time.time() - T0, 3)

    def _kv(self, args: argparse.Namespace, dtype: Any) -> List[Any]:
        torch = self.torch
        total = int(args.kv_gib * (1 << 30)) if args.kv_gib else args.kv_mib << 20
        chunk = 256 << 20
        gen = torch.Generator(device=self.dev).manual_seed(args.seed + 1)
        out = []
        while total > 0:
            size = min(chunk, total)
            out.append(torch.rand(size // 2, device=self.dev, generator=gen).to(torch.bfloat16))
            total -= size
        return out

    def generate(self) -> Dict[str, Any]:
        torch = self.torch
        t0 = time.monotonic()
        out: Dict[str, Any] = {"pid": os.getpid()}
        with torch.inference_mode():
            if self.model is not None:
                if self.graph is not None:
                    self.graph.replay()
                    logits = self.static_out
                else:
                    logits = self.model(self.prompt, use_cache=False).logits
                out["logits_sha256"] = hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()
                ids = self.prompt
                tokens = []
                for _step in range(8):  # greedy, eager: every kernel runs again
                    nxt = self.model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
                    tokens.append(int(nxt.item()))
                    ids = torch.cat([ids, nxt], dim=1)
                out["tokens"] = tokens
            sums = []
            for t in self.kv:
                bits = t.view(torch.int16).to(torch.int64)
                weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521
                sums.append([int(bits.sum().item()), int((bits * weights).sum().item())])
            out["kv_checksum"] = hashlib.sha256(json.dumps(sums).encode()).hexdigest()
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the checksums' scratch is not the server's memory
        out["seconds"] = round(time.monotonic() - t0, 4)
        return out

    def stats(self) -> Dict[str, Any]:
        torch = self.torch
        held = torch.cuda.memory_reserved(self.dev) if self.dev.type == "cuda" else \
            sum(t.numel() * t.element_size() for t in self.kv)
        return {"pid": os.getpid(), "phases": PHASES, "params": self.params, "device": str(self.dev),
                "device_bytes": int(held), "kv_bytes": sum(t.numel() * t.element_size() for t in self.kv),
                "graphs": self.graph is not None, "torch": torch.__version__}


def serve(server: Server, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/generate":
                body = server.generate()
            elif self.path == "/stats":
                body = server.stats()
            else:
                self.send_error(404)
                return
            data = (json.dumps(body) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", port), Handler)
    control = os.environ.get("SNAPSHOT_CONTROL_DIR")
    if control:
        with open(os.path.join(control, "ready-for-snapshot.tmp"), "w", encoding="utf-8") as handle:
            handle.write(json.dumps(server.stats()) + "\n")
        os.rename(os.path.join(control, "ready-for-snapshot.tmp"), os.path.join(control, "ready-for-snapshot"))
    print(json.dumps({"ready": server.stats()}), flush=True)
    httpd.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-gib", type=float, default=2.0, help="decoder weights in GiB (0: KV tensors only)")
    parser.add_argument("--kv-gib", type=float, default=0.0, help="device tensors standing for a KV cache, GiB")
    parser.add_argument("--kv-mib", type=int, default=64, help="the same in MiB when --kv-gib is 0")
    parser.add_argument("--prompt", type=int, default=128, help="prompt length in tokens")
    parser.add_argument("--seed", type=int, default=20261205)
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="capture a CUDA graph of the forward pass (GPU only)")
    args = parser.parse_args()
    serve(Server(args), args.port)


if __name__ == "__main__":
    main()
