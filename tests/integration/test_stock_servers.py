"""Stock inference servers, unchanged, through application profiles (issue 34), on real CRIU and the real modules.

The first server is llama.cpp's, as llama-cpp-python[server] ships it from the package index (an OpenAI-compatible
API on uvicorn, llama.cpp's threads), serving a tiny GGUF model the test writes (fixed seed). It knows nothing
about warmstart: the shipped profile ``llama-cpp-python`` says when it is warm (GET /v1/models lists the model).

- cold start through ``workload`` with the profile, checkpoint, restore (eagerly, and lazily): the restored
  server gives the same greedy completion for a fixed prompt and seed, and the restore waited for it to serve;
- a ready probe that never passes times out naming the probe, with the source untouched and no snapshot;
- a quiesce step that fails ends the checkpoint before anything is stopped, and the profile's resume steps
  run on the source, which keeps serving;
- a release step that fails fails the restore and the copy is killed;
- a bad profile is refused with every problem, before anything is touched;
- the same server in a podman container (the venv and model bound in read-only), checkpointed through the
  profile and restored into a placeholder: the profile's probes run in the container's network namespace;
- a second stock server, Seldon's MLServer with its scikit-learn runtime (a classifier trained with a fixed
  seed), through the shipped ``mlserver`` profile: restored eagerly and lazily, the same probabilities.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .container_lab import Pod, pod_for
from .process_lab import Lab, free_port, gone, port_open, proc_state
from .stock_lab import (LLAMA, LLAMA_BUILD_ENV, MLSERVER, cached_venv, completion, completion_at, infer, mlserver_models,
                        tiny_llama)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """llama-cpp-python's server from the package index (cached venv) and a tiny model written for it."""
    python = cached_venv("llama", LLAMA, LLAMA_BUILD_ENV)
    model = tiny_llama(python, tmp_path_factory.mktemp("model") / "tiny.gguf")
    return {"python": python, "model": model}


