"""The node agent end to end: the real ``ansible-rulebook`` runs extensions/eda/rulebooks/node_agent.yml, whose
event source (``warmstart.snapshot.k8s_events``) watches a fake API server with the real ``kubernetes`` client,
and whose rules run the agent playbooks - real CRIU checkpoints and restores of real podman containers.

A fake kubelet (tests/integration/k8s_lab.py) starts a placeholder container for every restore pod that appears;
a fake ReplicaSet controller here creates pods from a Deployment's restore template when the test scales it.
Nobody runs ``ansible-playbook`` by hand: everything after a test writes to the API server is the agent's doing.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import yaml

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _admission as admission
from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _agent as agent
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podcontract as pc

from tests.support.fake_apiserver import FakeApiServer
from tests.support.tls_certs import Pki

from .ansible_run import REPO, VENV_BIN, playbook, prep_vars
from .process_lab import free_port, port_open
from .s3_lab import SECRET, Gate, serve
from .k8s_lab import CACHE, COMMAND, NS, POD_LABELS, Kubelet, PodmanNode, emptydir, source_pod, template

pytestmark = pytest.mark.integration

NODE = "localhost"  # the fake kubelet's node, and the agent's NODE_NAME


class Agent:
    """``ansible-rulebook`` running the node agent, in its own process group, logging to a file."""

    def __init__(self, tmp: Path, env: Dict[str, str], kubeconfig: Path, metrics: Path, port: int) -> None:
        self.tmp, self.env, self.port = tmp, env, port
        self.log = tmp / "agent.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"),
            "warmstart_become": False}}}}))
        (tmp / "vars.yml").write_text(yaml.safe_dump({
            "warmstart_k8s_auth": {"kubeconfig": str(kubeconfig)}, "warmstart_namespaces": [NS],
            "warmstart_agent_fallback": "none", "warmstart_resync_seconds": 5, "warmstart_retention_seconds": 3,
            "warmstart_metrics_dir": str(metrics),
            "warmstart_metrics_port": port, "warmstart_capture_attempts": 2}))

    def start(self) -> "Agent":
        env = dict(self.env, NODE_NAME=NODE, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                   PATH=f"{VENV_BIN}:{self.env.get('PATH', os.environ.get('PATH', ''))}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with  # stopped by stop()/kill()
                [str(VENV_BIN / "ansible-rulebook"), "--rulebook", "warmstart.snapshot.node_agent",
                 "-i", str(self.tmp / "inventory.yml"), "--vars", str(self.tmp / "vars.yml"), "--env-vars",
                 "NODE_NAME", "-v"], cwd=self.tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL the whole agent: the rulebook engine, its running playbook and module."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())


def wait_for(what: str, check: Callable[[], Any], timeout: float, agent_: Optional[Agent] = None) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            tail = agent_.output()[-6000:] if agent_ else ""
            raise AssertionError(f"{what}: not within {timeout} s\n--- agent log ---\n{tail}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """A fake cluster with one node (podman), the CRDs, a running source pod, and the agent running."""
    tmp = tmp_path_factory.mktemp("agent")
    # the agent's modules need pycriu and the kubernetes client in one interpreter: prepare this one (the venv's),
    # as an agent image is prepared
    prep = playbook("warmstart.snapshot.prepare_nodes", "-e",
                    json.dumps({**prep_vars(), "ansible_python_interpreter": str(VENV_BIN / "python")}))
    assert prep.rc == 0, prep.stdout[-4000:] + prep.stderr[-2000:]
    lab = PodmanNode(tmp)
    api = FakeApiServer(token="agent-token").start()
    api.store.put("namespaces", {"metadata": {"name": NS}, "status": {"phase": "Active"}}, group="")
    api.install_crds()
    kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
    kubelet = Kubelet(api, lab, node=NODE)
    kubelet.start()
    c: Dict[str, Any] = {"tmp": tmp, "lab": lab, "api": api, "kubelet": kubelet, "kubeconfig": kubeconfig}
    src = source_pod(c, "embed-0", node=NODE)
    (emptydir(lab, "embed-0", CACHE[0]) / "compiled.bin").write_bytes(b"kernels compiled at start-up\n")
    api.store.put("podsnapshotpolicies", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "embed-store", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "embed-none"}}, "storeUrl": str(lab.store),
                 "triggerConfig": {"type": "manual", "postCheckpoint": "resume"}}}, group=podapi.GROUP)
    metrics = tmp / "metrics"
    run = Agent(tmp, lab.env, kubeconfig, metrics, free_port()).start()
    c.update(src=src, agent=run, metrics=metrics, before=lab.ask(src), resync=5)
    try:
        yield c
    finally:
        run.kill()
        kubelet.stop.set()
        kubelet.join(5)
        api.stop()
        lab.cleanup()


def request(c: Dict[str, Any], name: str, policy: str = "embed-store") -> None:
    """A user asks for a snapshot of the source pod: a PodSnapshot with no content (through the policy's store)."""
    k8s.cluster_from({"kubeconfig": str(c["kubeconfig"])}).create(podapi.KIND_SNAPSHOT, {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_SNAPSHOT, "metadata": {"name": name, "namespace": NS},
        "spec": {"source": {"podRef": {"name": "embed-0"}, "containers": ["main"]}, "policyName": policy}}, NS)


def snapshot(c: Dict[str, Any], name: str) -> Dict[str, Any]:
    return c["api"].store.get("podsnapshots", name, NS, group=podapi.GROUP) or {}


def ready_snapshot(c: Dict[str, Any], name: str, policy: str = "embed-store") -> Dict[str, Any]:
    request(c, name, policy)
    return dict(wait_for(f"PodSnapshot {name} Ready", lambda: podapi.is_ready(snapshot(c, name)) and snapshot(c, name),
                         240, c["agent"]))


def replica(c: Dict[str, Any], name: str, snap: str, annotations: Optional[Dict[str, str]] = None,
            standby: bool = False) -> None:
    """What a ReplicaSet controller does for a Deployment whose template is a restore template: a pod from it."""
    built = podbuild.build(template(c["lab"].image), snap, entrypoint="standby" if standby else "inert")
    meta = dict(built["metadata"], name=name, namespace=NS, labels=dict(POD_LABELS, role="replica"),
                ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "embed-rs",
                                  "uid": "0000-rs", "controller": True}])
    meta["annotations"] = dict(meta.get("annotations") or {}, **(annotations or {}))
    c["api"].store.put("pods", {"metadata": meta, "spec": dict(built["spec"], nodeName=NODE),
                                "status": {"phase": "Pending"}}, group="")


