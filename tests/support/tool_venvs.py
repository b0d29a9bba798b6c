"""Venvs of their own for tools whose pins clash with the main venv's (release checkers, the oldest ansible-core
the collection claims), built in the checkout when missing or when their pins change; a lock keeps parallel
test workers from building one twice."""
from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[2]


def tool_venv(name: str, pins: Sequence[str]) -> Path:
    """The ``bin`` dir of ``REPO/.venv-<name>`` holding exactly ``pins`` (pip requirement strings)."""
    root = REPO / f".venv-{name}"
    with open(REPO / f".venv-{name}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = root / ".stamp"
        if not stamp.is_file() or stamp.read_text() != " ".join(pins):
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
            done = subprocess.run([str(root / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", *pins],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"pip install {' '.join(pins)} into {root} failed:\n{done.stderr[-2000:]}")
            stamp.write_text(" ".join(pins))
    return root / "bin"