@pytest.fixture
def server(lab: Lab, llama: Dict[str, Path]) -> Iterator[Dict[str, Any]]:
    """A cold-started stock server as a workload, warm (its profile's ready probe passed); stopped afterwards."""
    port = free_port()
    profile = {"name": "llama-cpp-python", "vars": {"port": port}}
    t0 = time.monotonic()
    res = lab.play([{"name": "start", "warmstart.snapshot.workload": {
        "name": "llm", "root": str(lab.workloads), "wait_ready": True, "app_profile": profile,
        "command": [str(llama["python"]), "-m", "llama_cpp.server", "--model", str(llama["model"]),
                    "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "2"]}}])
    cold = time.monotonic() - t0
    try:
        yield {"port": port, "profile": profile, "cold_start": cold, "pid": res["start"]["workload"]["pid"],
               "ready_after": res["start"]["workload"]["ready_after"]}
    finally:
        lab.play([lab.stop("llm")])


def test_a_stock_llm_server_comes_back_answering_the_same(lab: Lab, server: Dict[str, Any]) -> None:
    port = server["port"]
    before = completion(port)
    assert before and server["ready_after"] > 0
    res = lab.play([lab.checkpoint("checkpoint", workload="llm", leave_running=False),
                    lab.restore("restore", name="llm")])
    snapshot, restored = res["checkpoint"]["snapshot"], res["restore"]["restore"]
    assert snapshot["app_profile"] == {"name": "llama-cpp-python", "quiesce": []}, "the workload's profile was not used"
    assert restored["app_profile"]["name"] == "llama-cpp-python"
    assert restored["app_profile"]["serving"].endswith(f":{port}/v1/models")
    assert completion(port) == before, "the restored server does not answer as the warm one did"
    assert restored["pid"] != server["pid"] and proc_state(server["pid"]) in ("-", "Z", "X")
    print(f"\nstock llama-cpp-python: cold start to ready {server['cold_start']:.2f} s, "
          f"restore {restored['timings']['total']:.2f} s (serving after {restored['app_profile']['serving_after']} s)")


def test_a_stock_llm_server_restored_lazily_answers_the_same(lab: Lab, server: Dict[str, Any]) -> None:
    port = server["port"]
    before = completion(port)
    res = lab.play([lab.checkpoint("checkpoint", workload="llm", leave_running=False),
                    lab.restore("restore", name="llm", lazy=True, lazy_wait=True)])
    restored = res["restore"]["restore"]
    assert restored["lazy"].get("used") in (True, False)  # without uffd here it says why, and restores eagerly
    assert completion(port) == before


def test_a_ready_probe_that_never_passes_leaves_the_source_untouched(lab: Lab, server: Dict[str, Any]) -> None:
    never = {"name": "never", "ready": {"http": {"url": f"http://127.0.0.1:{server['port']}/no-such-path"},
                                        "timeout": 2, "interval": 0.2}}
    res = lab.play([lab.checkpoint("checkpoint", workload="llm", wait_ready=True, app_profile=never,
                                   expect_fail=True)])
    out = res["checkpoint"]
    assert out["failed"] and "/no-such-path did not pass within 2 s" in out["msg"], out["msg"]
    assert "status 404" in out["msg"] and "nothing was touched" in out["msg"]
    assert proc_state(server["pid"]) in ("S", "R") and lab.published() == [] and lab.staging() == []
    assert completion(server["port"])


def test_a_failing_quiesce_step_resumes_the_source(lab: Lab, server: Dict[str, Any], tmp_path: Path) -> None:
    resumed = tmp_path / "resumed"
    profile = {"name": "sleepy", "ready": {"http": {"url": f"http://127.0.0.1:{server['port']}/v1/models"}},
               "quiesce": [{"http": {"url": f"http://127.0.0.1:{server['port']}/sleep?level=1"}}],
               "resume": [{"command": ["/usr/bin/touch", str(resumed)]}]}
    res = lab.play([lab.checkpoint("checkpoint", workload="llm", app_profile=profile, expect_fail=True)])
    msg = res["checkpoint"]["msg"]
    assert "profile sleepy: quiesce[0] (HTTP POST" in msg and "status 404" in msg, msg
    assert "nothing was dumped, the source keeps running" in msg
    assert resumed.exists(), "the profile's resume steps did not run on the source"
    assert proc_state(server["pid"]) in ("S", "R") and lab.published() == []
    assert completion(server["port"])


def test_a_failing_release_step_kills_the_copy(lab: Lab, server: Dict[str, Any]) -> None:
    port = server["port"]
    res = lab.play([lab.checkpoint("checkpoint", workload="llm", leave_running=False),
                    lab.restore("would restore", name="llm", check=True)])
    assert res["would restore"]["restore"]["app_profile"] == {
        "name": "llama-cpp-python", "release": [], "serving": f"HTTP GET http://127.0.0.1:{port}/v1/models"}
    broken = {"name": "broken", "ready": {"http": {"url": f"http://127.0.0.1:{port}/v1/models"}},
              "release": [{"http": {"url": f"http://127.0.0.1:{port}/wake_up"}, "timeout": 5}]}
    res = lab.play([lab.restore("restore", name="llm", app_profile=broken, expect_fail=True)])
    out = res["restore"]
    assert out["failed"] and "profile broken: release[0] (HTTP POST" in out["msg"], out["msg"]
    assert "was killed" in out["msg"] and lab.pidfile_pid("llm") is None
    deadline = time.monotonic() + 10
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not port_open(port), "the copy that failed its release still serves"


def test_a_bad_profile_is_refused_with_every_problem(lab: Lab, server: Dict[str, Any]) -> None:
    bad = {"name": "Bad", "ready": {"http": {"url": "ftp://x"}}, "quiesce": [{"signal": "SIGKILL"}]}
    res = lab.play([lab.checkpoint("checkpoint", workload="llm", app_profile=bad, expect_fail=True)])
    out = res["checkpoint"]
    assert len(out["reasons"]) == 3, out["reasons"]
    assert any("SIGKILL" in r for r in out["reasons"]) and any("ftp://x" in r for r in out["reasons"])
    assert proc_state(server["pid"]) in ("S", "R") and lab.published() == []
    assert not gone(server["pid"], 0.5)


# --- the same server in a podman container, restored into a placeholder ---------------------------------

@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    yield from pod_for(tmp_path_factory.mktemp("stock-containers"))


def test_a_stock_llm_server_in_a_container_comes_back_in_a_placeholder(pod: Pod, llama: Dict[str, Path]) -> None:
    """The profile's probes and steps run in the container's own network namespace (its 127.0.0.1:8000), from
    the checkpoint's wait_ready to the placeholder copy's serving probe."""
    venv = llama["python"].parent.parent
    volumes = {str(venv): str(venv), str(llama["model"].parent): "/models"}
    src = pod.run("llm", str(llama["python"]), "-m", "llama_cpp.server", "--model", "/models/tiny.gguf",
                  "--host", "0.0.0.0", "--port", "8000", "--n_ctx", "512", "--n_threads", "2", volumes=volumes)
    ph = pod.run("llm-ph", "sleep", "infinity", init=False, volumes=volumes)
    res = pod.play([pod.checkpoint("checkpoint", container=src, wait_ready=True, app_profile="llama-cpp-python")],
                   "stock-capture")
    before = completion_at(pod.ip(src))
    res.update(pod.play([pod.restore("restore", name=src, into={"container_map": f"{src}={ph}"})], "stock-restore"))
    snapshot, restored = res["checkpoint"]["snapshot"], res["restore"]["restore"]
    assert snapshot["app_profile"]["name"] == "llama-cpp-python"
    dest = restored["destinations"][0]
    assert dest["result"] == "succeeded", dest
    assert dest["app_profile"]["serving"] == "HTTP GET http://127.0.0.1:8000/v1/models"
    assert completion_at(pod.ip(ph)) == before, "the placeholder's copy does not answer as the source did"


# --- a second stock server: Seldon's MLServer (V2 inference protocol), scikit-learn runtime ------------------

@pytest.fixture(scope="module")
def mlserver_python() -> Path:
    return cached_venv("mlserver", MLSERVER)


def test_a_stock_mlserver_comes_back_answering_the_same(lab: Lab, mlserver_python: Path) -> None:
    """MLServer as it ships (FastAPI on uvicorn with uvloop, a gRPC server, its model registry), started through
    ``workload`` with the shipped ``mlserver`` profile, restored eagerly and lazily: the same probabilities."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    models = mlserver_models(mlserver_python, lab.tmp / "models", http, grpc, metrics)
    res = lab.play([{"name": "start", "warmstart.snapshot.workload": {
        "name": "mls", "root": str(lab.workloads), "wait_ready": True, "chdir": str(models),
        "app_profile": {"name": "mlserver", "vars": {"port": http}},
        "command": [str(mlserver_python), str(mlserver_python.parent / "mlserver"), "start", str(models)]}}])
    try:
        before = infer(http)
        assert len(before) == 32 and res["start"]["workload"]["spec"]["app_profile"]["name"] == "mlserver"
        for lazy in (False, True):
            out = lab.play([lab.checkpoint("checkpoint", workload="mls", leave_running=False),
                            lab.restore("restore", name="mls", lazy=lazy, lazy_wait=True)])
            restored = out["restore"]["restore"]
            assert restored["app_profile"]["serving"] == f"HTTP GET http://127.0.0.1:{http}/v2/health/ready"
            assert infer(http) == before, f"the {'lazily ' if lazy else ''}restored MLServer answers differently"
    finally:
        lab.play([lab.stop("mls")])