def restored_condition(c: Dict[str, Any], name: str) -> Dict[str, Any]:
    pod = c["api"].store.get("pods", name, NS, group="") or {}
    return podapi.get_condition(pod, podapi.RESTORE_CONDITION) or {}


def final(c: Dict[str, Any], name: str, timeout: float = 240) -> Dict[str, Any]:
    """The pod's Restored condition once it is final (not RestoreInProgress)."""
    return dict(wait_for(f"pod {name} restored", lambda: (restored_condition(c, name).get("reason") not in
                                                          (None, podapi.REASON_IN_PROGRESS)) and restored_condition(c, name),
                         timeout, c["agent"]))


def test_a_podsnapshot_request_becomes_ready(world: Dict[str, Any]) -> None:
    snap = ready_snapshot(world, "embed-warm")
    content = world["api"].store.get("podsnapshotcontents", snap["status"]["boundSnapshotContentName"],
                                     group=podapi.GROUP)
    sid = content["spec"]["store"]["snapshotId"]
    assert (world["lab"].store / "snapshots" / sid / "manifest.json").is_file()
    assert content["spec"]["snapshotRef"]["uid"] == snap["metadata"]["uid"]
    after = world["lab"].ask(world["src"])
    assert after["token"] == world["before"]["token"] and after["counter"] > world["before"]["counter"], \
        "the source keeps serving"


def warm(world: Dict[str, Any]) -> None:
    """The Ready snapshot the replicas restore from (asked for once; any test may be the first)."""
    if not podapi.is_ready(snapshot(world, "embed-warm")):
        ready_snapshot(world, "embed-warm")


