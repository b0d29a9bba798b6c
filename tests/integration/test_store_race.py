"""A store writer racing the restore: only bytes that were verified are ever read by CRIU.

A store read in place is written by others (other nodes, a user, a container that mounts it). Hashing the
store's files and then letting CRIU open them by path leaves a window in which a writer swaps in images of
their own, and CRIU runs them as root. Here, on real CRIU through the real modules, a second workload's
snapshot ("evil", its own token and port) plays the writer's images:

- at the moment CRIU starts (a CRIU wrapper holds the window open), the writer swaps the victim's whole
  image dir and workload files for evil's: the restore must still bring back the victim, from the bytes it
  verified (old behaviour: CRIU read evil's images, or the tree was killed);
- a writer who outwaits the read lease that pins the page images in place (lease-break-time 1 s, a CRIU
  wrapper that waits 3 s) rewrites them after they were hashed and before CRIU reads them: the restore is
  refused, naming the write (old behaviour of an unchecked pin: the hash matched and CRIU ran their bytes);
- while restores run, a writer flips the victim's files between theirs and evil's without pause, by rename
  over, rewrite in place, truncation and a symlink swap: every restore either comes back as the victim or
  is refused naming the mismatch; evil never answers, and no stray copy is left.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from .process_lab import Lab, checkpointed, port_open, query, slow_criu, wait_for_swrk

# serial: it watches what the whole node holds (its mount table, any CRIU worker running): nothing else may run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    lab = Lab(tmp_path_factory.mktemp("store-race"))
    try:
        victim = checkpointed(lab, "victim", 24)
        evil = checkpointed(lab, "evil", 24)
        victim["token"], evil["token"] = lab.token("victim"), lab.token("evil")
        doc = json.loads((lab.store / "snapshots" / victim["id"] / "manifest.json").read_text())
        target = doc["targets"][0]["path"]
        evil_doc = json.loads((lab.store / "snapshots" / evil["id"] / "manifest.json").read_text())
        keep = lab.tmp / "keep"
        # pristine copies of both snapshots' target dirs: what the writer swaps between
        shutil.copytree(lab.store / "snapshots" / victim["id"] / target, keep / "good")
        shutil.copytree(lab.store / "snapshots" / evil["id"] / evil_doc["targets"][0]["path"], keep / "bad")
        yield {"lab": lab, "victim": victim, "evil": evil, "target": target, "keep": keep}
    finally:
        lab.cleanup()


def victim_dir(world: Dict[str, Any]) -> Path:
    return world["lab"].store / "snapshots" / world["victim"]["id"] / world["target"]


def heal(world: Dict[str, Any]) -> None:
    """The victim's target dir as it was published (whatever the writer left)."""
    where = victim_dir(world)
    if where.is_symlink() or where.is_file():
        where.unlink()
    elif where.exists():
        shutil.rmtree(where)
    shutil.copytree(world["keep"] / "good", where)


def settle(world: Dict[str, Any], res: Dict[str, Any]) -> str:
    """Check the one invariant after a raced restore and put the world back; returns 'victim' or 'refused'."""
    lab: Lab = world["lab"]
    victim, evil = world["victim"], world["evil"]
    try:
        assert not port_open(evil["port"]), "evil's images were restored: its server answers"
        if res.get("failed"):
            assert lab.ours() == [], f"a refused restore left a process: {res.get('msg')}"
            msg = res.get("msg", "")
            assert ("checksum" in msg or "do not match the manifest" in msg), msg
            return "refused"
        assert query(victim["port"])["token"] == victim["token"], "what runs is not the victim"
        assert len(lab.ours()) == 1, lab.ours()
        return "victim"
    finally:
        lab.cleanup()
        heal(world)


def swap_at_criu_start(world: Dict[str, Any], wrapper: Path, stop: threading.Event) -> None:
    """Once CRIU's worker starts, every file the victim's restore could still read becomes evil's."""
    if wait_for_swrk(wrapper, timeout=None, stop=stop):
        where = victim_dir(world)
        aside = where.with_name(where.name + ".aside")
        shutil.copytree(world["keep"] / "bad", aside)
        shutil.rmtree(where)
        os.rename(aside, where)


def test_images_swapped_when_criu_starts_are_not_what_criu_reads(world: Dict[str, Any], tmp_path: Path) -> None:
    wrapper = slow_criu(tmp_path, 1)
    res = restore_racing(world, wrapper, lambda stop: swap_at_criu_start(world, wrapper, stop))
    swapped = (victim_dir(world) / "criu").is_dir() and \
        (victim_dir(world) / "criu" / "pages-1.img").read_bytes() == (world["keep"] / "bad" / "criu" / "pages-1.img").read_bytes()
    assert swapped, "the writer never swapped the images: the race did not happen"
    assert not res.get("failed"), res.get("msg")
    assert settle(world, res) == "victim"


