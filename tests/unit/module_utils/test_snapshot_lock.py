"""Two checkpoints of one process tree never run at once."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._snapshot import SnapshotError, lock_target


def test_second_checkpoint_of_the_same_tree_is_refused_until_the_first_ends(tmp_path: Path) -> None:
    fd = lock_target(os.getpid(), "workload w", str(tmp_path))
    with pytest.raises(SnapshotError, match=rf"workload w: another checkpoint of it is running \(warmstart pid {os.getpid()}\)"):
        lock_target(os.getpid(), "workload w", str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.close(lock_target(other.pid, "pid x", str(tmp_path)))  # another tree: its own lock
    finally:
        other.kill()
        other.wait()
    os.close(fd)
    os.close(lock_target(os.getpid(), "workload w", str(tmp_path)))


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    code = ("import sys, time; sys.path[:0] = %r; "
            "from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot._snapshot import lock_target; "
            "lock_target(%d, 'w', %r); print('locked', flush=True); time.sleep(60)") % (sys.path, os.getpid(), str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(SnapshotError, match="another checkpoint"):
        lock_target(os.getpid(), "w", str(tmp_path))
    holder.kill()
    holder.wait()
    os.close(lock_target(os.getpid(), "w", str(tmp_path)))