def test_scaling_the_deployment_restores_every_new_replica_once(world: Dict[str, Any]) -> None:
    warm(world)
    latencies: List[float] = []
    for count in (1, 3):  # scaled from 1 to 3 replicas
        names = [f"embed-d-{i}" for i in range(count)]
        for name in names:
            if world["api"].store.get("pods", name, NS, group="") is None:
                replica(world, name, "embed-warm")
        for name in names:
            cond = final(world, name)
            assert (cond["status"], cond["reason"]) == ("True", podapi.REASON_SUCCEEDED), cond
    kubelet: Kubelet = world["kubelet"]
    for name in [f"embed-d-{i}" for i in range(3)]:
        pod = world["api"].store.get("pods", name, NS, group="")
        assert podapi.FINALIZER not in (pod["metadata"].get("finalizers") or [])
        # the source's emptyDir went along: each replica's own volume holds what the source had written there
        cache = world["lab"].tmp / f"emptydir-{name}-{CACHE[0]}" / "compiled.bin"
        assert cache.read_bytes() == b"kernels compiled at start-up\n", name
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet", "owner references stay"
        answer = world["lab"].ask(kubelet.started[name])
        assert answer["token"] == world["before"]["token"] and answer["sha256"] == answer["digest"], answer
        assert len(answer["restores"]) == 1, f"{name} was restored {len(answer['restores'])} times"
        # the workers' loopback connections to the server came back open and carry a round in the replica
        assert answer["loop"]["broken"] == 0 and answer["loop"]["rounds"] >= 2, answer["loop"]
        complete = world["lab"].control(f"k8s-{name}") / "restore-complete"
        latencies.append(complete.stat().st_mtime - kubelet.running_at[name])
    world["latencies"] = latencies
    print(f"placeholder Running -> restore-complete: {', '.join(f'{s:.2f} s' for s in latencies)}")
    # a bound that catches a restore that hangs, not a performance claim (bench/ measures; a loaded 2-core CI runs
    # three restores of a 3-process tree at once here)
    assert all(0 < s < 300 for s in latencies), latencies


@pytest.fixture()
def admission_webhook(world: Dict[str, Any]) -> Iterator[str]:
    """The agent's admission webhook as the k8s_agent role runs it (its own process, TLS), registered with the
    fake API server as a MutatingWebhookConfiguration: every pod created through the API goes through it."""
    pki = Pki(world["tmp"] / "admission-pki")
    ca = pki.ca("ca")
    cert, key = pki.issue("admission", "ca", ips=["127.0.0.1"], server=True)
    port = free_port()
    log = world["tmp"] / "admission.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with  # stopped below
            [str(VENV_BIN / "python"), "-m", "ansible_collections.warmstart.snapshot.plugins.module_utils.agent."
             "_admission_server", "--host", "127.0.0.1", "--port", str(port), "--cert", str(cert), "--key", str(key),
             "--kubeconfig", str(world["kubeconfig"])],
            env=dict(os.environ, PYTHONPATH=str(REPO / ".collections")), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("the admission webhook listens", lambda: port_open(port), 60)
        world["api"].store.put("mutatingwebhookconfigurations", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "warmstart-node-agent"},
            "webhooks": [{"name": "pods.admission.snapshot.warmstart.io", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Ignore", "timeoutSeconds": 5,
                          "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate-pods",
                                           "caBundle": base64.b64encode(ca.read_bytes()).decode()},
                          "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                     "resources": ["pods"], "scope": "Namespaced"}]}]},
            group="admissionregistration.k8s.io")
        yield str(log)
    finally:
        world["api"].store.remove("mutatingwebhookconfigurations", "warmstart-node-agent",
                                  group="admissionregistration.k8s.io")
        proc.terminate()
        proc.wait(10)


def scaled_replica(world: Dict[str, Any], image: Optional[str] = None) -> str:
    """What a ReplicaSet controller does when an HPA scales a plain Deployment up: a pod from its template,
    created through the API (admission runs), named by generateName; its name."""
    spec = template(image or world["lab"].image)["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "embed-web-", "labels": dict(POD_LABELS, tier="web"),
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "embed-web",
                                             "uid": "0000-web", "controller": True}]},
           "spec": spec}
    created = k8s.cluster_from({"kubeconfig": str(world["kubeconfig"])}).create("Pod", pod, NS)
    return str(created["metadata"]["name"])


