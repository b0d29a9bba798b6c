"""CUDA in the checkpoint / restore engine (_snapshot, _compat) against the fake libcuda and a fake NVML.

Real processes (a ``sleep`` as the init of its own PID namespace) stand in for
CUDA processes: the fake driver is told their host pids. CRIU itself is
replaced by a recording stub here (the integration test runs the real one):
what is proven is the engine's logic - the auto / required / off decisions,
the order lock -> checkpoint -> dump -> restore -> unlock, the rollback when
the dump fails after the lock, the manifest's gpu section, and the restore
preflight's GPU refusals with both GPU lists.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _accel as acc
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _checkpoint as ckpt
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _control as ctl
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudaabi as cuabi
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _cudabackends as cubk
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel import _gpu
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _gpuhooks as gh
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _preflight as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _snapshot as snap
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st
from ansible_collections.warmstart.snapshot.plugins.module_utils.accel._gpunode import GpuNode
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _proc as proc
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._compat import gpu_incompatibilities, page_bytes
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import CriuError
from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu_rpc import CriuOptions
from tests.support.fake_cuda import Fake, compile_fake, install
from tests.support.fake_nvml import FakeNvml

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_C = "GPU-cccccccc-1111-2222-3333-444444444444"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
NODE = {"hostname": "n1", "arch": "x86_64", "kernel": "6.12.0", "cpu_vendor": "GenuineIntel", "cpu_model": "x",
        "cpu_flags": ["sse2"], "cpu_flags_hash": "h", "criu_version": "4.2.1", "os_id": "debian", "os_version_id": "13"}


def nvml(*gpus: Any, driver: str = "580.65.06") -> FakeNvml:
    fake = FakeNvml(devices=[{"uuid": u, "name": n, "total": 85520809984} for u, n in gpus])
    fake.nvmlSystemGetDriverVersion = lambda: driver  # type: ignore[method-assign]
    return fake


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("fakecuda-engine")
    return {"full": compile_fake(root / "full" / "libcuda.so.1"),
            "old": compile_fake(root / "old" / "libcuda.so.1", "FAKE_WITHOUT_CHECKPOINT_API")}


@pytest.fixture
def fake(tmp_path: Path, libs: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Fake:
    return install(tmp_path, libs["full"], monkeypatch, gh.CRIU_LIBS_DIR)


def node_with(lib: Optional[Path], *gpus: Any, driver: str = "580.65.06") -> GpuNode:
    """A GpuNode on the given fake libcuda (None: a path that does not exist) and a fake NVML with ``gpus``."""
    path = str(lib) if lib else "/nonexistent/libcuda.so.1"
    return GpuNode(availability=lambda: cubk.availability(library=path),
                   inventory=lambda: _gpu.node_gpus(nvml=nvml(*gpus, driver=driver)))


class Ns:
    """``sleep`` as the init of its own PID namespace: ``pid`` on the host, 1 inside."""

    def __init__(self, env: Optional[Dict[str, str]] = None) -> None:
        self.outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "600"],
                                      env=None if env is None else {**os.environ, **env})
        end = time.monotonic() + 10
        self.pid = 0
        while time.monotonic() < end and not self.pid:
            try:
                kids = Path(f"/proc/{self.outer.pid}/task/{self.outer.pid}/children").read_text().split()
            except OSError:
                kids = []
            self.pid = int(kids[0]) if kids else 0
            time.sleep(0.02)
        assert self.pid, "unshare --pid --fork did not start its child (needs root)"

    def alive(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state not in ("Z", "X")

    def stop(self) -> None:
        for pid in (self.pid, self.outer.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.outer.wait(10)


@pytest.fixture
def ns() -> Iterator[Ns]:
    if os.geteuid() != 0:
        pytest.fail("these tests start processes in their own PID namespace: run them as root (make test does)")
    world = Ns()
    try:
        yield world
    finally:
        world.stop()


class Criu:
    """Stands in for the CRIU dump: records what it saw (CUDA states, CRIU_LIBS_DIR) and writes an image."""

    def __init__(self, fake: Optional[Fake], fail: Optional[str] = None) -> None:
        self.fake = fake
        self.fail = fail
        self.seen: List[Dict[str, Any]] = []

    def dump(self, criu: str, pid: int, images: str, options: Any, leave_stopped: bool = True) -> None:
        libs = os.environ.get(gh.CRIU_LIBS_DIR)
        self.seen.append({"pid": pid, "states": self.fake.states() if self.fake else {}, "libs_dir": libs,
                          "libs_dir_empty": libs is not None and os.path.isdir(libs) and not os.listdir(libs)})
        if self.fail:
            raise CriuError(f"CRIU dump of pid {pid} failed: {self.fail}")
        Path(images, "pages-1.img").write_bytes(b"\0" * 4096)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Dict[str, Any]:
    """The engine with CRIU stubbed: no CRIU binary or node probing, locks under tmp_path."""
    monkeypatch.setattr(snap, "find_criu", lambda path=None: "/usr/local/bin/criu")
    monkeypatch.setattr(ckpt, "describe_node", lambda criu=None: dict(NODE))
    monkeypatch.setattr(rs, "describe_node", lambda criu=None: dict(NODE))
    real_lock = snap.lock_target
    monkeypatch.setattr(snap, "lock_target", lambda pid, what: real_lock(pid, what, str(tmp_path / "locks")))
    return {"store": st.FsStore(str(tmp_path / "store"))}


def short(fake: Fake) -> List[str]:
    """The state-changing calls the driver saw, in order, as ``call:pid``."""
    return [f"{c['call']}:{c['pid']}" for c in fake.calls("lock", "checkpoint", "restore", "unlock")]


def run_checkpoint(engine: Dict[str, Any], ns: Ns, node: GpuNode, criu: Optional[Criu], cuda: str,
                   monkeypatch: pytest.MonkeyPatch, leave_running: bool = True, control: Optional[str] = None,
                   lock_s: float = 30) -> Dict[str, Any]:
    if criu is not None:
        monkeypatch.setattr(ckpt, "dump", criu.dump)
    else:
        def no_dump(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("CRIU must not be reached")
        monkeypatch.setattr(ckpt, "dump", no_dump)
    target = snap.Target(ns.pid, "process", control_dir=control)
    return ckpt.checkpoint(engine["store"], target, "gpu-test", {}, CriuOptions(), leave_running=leave_running,
                           cuda=cuda, cuda_lock_timeout=lock_s, gpu_node=node)


def nothing_published(engine: Dict[str, Any]) -> bool:
    """No snapshot published, no staging left."""
    store = engine["store"]
    staging = os.listdir(store.tmp) if os.path.isdir(store.tmp) else []
    return not store.list() and not staging


# --- the decision table -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,driver,is_cuda,outcome", [
    ("off", "full", True, "cpu:cuda: off"),
    ("auto", "none", True, "cpu:libcuda.so.1 not found"),
    ("auto", "old", True, "cpu:lacks cuCheckpointProcessLock"),
    ("auto", "full", False, "cpu:no CUDA process in the tree"),
    ("auto", "full", True, "gpu"),
    ("required", "none", True,
     "error:cuda: required, but this node cannot checkpoint GPU state: /nonexistent/libcuda.so.1 not found"),
    ("required", "old", True, "error:the CUDA checkpoint API needs NVIDIA driver >= 570"),
    ("required", "full", False, "error:is not a CUDA process"),
    ("required", "full", True, "gpu"),
])
def test_decision_table(mode: str, driver: str, is_cuda: bool, outcome: str, fake: Fake, libs: Dict[str, Path],
                        ns: Ns) -> None:
    probed: List[str] = []
    lib = {"none": None, "old": libs["old"], "full": libs["full"]}[driver]
    inner = node_with(lib, (UUID_A, H100))
    node = GpuNode(availability=lambda: probed.append("backend") or inner.backend(), inventory=inner.gpus)
    if is_cuda:
        fake.add(ns.pid)
    kind, _sep, text = outcome.partition(":")
    if kind == "error":
        with pytest.raises(snap.SnapshotError, match="nothing was touched") as err:
            gh.find_cuda(gh.cuda_plan(mode, node), ns.pid)
        assert text in str(err.value)
        assert not short(fake)
        return
    plan = gh.cuda_plan(mode, node)
    gh.find_cuda(plan, ns.pid)
    assert plan.used is (kind == "gpu")
    assert plan.pids == ([ns.pid] if kind == "gpu" else [])
    assert text in plan.reason
    assert probed == ([] if mode == "off" else ["backend"])  # off never loads libcuda
    assert not short(fake)  # deciding never locks anything


def test_the_lock_timeout_is_taken_in_seconds_and_handed_on_in_milliseconds() -> None:
    """cuda_lock_timeout is seconds like every duration of the modules; the driver's lock takes milliseconds."""
    assert gh.cuda_plan("off", GpuNode(), 1.5).lock_timeout_ms == 1500
    assert gh.cuda_plan("off", GpuNode()).lock_timeout_ms == 30000
    with pytest.raises(snap.SnapshotError, match=r"^cuda_lock_timeout: -0.25 s is negative \(0 waits without limit\)$"):
        gh.cuda_plan("off", GpuNode(), -0.25)


