"""Podman for the integration tests: the tests' containers.conf, the local node image, playbooks.

Every test that starts a container gets the image through ``node_image()``, which builds it when it is
missing (tests/support/build_node_image.sh: cached, a no-op when the image exists with the current
recipe, serialised by a lock). No test module relies on another one having built anything, so each
module passes alone, in any order, on a machine where nothing was built before.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Dict

from .ansible_run import REPO, ansible_env

SUPPORT = REPO / "tests" / "support"
BUILD_IMAGE = SUPPORT / "build_node_image.sh"


def podman_env() -> Dict[str, str]:
    """ansible_env() plus CONTAINERS_CONF pointing at the tests' containers.conf (runc, fitted ulimits)."""
    out = subprocess.run([str(SUPPORT / "podman-env.sh"), str(REPO / "tests" / "output" / "podman")],
                         capture_output=True, text=True, check=True).stdout
    env = ansible_env()
    env["CONTAINERS_CONF"] = shlex.split(out.split("=", 1)[1])[0]
    return env


@lru_cache(maxsize=None)
def _built(storage_conf: str) -> str:
    env = podman_env()
    image = subprocess.run([str(BUILD_IMAGE), "--print-image"], env=env, capture_output=True, text=True,
                           check=True).stdout.strip().splitlines()[-1]
    build = subprocess.run([str(BUILD_IMAGE)], env=env, capture_output=True, text=True, timeout=1800, check=False)
    if build.returncode != 0:
        raise RuntimeError(f"building the node image {image} failed (exit {build.returncode}):\n"
                           f"{build.stderr[-4000:]}")
    exists = subprocess.run(["podman", "image", "exists", image], env=env, check=False)
    if exists.returncode != 0:
        raise RuntimeError(f"build_node_image.sh succeeded but podman has no image {image}")
    return image


def node_image() -> str:
    """The local test-node image, built first when this container storage lacks it.

    Keyed by CONTAINERS_STORAGE_CONF: a process that switched container storage checks again.
    """
    return _built(os.environ.get("CONTAINERS_STORAGE_CONF", ""))


def play(tmp_path: Path, env: dict, inventory: str, connection: str, tasks: list, name: str,
         ok: bool = True) -> dict:
    """Run TASKS as one play against INVENTORY; returns each task's result by task name."""
    book = tmp_path / f"{name}.yml"
    book.write_text(json.dumps([{"name": name, "hosts": "all", "gather_facts": False,
                                 "vars": {"ansible_python_interpreter": "/usr/bin/python3"}, "tasks": tasks}]))
    proc = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), str(book), "-i", inventory, "-c", connection],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    doc = json.loads(proc.stdout)
    results = [r for p in doc["plays"] for t in p["tasks"] for r in t["hosts"].values()]
    fails = [str(r.get("msg")) + "\n" + "\n".join(r.get("criu_log_tail", [])) for r in results if r.get("failed")]
    if ok:
        assert proc.returncode == 0, fails or proc.stderr[-2000:]
    return {t["task"]["name"]: list(t["hosts"].values())[0] for p in doc["plays"] for t in p["tasks"]}
