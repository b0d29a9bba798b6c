"""Building the tests' fake vendor libraries (fake_libcuda.c, fake_libascendcl.c) into shared objects.

One compiler command for every fake and every test that builds one: ``-Wall -Werror -shared -fPIC`` with
the given ``-D`` defines. gcc (or cc) is required: without it the tests fail, saying so.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def compile_library(source: Path, out: Path, *defines: str) -> Path:
    """Build the C file ``source`` into the shared object ``out`` (its directory made), with ``-D`` ``defines``.

    Fails the test when there is no C compiler; asserts the build succeeded (its stderr as the message).
    """
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.fail(f"gcc is needed to build the fake {out.name} for these tests (apt-get install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [gcc, "-Wall", "-Werror", "-shared", "-fPIC", *[f"-D{d}" for d in defines], "-o", str(out), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out