def test_an_auto_restore_policy_restores_a_plain_deployments_new_replicas(world: Dict[str, Any],
                                                                          admission_webhook: str) -> None:
    """restoreConfig.mode auto: the pods of a Deployment without any warmstart annotation, scaled up by an HPA,
    become restore pods when they are created, and the agent restores each once."""
    warm(world)
    world["api"].store.put("podsnapshotpolicies", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "embed-web", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "embed", "tier": "web"}}, "storeUrl": str(world["lab"].store),
                 "triggerConfig": {"type": "manual"}, "restoreConfig": {"mode": "auto"}}}, group=podapi.GROUP)
    # a replica of another spec (a new image rolling out) has no snapshot yet: it starts as it is, and says why
    other = scaled_replica(world, image="embed:next")
    pod = world["api"].store.get("pods", other, NS, group="")
    assert "no Ready PodSnapshot fits it yet" in pod["metadata"]["annotations"][admission.ANN_AUTO_RESTORE]
    assert pod["spec"]["containers"][0]["command"] == list(COMMAND), "started as it is"
    names = [scaled_replica(world), scaled_replica(world)]  # the HPA scales to 2
    for name in names:
        pod = world["api"].store.get("pods", name, NS, group="")
        assert pc.restore_mode(pod)["policy"] == "embed-web", pod["metadata"]
        cond = final(world, name)
        assert (cond["status"], cond["reason"]) == ("True", podapi.REASON_SUCCEEDED), cond
    for name in names:
        answer = world["lab"].ask(world["kubelet"].started[name])
        assert answer["token"] == world["before"]["token"] and len(answer["restores"]) == 1, answer
        pinned = world["api"].store.get("pods", name, NS, group="")["metadata"]["annotations"]
        assert podapi.is_ready(snapshot(world, pinned[podapi.ANN_RESTORE_FROM])), "pinned to a Ready snapshot"
    assert "restore pod (policy embed-web)" in Path(admission_webhook).read_text()
    assert other not in world["kubelet"].started


def test_the_agent_killed_during_a_restore_never_restores_twice(world: Dict[str, Any]) -> None:
    run: Agent = world["agent"]
    warm(world)
    replica(world, "embed-k-0", "embed-warm")
    claimed = wait_for("the agent claims embed-k-0", lambda: agent.ANN_ATTEMPT in (
        (world["api"].store.get("pods", "embed-k-0", NS, group="") or {}).get("metadata", {}).get("annotations")
        or {}), 240, run)
    assert claimed
    run.kill()
    run.start()
    cond = final(world, "embed-k-0")
    full = world["kubelet"].started["embed-k-0"]
    if cond["reason"] == podapi.REASON_SUCCEEDED:
        answer = world["lab"].ask(full)
        assert len(answer["restores"]) == 1 and answer["token"] == world["before"]["token"]
    else:  # killed before the restore could be confirmed: one attempt, spent; the placeholder is killed
        assert cond["reason"] == podapi.REASON_FAILED and "not replayed" in cond["message"], cond
        assert not world["lab"].lab.running(full)
    assert run.output().count("embed-k-0: restored") <= 1, "the restore ran at most once"


def test_a_pod_whose_snapshot_appears_later_is_restored_when_it_appears(world: Dict[str, Any]) -> None:
    replica(world, "embed-l-0", "embed-later")
    waiting = wait_for("embed-l-0 waits", lambda: _waiting(world, "embed-l-0"), 120, world["agent"])
    assert "PodSnapshot ml/embed-later does not exist yet" in waiting
    ready_snapshot(world, "embed-later")
    cond = final(world, "embed-l-0")
    assert (cond["status"], cond["reason"]) == ("True", podapi.REASON_SUCCEEDED), cond


