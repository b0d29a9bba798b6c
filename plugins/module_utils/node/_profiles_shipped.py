# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The application profiles warmstart ships (``_profile`` describes the format; docs/profiles.md each one).

Every URL is reached from inside the server's own network namespace (a container's 127.0.0.1 is its own),
so the ports are the ones the server listens on, not a published host port. ``written_for`` says which
versions' documented API a profile follows; ``llama-cpp-python`` and ``mlserver`` run in this repository's
tests.
"""
from __future__ import annotations

from typing import Any, Dict


def _http(path: str, **more: Any) -> Dict[str, Any]:
    return {"url": "http://{host}:{port}" + path, **more}


SHIPPED: Dict[str, Dict[str, Any]] = {
    "generic-http": {
        "name": "generic-http",
        "description": "Any HTTP server: warm once GET {path} answers 200.",
        "written_for": "any HTTP server with a readiness endpoint",
        "vars": {"host": "127.0.0.1", "port": 8000, "path": "/health"},
        "ready": {"http": _http("{path}"), "timeout": 600},
    },
    "vllm": {
        "name": "vllm",
        "description": "vLLM's OpenAI-compatible server: warm once /health answers 200 (model loaded, graphs "
                       "captured).",
        "written_for": "vLLM 0.6 and later (vllm serve)",
        "vars": {"host": "127.0.0.1", "port": 8000},
        "ready": {"http": _http("/health"), "timeout": 1800},
    },
    "vllm-sleep": {
        "name": "vllm-sleep",
        "description": "vLLM with sleep mode: level 1 sleep before the dump (KV cache dropped, weights offloaded to "
                       "host memory: the GPU part of the snapshot shrinks), wake_up after the restore. Needs "
                       "vllm serve --enable-sleep-mode with VLLM_SERVER_DEV_MODE=1.",
        "written_for": "vLLM 0.7.3 and later (POST /sleep, POST /wake_up, GET /is_sleeping)",
        "vars": {"host": "127.0.0.1", "port": 8000, "level": 1},
        "ready": {"http": _http("/health"), "timeout": 1800},
        "quiesce": [{"http": _http("/sleep?level={level}", method="POST"), "timeout": 300}],
        "resume": [{"http": _http("/wake_up", method="POST"), "timeout": 300}],
        "release": [{"http": _http("/wake_up", method="POST"), "timeout": 300}],
        "serving": {"http": _http("/is_sleeping", body='"is_sleeping":\\s*false'), "timeout": 300},
    },
    "sglang": {
        "name": "sglang",
        "description": "SGLang's server: warm once /health answers 200.",
        "written_for": "SGLang 0.4 and later (python -m sglang.launch_server)",
        "vars": {"host": "127.0.0.1", "port": 30000},
        "ready": {"http": _http("/health"), "timeout": 1800},
    },
    "sglang-memory-saver": {
        "name": "sglang-memory-saver",
        "description": "SGLang with --enable-memory-saver: GPU memory released before the dump, resumed after "
                       "the restore.",
        "written_for": "SGLang 0.4.4 and later (POST /release_memory_occupation, /resume_memory_occupation)",
        "vars": {"host": "127.0.0.1", "port": 30000},
        "ready": {"http": _http("/health"), "timeout": 1800},
        "quiesce": [{"http": _http("/release_memory_occupation", method="POST", json={}), "timeout": 300}],
        "resume": [{"http": _http("/resume_memory_occupation", method="POST", json={}), "timeout": 300}],
        "release": [{"http": _http("/resume_memory_occupation", method="POST", json={}), "timeout": 300}],
    },
    "tgi": {
        "name": "tgi",
        "description": "Hugging Face Text Generation Inference: warm once /health answers 200 (its container "
                       "listens on 80; the launcher alone on 3000).",
        "written_for": "TGI 2.x and 3.x (text-generation-launcher)",
        "vars": {"host": "127.0.0.1", "port": 80},
        "ready": {"http": _http("/health"), "timeout": 1800},
    },
    "tei": {
        "name": "tei",
        "description": "Hugging Face Text Embeddings Inference: warm once /health answers 200 (its container "
                       "listens on 80).",
        "written_for": "TEI 1.x (text-embeddings-router)",
        "vars": {"host": "127.0.0.1", "port": 80},
        "ready": {"http": _http("/health"), "timeout": 900},
    },
    "llama-cpp": {
        "name": "llama-cpp",
        "description": "llama.cpp's llama-server: warm once /health answers 200 (it answers 503 while the model "
                       "loads).",
        "written_for": "llama.cpp llama-server, builds from 2024 on",
        "vars": {"host": "127.0.0.1", "port": 8080},
        "ready": {"http": _http("/health"), "timeout": 900},
    },
    "llama-cpp-python": {
        "name": "llama-cpp-python",
        "description": "llama-cpp-python's OpenAI-compatible server (python -m llama_cpp.server): warm once "
                       "/v1/models lists a model; it loads the model before it listens.",
        "written_for": "llama-cpp-python 0.2 and 0.3 (tested here with 0.3.16)",
        "vars": {"host": "127.0.0.1", "port": 8000},
        "ready": {"http": _http("/v1/models", body='"id"'), "timeout": 900},
    },
    "ollama": {
        "name": "ollama",
        "description": "Ollama: warm once a model is loaded (GET /api/ps lists one); load it first with a request "
                       "that names it.",
        "written_for": "Ollama 0.1.38 and later (GET /api/ps)",
        "vars": {"host": "127.0.0.1", "port": 11434},
        "ready": {"http": _http("/api/ps", body='"models":\\s*\\[\\s*\\{'), "timeout": 900},
    },
    "mlserver": {
        "name": "mlserver",
        "description": "Seldon MLServer (the V2 inference protocol): warm once /v2/health/ready answers 200 (every "
                       "model loaded).",
        "written_for": "MLServer 1.x (tested here with 1.7.1)",
        "vars": {"host": "127.0.0.1", "port": 8080},
        "ready": {"http": _http("/v2/health/ready"), "timeout": 900},
    },
    "triton": {
        "name": "triton",
        "description": "NVIDIA Triton Inference Server: warm once /v2/health/ready answers 200 (every model "
                       "ready).",
        "written_for": "Triton 2.x (KServe v2 HTTP API)",
        "vars": {"host": "127.0.0.1", "port": 8000},
        "ready": {"http": _http("/v2/health/ready"), "timeout": 1800},
    },
}