def test_required_fails_cleanly_with_the_real_absent_driver(engine: Dict[str, Any], ns: Ns,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no NVIDIA driver: cuda required fails before the store or the process is touched."""
    monkeypatch.delenv("WARMSTART_LIBCUDA", raising=False)
    backend, why = cubk.availability()
    if backend is not None:
        pytest.skip(f"this node has a CUDA checkpoint backend ({why}); the no-driver case cannot be shown here")
    with pytest.raises(snap.SnapshotError, match=r"cuda: required, but this node cannot checkpoint GPU state: "
                                                 r"libcuda\.so\.1 not found .*nothing was touched"):
        run_checkpoint(engine, ns, GpuNode(), None, "required", monkeypatch)
    assert ns.alive()
    assert nothing_published(engine)
    t0 = time.monotonic()
    result = run_checkpoint(engine, ns, GpuNode(), Criu(None), "auto", monkeypatch)
    assert result["cuda"]["used"] is False and "libcuda.so.1 not found" in result["cuda"]["reason"]
    assert result["gpu"] is None
    assert time.monotonic() - t0 < 10


# --- checkpoint with GPU state --------------------------------------------------------------------------------------

def test_gpu_checkpoint_locks_dumps_then_gives_back_and_records_the_gpus(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(ns.pid)
    criu = Criu(fake)
    result = run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100), (UUID_B, H100)), criu, "auto",
                            monkeypatch, lock_s=1.234)
    # CRIU dumped a CHECKPOINTED process, with no plugin dir of its own (its cuda_plugin cannot act too)
    assert criu.seen[0]["states"] == {ns.pid: "checkpointed"}
    assert criu.seen[0]["libs_dir_empty"] is True
    assert gh.CRIU_LIBS_DIR not in os.environ
    assert short(fake) == [f"lock:{ns.pid}", f"checkpoint:{ns.pid}", f"restore:{ns.pid}", f"unlock:{ns.pid}"]
    assert fake.calls("lock")[0]["timeoutMs"] == "1234"
    assert fake.states() == {ns.pid: "running"} and ns.alive()
    assert result["cuda"]["used"] is True and result["cuda"]["pids"] == [ns.pid]
    for key in ("cuda_lock", "cuda_checkpoint", "cuda_resume", "dump"):
        assert key in result["timings"]
    doc = engine["store"].load(result["id"])
    gpu = doc["gpu"]
    assert gpu["pids"] == [{"pid": ns.pid, "ns_pid": 1}]
    assert gpu["cuda_version"] == 13000 and gpu["cuda_version_text"] == "13.0"
    assert gpu["driver_version"] == "580.65.06"
    assert [(g["uuid"], g["name"], g["memory_total"]) for g in gpu["gpus"]] == [
        (UUID_A, H100, 85520809984), (UUID_B, H100, 85520809984)]
    assert result["gpu"] == gpu


def test_cpu_only_snapshot_leaves_criu_and_the_manifest_alone(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch) -> None:
    criu = Criu(fake)
    result = run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), criu, "auto", monkeypatch)
    assert criu.seen[0]["libs_dir"] is None  # CPU-only: CRIU runs exactly as before
    assert "gpu" not in engine["store"].load(result["id"])
    assert not [k for k in result["timings"] if k.startswith("cuda")]


def test_dump_failure_after_the_lock_restores_and_unlocks_the_source(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(ns.pid)
    criu = Criu(fake, fail="Can't dump file 7 of that type")
    with pytest.raises(snap.SnapshotError) as err:
        run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), criu, "required", monkeypatch)
    assert "Can't dump file 7" in str(err.value)
    assert f"CUDA pid(s) {ns.pid} restored and unlocked, running again" in str(err.value)
    assert criu.seen[0]["states"] == {ns.pid: "checkpointed"}
    assert short(fake) == [f"lock:{ns.pid}", f"checkpoint:{ns.pid}", f"restore:{ns.pid}", f"unlock:{ns.pid}"]
    assert fake.states() == {ns.pid: "running"}
    assert ns.alive()
    assert nothing_published(engine)
    assert gh.CRIU_LIBS_DIR not in os.environ


def test_a_lock_timeout_fails_before_criu_and_leaves_the_process_running(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(ns.pid, busy=True)
    with pytest.raises(snap.SnapshotError, match=r"not locked within 500 ms.*still RUNNING"):
        run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), None, "auto", monkeypatch, lock_s=0.5)
    assert fake.states() == {ns.pid: "running"}
    assert nothing_published(engine)


def test_a_process_on_a_mig_instance_is_refused_before_anything_is_locked(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    mig = "MIG-5c89f6d3-2b2a-5b2c-9a4e-4d5e6f708192"
    world = Ns(env={"CUDA_VISIBLE_DEVICES": mig})
    try:
        fake.add(world.pid)
        with pytest.raises(snap.SnapshotError, match="run on a MIG instance; nothing was touched") as err:
            run_checkpoint(engine, world, node_with(libs["full"], (UUID_A, H100)), None, "auto", monkeypatch)
        assert f"pid {world.pid} runs on a MIG instance (CUDA_VISIBLE_DEVICES names {mig})" in err.value.reasons[0]
        assert short(fake) == [] and fake.states() == {world.pid: "running"} and world.alive()
        assert nothing_published(engine)
    finally:
        world.stop()


def test_a_failed_checkpoint_call_is_rolled_back(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(ns.pid)
    monkeypatch.setenv("FAKE_CUDA_FAIL", f"checkpoint:{ns.pid}=801")
    with pytest.raises(snap.SnapshotError, match=r"CUDA_ERROR_NOT_SUPPORTED .*UVM, IPC memory, MIG or MPS.*running again"):
        run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), None, "auto", monkeypatch)
    assert fake.states() == {ns.pid: "running"}
    assert short(fake)[-1] == f"unlock:{ns.pid}"


def test_without_leave_running_the_source_ends_checkpointed(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(ns.pid)
    result = run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), Criu(fake), "auto", monkeypatch,
                            leave_running=False)
    assert short(fake) == [f"lock:{ns.pid}", f"checkpoint:{ns.pid}"]
    assert result["source_running"] is False and not ns.alive()
    assert "cuda_resume" not in result["timings"]


@pytest.fixture
def control(fake: Fake, ns: Ns, tmp_path: Path) -> Path:
    """The workload's control dir (made, empty), ``ns`` told to the fake driver as a CUDA process."""
    fake.add(ns.pid)
    path = tmp_path / "control"
    path.mkdir()
    return path


def wait_until(done: Callable[[], bool], seconds: float = 5) -> None:
    """Poll ``done`` every 10 ms until it holds or ``seconds`` have passed (the workload's callbacks run on its
    own thread, and may still be running when the checkpoint returns)."""
    end = time.monotonic() + seconds
    while not done() and time.monotonic() < end:
        time.sleep(0.01)


def answer_hooks(control: Path, fake: Fake, seen: Dict[str, Any]) -> threading.Thread:
    """What warmstart_workload's on_pre_checkpoint does: answer checkpoint-requested with ready-for-snapshot."""
    def workload() -> None:
        end = time.monotonic() + 20
        while time.monotonic() < end:
            req = control / ctl.CHECKPOINT_REQUESTED
            if req.exists():
                seen["driver_calls_when_asked"] = short(fake)
                request = ctl.parse_kv(req.read_text())["request"]
                ctl.write(str(control), ctl.READY, f"request={request}\n")
                return
            time.sleep(0.01)

    thread = threading.Thread(target=workload)
    thread.start()
    return thread


def test_workload_hooks_are_asked_before_the_lock_and_told_when_done(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        control: Path) -> None:
    (control / ctl.CHECKPOINT_HOOKS).write_text("pre_checkpoint=1\n")
    seen: Dict[str, Any] = {}
    answering = answer_hooks(control, fake, seen)
    result = run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), Criu(fake), "auto", monkeypatch,
                            control=str(control))
    answering.join()
    assert seen["driver_calls_when_asked"] == []  # quiesced before anything was locked
    assert result["cuda"]["hooks"] is True and "quiesce" in result["timings"]
    done = ctl.parse_kv((control / ctl.CHECKPOINT_DONE).read_text())
    assert done["result"] == "ok"
    assert not (control / ctl.CHECKPOINT_REQUESTED).exists()