def test_a_store_down_for_a_while_costs_a_retry_not_the_attempt(world: Dict[str, Any]) -> None:
    """A snapshot in S3 (moto on loopback, credentials from a Secret through a PodSnapshotStorageConfig) behind a
    gate: the gate shut, the agent's restore of a new replica stops on the unreachable store before anything is
    touched, gives the pod's attempt back (restore-retry annotation, Restored waiting with the cause); opened
    again, the next try restores it - once."""
    import boto3  # pylint: disable=import-outside-toplevel  # only this test speaks S3 itself
    api, run = world["api"], world["agent"]
    moto_port = free_port()
    moto = serve(moto_port)
    gate = Gate(moto_port)
    try:
        bucket = "ws-agent-flaky"
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}", region_name="us-east-1",
                     aws_access_key_id="warmstart-test", aws_secret_access_key=SECRET).create_bucket(Bucket=bucket)
        api.store.put("secrets", {"metadata": {"name": "s3", "namespace": NS}, "data": {
            "AWS_ACCESS_KEY_ID": base64.b64encode(b"warmstart-test").decode(),
            "AWS_SECRET_ACCESS_KEY": base64.b64encode(SECRET.encode()).decode()}}, group="")
        api.store.put("podsnapshotstorageconfigs", {"metadata": {"name": "flaky-s3"}, "spec": {
            "storeUrl": f"s3://{bucket}/fleet", "credentialsSecretRef": {"name": "s3", "namespace": NS},
            "options": {"endpointUrl": gate.url, "region": "us-east-1",
                        "cacheDir": str(world["tmp"] / "s3-cache")}}}, group=podapi.GROUP)
        api.store.put("podsnapshotpolicies", {
            "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY,
            "metadata": {"name": "embed-s3", "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": "embed-none"}}, "storageConfigName": "flaky-s3",
                     "triggerConfig": {"type": "manual", "postCheckpoint": "resume"}}}, group=podapi.GROUP)
        ready_snapshot(world, "embed-s3", policy="embed-s3")
        gate.shut()
        replica(world, "embed-f-0", "embed-s3")
        retry = wait_for("the attempt given back", lambda: (
            (api.store.get("pods", "embed-f-0", NS, group="") or {}).get("metadata", {}).get("annotations")
            or {}).get(agent.ANN_RETRY), 240, run)
        assert retry.startswith("1 "), retry
        waiting = wait_for("embed-f-0 waits for its retry", lambda: _waiting(world, "embed-f-0"), 60, run)
        assert "the store failed before anything was touched" in waiting and "try 1 of" in waiting, waiting
        assert not (world["lab"].control("k8s-embed-f-0") / "restore-complete").exists(), "nothing restored yet"
        gate.open()
        cond = final(world, "embed-f-0", timeout=300)
        assert (cond["status"], cond["reason"]) == ("True", podapi.REASON_SUCCEEDED), cond
        answer = world["lab"].ask(world["kubelet"].started["embed-f-0"])
        assert answer["token"] == world["before"]["token"] and len(answer["restores"]) == 1, answer
        assert SECRET not in run.output()
    finally:
        gate.shut()
        moto.kill()
        moto.wait()


def _waiting(world: Dict[str, Any], name: str) -> Optional[str]:
    message = str(restored_condition(world, name).get("message", ""))
    return message if message.startswith(agent.WAITING) else None