def restore_racing(world: Dict[str, Any], wrapper: Path, writer: Callable[[threading.Event], None]) -> Dict[str, Any]:
    """The victim's restore through the CRIU ``wrapper`` while ``writer(stop)`` runs on a thread; its result."""
    stop = threading.Event()
    thread = threading.Thread(target=writer, args=(stop,), daemon=True)
    thread.start()
    try:
        return world["lab"].play([world["lab"].restore("restore", snapshot=world["victim"]["id"],
                                                       criu_path=str(wrapper), expect_fail=True)])["restore"]
    finally:
        stop.set()
        thread.join(30)


def pinned_here(lab: Lab) -> bool:
    """Whether this lab's restores read page images pinned in the store (same local file system as restore_root)."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _storecopy as sc  # pylint: disable=import-outside-toplevel
    lab.restore_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(lab.store, os.O_RDONLY)
    try:
        local = sc._fs_type(fd) in sc.KERNEL_FS  # pylint: disable=protected-access
    finally:
        os.close(fd)
    return local and os.stat(lab.store).st_dev == os.stat(lab.restore_root).st_dev and os.geteuid() == 0


def test_a_writer_who_outwaits_the_lease_after_the_hash_is_refused(world: Dict[str, Any], tmp_path: Path) -> None:
    if not pinned_here(world["lab"]):
        pytest.skip("the store is not on the restore root's local file system here: page images are copied")
    wrapper, got_in = slow_criu(tmp_path, 3), []
    pages = victim_dir(world) / "criu" / "pages-1.img"
    size = pages.stat().st_size
    evil = (world["keep"] / "bad" / "criu" / "pages-1.img").read_bytes()[:size].ljust(size, b"\0")

    def rewrite(stop: threading.Event) -> None:
        if wait_for_swrk(wrapper, timeout=None, stop=stop):
            with open(pages, "r+b") as handle:  # blocks until the kernel breaks the restore's lease (1 s)
                handle.write(evil)
            got_in.append(time.monotonic())

    breaks = Path("/proc/sys/fs/lease-break-time")
    before = breaks.read_text().strip()
    breaks.write_text("1")
    try:
        res = restore_racing(world, wrapper, rewrite)
    finally:
        breaks.write_text(before)
    assert got_in, "the writer never got past the lease: the race did not happen"
    assert res.get("failed"), "a restore whose page images were rewritten after their hash went on"
    assert "opened for writing in the store while the restore read it in place" in res.get("msg", "") + \
        json.dumps(res.get("reasons", [])), res
    assert settle(world, res) == "refused"


def flip(world: Dict[str, Any], how: str, stop: threading.Event, rounds: List[int]) -> None:
    """Flip every file of the victim's target dir between theirs and evil's, ``how``, until ``stop``."""
    good, bad = world["keep"] / "good", world["keep"] / "bad"
    where = victim_dir(world)
    names = [p.relative_to(good) for p in sorted(good.rglob("*")) if p.is_file()]
    staging = where.with_name(where.name + ".w")
    staging.mkdir(exist_ok=True)
    while not stop.is_set():
        for rel in names:
            target = where / rel
            theirs = bad / rel if (bad / rel).is_file() else None
            evil_bytes = theirs.read_bytes() if theirs else (good / rel).read_bytes()[::-1]
            try:
                if how == "rename over":
                    tmp = staging / "f"
                    tmp.write_bytes(evil_bytes)
                    os.rename(tmp, target)
                    time.sleep(0.001)
                    tmp.write_bytes((good / rel).read_bytes())
                    os.rename(tmp, target)
                elif how == "rewrite in place":
                    size = (good / rel).stat().st_size
                    with open(target, "r+b") as handle:
                        handle.write(evil_bytes[:size].ljust(size, b"\0"))
                        handle.flush()
                        time.sleep(0.001)
                        handle.seek(0)
                        handle.write((good / rel).read_bytes())
                elif how == "truncate":
                    os.truncate(target, (good / rel).stat().st_size // 2)
                    time.sleep(0.001)
                    with open(target, "r+b") as handle:
                        handle.write((good / rel).read_bytes())
                elif how == "symlink":
                    src = theirs or good / rel
                    link = staging / "l"
                    if link.is_symlink():
                        link.unlink()
                    os.symlink(src, link)
                    os.rename(link, target)
                    time.sleep(0.001)
                    tmp = staging / "f"
                    tmp.write_bytes((good / rel).read_bytes())
                    os.rename(tmp, target)
            except OSError:
                pass  # the restore's own cleanup or ours raced us: go on flipping
        rounds[0] += 1
    shutil.rmtree(staging, ignore_errors=True)


@pytest.mark.parametrize("how", ["rename over", "rewrite in place", "truncate", "symlink"])
def test_a_writer_flipping_the_images_never_gets_its_bytes_run(world: Dict[str, Any], how: str) -> None:
    lab: Lab = world["lab"]
    for _attempt in range(2):
        stop, rounds = threading.Event(), [0]
        writer = threading.Thread(target=flip, args=(world, how, stop, rounds), daemon=True)
        writer.start()
        try:
            res = lab.play([lab.restore("restore", snapshot=world["victim"]["id"], expect_fail=True)])["restore"]
        finally:
            stop.set()
            writer.join(30)
        assert rounds[0] > 0, "the writer never completed a round during the restore"
        settle(world, res)  # asserts: the victim runs, or the restore was refused naming the mismatch