def test_hooks_are_told_when_the_checkpoint_failed(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        control: Path) -> None:
    (control / ctl.CHECKPOINT_HOOKS).write_text("")
    answering = answer_hooks(control, fake, {})
    with pytest.raises(snap.SnapshotError):
        run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), Criu(fake, fail="boom"), "auto",
                       monkeypatch, control=str(control))
    answering.join()
    assert ctl.parse_kv((control / ctl.CHECKPOINT_DONE).read_text())["result"] == "failed"


def workload_on(control: Path) -> Tuple[Any, Any]:
    """workload/warmstart_workload.py loaded by path, and its Control on ``control`` polling every 10 ms:
    (the module, the Control)."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    path = Path(__file__).resolve().parents[3] / "workload" / "warmstart_workload.py"
    spec = importlib.util.spec_from_file_location("warmstart_workload_for_stages", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module, module.Control(str(control), poll=0.01)


def test_the_six_stages_run_around_the_lock_the_dump_and_the_unlock(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        control: Path) -> None:
    ws, workload = workload_on(control)
    seen: List[Any] = []
    criu = Criu(fake)
    for name in ws.STAGES:
        workload.on(name, lambda arg, name=name: seen.append((name, short(fake)[-1:], len(criu.seen))))
    result = run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), criu, "auto", monkeypatch,
                            control=str(control))
    wait_until(lambda: len(seen) >= 6)
    pid = ns.pid
    assert seen == [("lock_pre", [], 0), ("backup_pre", [f"checkpoint:{pid}"], 0),   # locked, not dumped yet
                    ("backup_post", [f"checkpoint:{pid}"], 1), ("restore_pre", [f"checkpoint:{pid}"], 1),
                    ("restore_post", [f"unlock:{pid}"], 1), ("unlock_post", [f"unlock:{pid}"], 1)]
    assert {"hook_backup_pre", "hook_backup_post", "hook_restore_pre", "hook_restore_post"} <= set(result["timings"])
    assert engine["store"].load(result["id"])["hooks"] == {"stages": list(ws.STAGES)}  # the copy's restore stages


def test_a_backup_pre_refusal_rolls_back_and_names_the_stage_and_callback(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        control: Path) -> None:
    _ws, workload = workload_on(control)
    results: List[str] = []

    def close_sockets(req: Any) -> None:
        raise RuntimeError("socket still in use")

    workload.on("backup_pre", close_sockets)
    workload.on_post_checkpoint(lambda req: results.append(req.result))
    with pytest.raises(snap.SnapshotError) as err:
        run_checkpoint(engine, ns, node_with(libs["full"], (UUID_A, H100)), Criu(fake), "auto", monkeypatch,
                       control=str(control))
    assert "backup_pre" in str(err.value) and "callback close_sockets failed: RuntimeError: socket still in use" \
        in str(err.value)
    pid = ns.pid
    assert short(fake) == [f"lock:{pid}", f"checkpoint:{pid}", f"restore:{pid}", f"unlock:{pid}"]  # rolled back
    assert nothing_published(engine) and ns.alive()
    wait_until(lambda: bool(results))
    assert results == ["failed"]


# --- restore preflight ----------------------------------------------------------------------------------------------

def section(*gpus: Any, cuda_version: int = 13000, driver: str = "580.65.06") -> Dict[str, Any]:
    return {"backend": "CUDA driver API", "cuda_version": cuda_version, "driver_version": driver,
            "pids": [{"pid": 4242, "ns_pid": 1}],
            "gpus": [{"index": i, "uuid": u, "name": n, "memory_total": 85520809984} for i, (u, n) in enumerate(gpus)]}


def test_preflight_refuses_fewer_gpus_listing_both(fake: Fake, libs: Dict[str, Path]) -> None:
    reasons = gpu_incompatibilities(section((UUID_A, H100), (UUID_B, H100)), node_with(libs["full"], (UUID_C, H100)))
    assert len(reasons) == 1
    assert "GPU count differs: the snapshot used 2, this node has 1" in reasons[0]
    assert f"snapshot GPUs [{UUID_A} {H100}, {UUID_B} {H100}], this node's [{UUID_C} {H100}]" in reasons[0]


def test_preflight_refuses_other_models_listing_both(fake: Fake, libs: Dict[str, Path]) -> None:
    reasons = gpu_incompatibilities(section((UUID_A, H100)), node_with(libs["full"], (UUID_A, A100)))
    assert reasons == [f"gpu: GPU models differ: snapshot GPUs [{UUID_A} {H100}], this node's [{UUID_A} {A100}]"]


def test_preflight_refuses_a_node_without_gpus(fake: Fake, libs: Dict[str, Path]) -> None:
    reasons = gpu_incompatibilities(section((UUID_A, H100)), node_with(libs["full"]))
    assert reasons and f"the snapshot used 1 GPU(s) [{UUID_A} {H100}], this node has none" in reasons[0]


def test_preflight_refuses_an_older_driver(fake: Fake, libs: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_DRIVER_VERSION", "12080")
    reasons = gpu_incompatibilities(section((UUID_A, H100)), node_with(libs["full"], (UUID_A, H100), driver="570.86.10"))
    assert "cuda driver: this node's CUDA driver is 12.8, older than the source's 13.0" in reasons
    assert "nvidia driver: this node has 570.86.10, older than the source's 580.65.06" in reasons


def test_preflight_remapping_needs_r580(fake: Fake, libs: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_DRIVER_VERSION", "12080")
    same = gpu_incompatibilities(section((UUID_A, H100), cuda_version=12080, driver="570.86.10"),
                                 node_with(libs["full"], (UUID_A, H100), driver="570.86.10"))
    assert same == []
    other = gpu_incompatibilities(section((UUID_A, H100), cuda_version=12080, driver="570.86.10"),
                                  node_with(libs["full"], (UUID_C, H100), driver="570.86.10"))
    assert other == [f"gpu: restoring onto other GPUs ({UUID_A} -> {UUID_C}) needs NVIDIA driver >= 580 (CUDA 13.0); "
                     "this node's CUDA driver is 12.8"]


def test_preflight_modes(fake: Fake, libs: Dict[str, Path]) -> None:
    node = node_with(libs["full"], (UUID_A, H100))
    assert gpu_incompatibilities(section((UUID_A, H100)), node, "auto") == []
    assert gpu_incompatibilities(section((UUID_A, H100)), node, "required") == []
    assert "cuda: off, but the snapshot holds the GPU state of CUDA pid(s) 4242" in gpu_incompatibilities(
        section((UUID_A, H100)), node, "off")[0]
    assert gpu_incompatibilities(None, node, "auto") == []
    assert gpu_incompatibilities(None, node, "off") == []
    assert "required, but the snapshot holds no GPU state" in gpu_incompatibilities(None, node, "required")[0]
    nodriver = node_with(None, (UUID_A, H100))
    assert "this node cannot restore it: /nonexistent/libcuda.so.1 not found" in gpu_incompatibilities(
        section((UUID_A, H100)), nodriver)[0]
    # skip_compat_check drops the model check, never the backend check
    assert gpu_incompatibilities(section((UUID_A, H100)), node_with(libs["full"], (UUID_A, A100)), hard_only=True) == []
    assert gpu_incompatibilities(section((UUID_A, H100)), nodriver, hard_only=True)


def test_cpu_only_restore_never_probes_the_gpus(engine: Dict[str, Any]) -> None:
    def boom() -> Any:
        raise AssertionError("probed")
    node = GpuNode(availability=boom, inventory=boom)
    doc = {"id": "x", "name": "n", "source": dict(NODE), "targets": [{"kind": "process", "name": "p"}]}
    assert pf.preflight(engine["store"], doc, dict(NODE), False, False, gpu_node=node, cuda="auto") == []


def test_a_node_without_host_memory_for_the_pages_and_staged_gpu_state_is_refused(
        engine: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 1 << 30
    files = [{"path": "t0/criu/pages-1.img", "size": 3 * gib}, {"path": "t0/criu/pages-2.img", "size": gib // 4},
             {"path": "t0/criu/mm-1.img", "size": 5 * gib}, {"path": "t0/pages-3.img.txt", "size": gib}]
    doc = {"id": "x", "name": "n", "source": dict(NODE), "targets": [{"kind": "process", "name": "p"}],
           "files": files, "compression": {"files": {"t0/criu/pages-2.img": {"size": 2 * gib}}}}
    assert page_bytes(doc) == 5 * gib  # page images only, at their plaintext size
    real = proc.memory_available()
    assert isinstance(real, int) and real > 0 and proc.memory_available("/nonexistent") is None
    monkeypatch.setattr(proc, "memory_available", lambda meminfo="": 4 * gib)
    problems = pf.preflight(engine["store"], doc, dict(NODE), False, False)
    assert problems == ["memory: the snapshot's page images need 5.0 GiB of host memory, this node has 4.0 GiB "
                        "available (MemAvailable); free memory or restore on a larger node"]
    doc["gpu"] = section((UUID_A, H100))
    problems = pf.preflight(engine["store"], doc, dict(NODE), False, False, cuda="auto")
    assert "need 5.0 GiB of host memory (with the GPU memory the CUDA checkpoint staged there)" in problems[0]
    assert pf.preflight(engine["store"], doc, dict(NODE), False, True) == []  # skip_compat_check: at the user's risk
    monkeypatch.setattr(proc, "memory_available", lambda meminfo="": 5 * gib)
    assert pf.preflight(engine["store"], doc, dict(NODE), False, False) == []


def test_preflight_and_check_mode_report_gpu_reasons(fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any]) -> None:
    doc = {"id": "x", "name": "n", "source": dict(NODE), "targets": [{"kind": "process", "name": "p"}],
           "gpu": section((UUID_A, H100), (UUID_B, H100))}
    problems = pf.preflight(engine["store"], doc, dict(NODE), False, False,
                            gpu_node=node_with(libs["full"], (UUID_A, A100)), cuda="auto")
    assert problems and problems[0].startswith("gpu: GPU count differs")


# --- restore with GPU state -----------------------------------------------------------------------------------------

class CallLog:
    """A list kept in a file: appended to by the restorer child (a forked process), read by the test."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, value: Optional[str]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(value) + "\n")

    def items(self) -> List[Optional[str]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines()]

    def __bool__(self) -> bool:
        return bool(self.items())

    def __getitem__(self, n: int) -> Optional[str]:
        return self.items()[n]

    def __eq__(self, other: object) -> bool:
        return self.items() == other

    __hash__ = None  # type: ignore[assignment]