def test_a_corrupt_snapshot_with_fallback_starts_the_pod_cold(world: Dict[str, Any]) -> None:
    snap = ready_snapshot(world, "embed-bad")
    content = world["api"].store.get("podsnapshotcontents", snap["status"]["boundSnapshotContentName"],
                                     group=podapi.GROUP)
    images = world["lab"].store / "snapshots" / content["spec"]["store"]["snapshotId"]
    pages = max(images.rglob("pages-*.img"), key=lambda p: p.stat().st_size)
    with open(pages, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\xff" * 64)
    replica(world, "embed-c-0", "embed-bad", annotations={agent.ANN_FALLBACK: agent.FALLBACK_COLD_START},
            standby=True)
    cond = final(world, "embed-c-0")
    assert cond["reason"] in (podapi.REASON_FAILED, podapi.REASON_INCOMPATIBLE) and "started cold" in cond["message"], cond
    full = world["kubelet"].started["embed-c-0"]
    answer = wait_for("the standby app starts cold and serves", lambda: _try_ask(world, full), 120, world["agent"])
    assert answer["token"] != world["before"]["token"], "a cold start: its own state, not the snapshot's"
    assert answer["restores"] == []


def _try_ask(world: Dict[str, Any], full: str) -> Optional[Dict[str, Any]]:
    try:
        return dict(world["lab"].ask(full))
    except (OSError, ValueError, AssertionError):
        return None


def test_the_metrics_endpoint_reports_what_happened(world: Dict[str, Any]) -> None:
    text = wait_for("metrics", lambda: _metrics(world), 30, world["agent"])
    assert 'warmstart_restores_total{outcome="succeeded"}' in text, text
    assert 'warmstart_captures_total{outcome="succeeded"}' in text, text
    count = [line for line in text.splitlines() if line.startswith("warmstart_restore_ready_seconds_count")]
    assert count and float(count[0].split()[-1]) >= 1, text


def _metrics(world: Dict[str, Any]) -> Optional[str]:
    try:
        return str(world["agent"].metrics())
    except OSError:
        return None


def test_a_manual_trigger_captures_and_says_so(world: Dict[str, Any]) -> None:
    cluster = k8s.cluster_from({"kubeconfig": str(world["kubeconfig"])})
    cluster.create(podapi.KIND_TRIGGER, {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_TRIGGER,
                                         "metadata": {"name": "embed-now", "namespace": NS},
                                         "spec": {"targetPod": "embed-0", "policyName": "embed-store"}}, NS)

    def triggered() -> Optional[Dict[str, Any]]:
        trig = world["api"].store.get("podsnapshotmanualtriggers", "embed-now", NS, group=podapi.GROUP) or {}
        cond = podapi.get_condition(trig, podapi.TRIGGERED_CONDITION)
        return trig if cond else None

    trig = wait_for("the trigger is Triggered", triggered, 240, world["agent"])
    cond = podapi.get_condition(trig, podapi.TRIGGERED_CONDITION)
    assert (cond["status"], cond["reason"]) == ("True", "Complete"), cond
    created = trig["status"]["snapshotCreated"]["name"]
    assert podapi.is_ready(snapshot(world, created))


def test_a_workload_policy_captures_its_source_once_it_is_ready(world: Dict[str, Any]) -> None:
    """The source's app wrote ready-for-snapshot long ago; a policy that selects it makes the agent ask and capture."""
    world["api"].store.put("podsnapshotpolicies", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "embed-auto", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "embed", "role": "source"}}, "storeUrl": str(world["lab"].store),
                 "triggerConfig": {"type": "workload", "postCheckpoint": "resume"}}}, group=podapi.GROUP)

    def captured() -> List[Dict[str, Any]]:
        return [s for s in world["api"].store.list("podsnapshots", NS, group=podapi.GROUP)
                if s["spec"].get("policyName") == "embed-auto" and podapi.is_ready(s)]

    (snap,) = wait_for("the policy's PodSnapshot Ready", captured, 240, world["agent"])
    assert snap["spec"]["source"]["podRef"]["name"] == "embed-0"
    time.sleep(world["resync"] * 2)
    assert len([s for s in world["api"].store.list("podsnapshots", NS, group=podapi.GROUP)
                if s["spec"].get("policyName") == "embed-auto"]) == 1, "one request per pod incarnation"


def test_the_agent_keeps_a_policys_group_limit_as_snapshots_come(world: Dict[str, Any]) -> None:
    """A policy keeps 1 snapshot per group: once a newer one is Ready, the agent's retention removes the older one,
    its record and its store snapshot, on its own (no playbook run by anyone). Until then no policy's retention
    could remove anything, so the agent's retention timer made no event and ran no playbook."""
    assert "agent_retention" not in world["agent"].output(), "a retention run while no retention was due"
    world["api"].store.put("podsnapshotpolicies", {
        "apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY, "metadata": {"name": "embed-keep1", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "embed-none"}}, "storeUrl": str(world["lab"].store),
                 "triggerConfig": {"type": "manual", "postCheckpoint": "resume"},
                 "snapshotGroupingRules": {"groupRetentionPolicy": {"maxSnapshotCountPerGroup": 1}}}},
        group=podapi.GROUP)
    cluster = k8s.cluster_from({"kubeconfig": str(world["kubeconfig"])})

    def store_id(name: str) -> str:
        snap = snapshot(world, name)
        content = cluster.get(podapi.KIND_CONTENT, snap["status"]["boundSnapshotContentName"])
        return str(content["spec"]["store"]["snapshotId"])

    ready_snapshot(world, "keep-old", "embed-keep1")
    old = store_id("keep-old")
    ready_snapshot(world, "keep-new", "embed-keep1")
    new = store_id("keep-new")
    wait_for("the older snapshot removed by retention", lambda: not snapshot(world, "keep-old"), 120, world["agent"])
    # the record first, then the store snapshot, in the same run
    wait_for("its store snapshot removed", lambda: not (world["lab"].store / "snapshots" / old).exists(), 30,
             world["agent"])
    assert (world["lab"].store / "snapshots" / new).exists() and podapi.is_ready(snapshot(world, "keep-new"))
    # by the agent's retention run (its timer makes the event only now that retention is due); the playbook's
    # output reaches the log when the run ends
    wait_for("the agent_retention run in the agent's log", lambda: "agent_retention" in world["agent"].output(), 60,
             world["agent"])
