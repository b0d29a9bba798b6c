"""A fake libascendcl.so for tests: built here from fake_libascendcl.c, with its call log.

The fake keeps the snapshot state machine and an arena of "device memory" in
the process that loads it (CANN's snapshot API acts on the calling process
only) and logs every snapshot call. gcc is required: without it the tests fail.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.fake_build import compile_library

FAKE_SOURCE = Path(__file__).resolve().parent / "fake_libascendcl.c"
FAKE_ENV = ("FAKE_ACL_FAIL", "FAKE_ACL_LOG", "WARMSTART_LIBASCENDCL")


def compile_fake(out: Path, *defines: str) -> Path:
    """Build the fake into ``out`` (a fresh path per test: one library state per path loaded)."""
    return compile_library(FAKE_SOURCE, out, *defines)


def calls(log: Path) -> List[Dict[str, str]]:
    """The logged snapshot calls, each as its key=value fields."""
    if not log.exists():
        return []
    return [dict(item.split("=", 1) for item in line.split()) for line in log.read_text().splitlines()]


def install(root: Path, monkeypatch: pytest.MonkeyPatch, *defines: str) -> Path:
    """A fresh fake under ``root`` (FAKE_ENV cleared, FAKE_ACL_LOG = root/acl.log); the library's path."""
    for name in FAKE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_ACL_LOG", str(root / "acl.log"))
    return compile_fake(root / "libascendcl.so", *defines)