@contextlib.contextmanager
def restored(fake: Fake, engine: Dict[str, Any], ns: Ns, libs: Dict[str, Path], monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path, source_gpus: Any, node_gpus: Any) -> Iterator[Any]:
    """A GPU snapshot of ``ns`` (source GPUs ``source_gpus``), and a restore whose CRIU step 'restores' a new ns:
    (result, copy, control, libs_dirs, node on ``node_gpus``); the copy is stopped when the block ends."""
    fake.add(ns.pid)
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    result = run_checkpoint(engine, ns, node_with(libs["full"], *source_gpus), Criu(fake), "auto", monkeypatch,
                            control=str(control), leave_running=False)
    copy = Ns()
    fake.add(copy.pid, "checkpointed", gpus=[u for u, _n in source_gpus])
    fake.clear_log()
    libs_dirs = CallLog(tmp_path / "criu-calls.json")

    def criu_restore(criu: str, images: str, work: str, options: Any) -> int:
        libs_dirs.append(os.environ.get(gh.CRIU_LIBS_DIR))  # runs in the restorer child: logged to a file
        return copy.pid

    monkeypatch.setattr(rs, "criu_restore", criu_restore)
    try:
        yield result, copy, control, libs_dirs, node_with(libs["full"], *node_gpus)
    finally:
        copy.stop()


def test_restore_maps_pids_and_gpus_then_unlocks_then_restore_complete(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    with restored(fake, engine, ns, libs, monkeypatch, tmp_path, [(UUID_A, H100), (UUID_B, H100)],
                  [(UUID_B, H100), (UUID_C, H100)]) as (result, copy, control, libs_dirs, node):
        out = rs.restore(engine["store"], result["id"], restore_root=str(tmp_path / "restore"), gpu_node=node)
        assert out["pid"] == copy.pid
        assert out["cuda"]["pids"] == [copy.pid]  # namespace pid 1 of the snapshot -> the new host pid
        assert out["cuda"]["gpu_pairs"] == [[UUID_A, UUID_C], [UUID_B, UUID_B]]  # same UUID first, then by position
        assert short(fake) == [f"restore:{copy.pid}", f"unlock:{copy.pid}"]
        call = fake.calls("restore")[0]
        assert call["pairs"] == "2"
        assert call["pair0"] == f"{cuabi.uuid_bytes(UUID_A).hex()}:{cuabi.uuid_bytes(UUID_C).hex()}"
        assert fake.states()[copy.pid] == "running"
        assert libs_dirs and libs_dirs[0] is not None  # CRIU's plugins off for the GPU restore too
        assert {"cuda_restore", "cuda_unlock", "restore"} <= set(out["timings"])
        assert ctl.parse_kv((control / ctl.RESTORE_COMPLETE).read_text())["host_pid"] == str(copy.pid)


def test_a_failed_cuda_restore_writes_restore_failed_and_kills_the_copy(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    with restored(fake, engine, ns, libs, monkeypatch, tmp_path, [(UUID_A, H100)],
                  [(UUID_A, H100)]) as (result, copy, control, _libs, node):
        monkeypatch.setenv("FAKE_CUDA_FAIL", f"restore:{copy.pid}=2")
        with pytest.raises(snap.SnapshotError, match=rf"cuda restore of snapshot .* CUDA_ERROR_OUT_OF_MEMORY.*"
                                                     rf"restored tree \(pid {copy.pid}\) was killed"):
            rs.restore(engine["store"], result["id"], restore_root=str(tmp_path / "restore"), gpu_node=node)
        assert not copy.alive()
        assert (control / ctl.RESTORE_FAILED).exists() and not (control / ctl.RESTORE_COMPLETE).exists()
        assert short(fake) == [f"restore:{copy.pid}"]  # the injected failure; no unlock was tried after it
        assert fake.calls("restore")[0].get("injected") == "1"


def test_restore_refuses_before_criu_when_the_gpus_differ(
        fake: Fake, libs: Dict[str, Path], engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    with restored(fake, engine, ns, libs, monkeypatch, tmp_path, [(UUID_A, H100), (UUID_B, H100)],
                  [(UUID_A, A100)]) as (result, _copy, _control, libs_dirs, node):
        with pytest.raises(snap.SnapshotError, match="refusing to restore") as err:
            rs.restore(engine["store"], result["id"], restore_root=str(tmp_path / "restore"), gpu_node=node)
        assert any(f"[{UUID_A} {H100}, {UUID_B} {H100}], this node's [{UUID_A} {A100}]" in r for r in err.value.reasons)
        assert libs_dirs == [] and short(fake) == []  # CRIU never ran
        with pytest.raises(snap.SnapshotError, match="refusing to restore"):
            rs.restore(engine["store"], result["id"], gpu_node=node, check_mode=True)
        with pytest.raises(snap.SnapshotError) as off:
            rs.restore(engine["store"], result["id"], cuda="off", gpu_node=node_with(libs["full"], (UUID_A, H100),
                                                                                     (UUID_B, H100)), check_mode=True)
        assert "cuda: off, but the snapshot holds the GPU state" in off.value.reasons[0]


# --- refusals name the accelerator asked for -------------------------------------------------------------------------

def test_accelerator_ascend_on_a_tree_without_npu_state_names_ascend_and_touches_nothing(
        engine: Dict[str, Any], ns: Ns, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = acc.ascend_gpu_node(acc.AscendAccelerator(root=str(tmp_path / "agents")))
    node.absent = lambda: acc.npu_absent(str(tmp_path))  # a /dev without davinci<N>
    with pytest.raises(snap.SnapshotError) as err:
        run_checkpoint(engine, ns, node, None, "required", monkeypatch)
    msg = str(err.value)
    assert msg.startswith(f"accelerator: ascend, but pid {ns.pid} is not an Ascend NPU process (no process of its "
                          f"tree - {ns.pid} - has Ascend NPU state); this node has no Ascend NPU "
                          f"({tmp_path}/davinci<N> missing); nothing was touched"), msg
    assert "CUDA" not in msg and "cuda" not in msg
    assert ns.alive() and Path(f"/proc/{ns.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"
    assert nothing_published(engine)


def test_npu_absent_looks_for_davinci_devices(tmp_path: Path) -> None:
    assert acc.npu_absent(str(tmp_path)) == f"this node has no Ascend NPU ({tmp_path}/davinci<N> missing)"
    (tmp_path / "davinci_manager").touch()
    assert acc.npu_absent(str(tmp_path)) is not None, "davinci_manager is not an NPU"
    (tmp_path / "davinci0").touch()
    assert acc.npu_absent(str(tmp_path)) is None
    assert acc.npu_absent(str(tmp_path / "missing")) is not None


@pytest.mark.parametrize("accelerator, mode, want", [
    ("cuda", "required", "cuda: required, but the snapshot holds no GPU state (it was taken CPU-only)"),
    ("ascend", "required", "accelerator: ascend, but the snapshot holds no NPU state (it was taken CPU-only)"),
])
def test_restore_refusals_name_the_accelerator(accelerator: str, mode: str, want: str) -> None:
    node = GpuNode(availability=lambda: (None, "none here"), accelerator=accelerator)
    assert gpu_incompatibilities(None, node, mode) == [want]
    state = {"pids": [{"pid": 7, "ns_pid": 1}], "gpus": []}
    got = gpu_incompatibilities(state, node, mode, hard_only=True)
    word, device = ("CUDA", "GPU") if accelerator == "cuda" else ("Ascend NPU", "NPU")
    assert got == [f"{node.asked(mode)}: the snapshot holds {device} state ({word} pid(s) 7), but this node cannot "
                   "restore it: none here"]
