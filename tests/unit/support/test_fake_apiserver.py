"""The fake API server, driven by the real kubernetes client: the fixture the Kubernetes tests rely on is proven here."""
from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any, Dict

import pytest

kubernetes = pytest.importorskip("kubernetes")

import urllib3  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.support import fake_apiserver as fake_server_module  # noqa: E402
from tests.support.fake_apiserver import FakeApiServer  # noqa: E402

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

GROUP, VERSION = "example.warmstart.io", "v1"

WIDGET_CRD: Dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
        "versions": [{
            "name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 0},
                            "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                            "source": {"type": "object",
                                       "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                                                     "message": "source is immutable"}],
                                       "properties": {"pod": {"type": "string"}}},
                        },
                    },
                    "status": {"type": "object", "properties": {"phase": {"type": "string"},
                                                                "free": {"type": "object",
                                                                         "x-kubernetes-preserve-unknown-fields":
                                                                             True}}},
                },
            }},
        }],
    },
}
GADGET_CRD: Dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gadgets.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Cluster", "names": {"kind": "Gadget", "plural": "gadgets"},
             "versions": [{"name": VERSION, "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def _api(server: FakeApiServer) -> Any:
    return config.new_client_from_config(config_file=str(server.kubeconfig), context="fake", persist_config=False)


def _status(exc: ApiException) -> Dict[str, Any]:
    return json.loads(exc.body)


def _pod(name: str, labels: Dict[str, str] | None = None, **spec: Any) -> Dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": dict({"containers": [{"name": "main", "image": "busybox:1"}]}, **spec)}


@pytest.fixture
def core(fake_apiserver: FakeApiServer) -> Any:
    return client.CoreV1Api(_api(fake_apiserver))


@pytest.fixture
def crds(fake_apiserver: FakeApiServer) -> Any:
    """CustomObjectsApi with the Widget (namespaced, status) and Gadget (cluster) CRDs created."""
    api = _api(fake_apiserver)
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(WIDGET_CRD)
    ext.create_custom_resource_definition(GADGET_CRD)
    return client.CustomObjectsApi(api)


def _widget(name: str, size: int = 1, **extra: Any) -> Dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": name},
            "spec": dict({"size": size, "source": {"pod": "a"}}, **extra)}


# --- core pods ---------------------------------------------------------------------

def test_pod_create_get_assigns_identity_and_404_409(core: Any) -> None:
    created = core.create_namespaced_pod("default", _pod("web"))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    assert created.status.phase == "Pending"
    got = core.read_namespaced_pod("web", "default")
    assert got.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("nope", "default")
    assert missing.value.status == 404
    assert _status(missing.value)["message"] == 'pods "nope" not found'
    assert _status(missing.value)["reason"] == "NotFound" and _status(missing.value)["kind"] == "Status"
    with pytest.raises(ApiException) as dup:
        core.create_namespaced_pod("default", _pod("web"))
    assert dup.value.status == 409 and _status(dup.value)["reason"] == "AlreadyExists"
    assert _status(dup.value)["message"] == 'pods "web" already exists'


def test_pod_invalid_and_generate_name(core: Any) -> None:
    with pytest.raises(ApiException) as nameless:
        core.create_namespaced_pod("default", {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert nameless.value.status == 422 and "name or generateName is required" in _status(nameless.value)["message"]
    with pytest.raises(ApiException) as bad:
        core.create_namespaced_pod("default", _pod("Bad_Name"))
    assert bad.value.status == 422 and _status(bad.value)["reason"] == "Invalid"
    made = core.create_namespaced_pod("default", {"metadata": {"generateName": "restore-"},
                                                  "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert made.metadata.name.startswith("restore-") and len(made.metadata.name) == len("restore-") + 5


def test_list_label_and_field_selectors(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("a", labels={"app": "embed", "tier": "gpu"}, node="n1")
    fake_apiserver.add_pod("b", labels={"app": "embed"}, node="n2", phase="Pending")
    fake_apiserver.add_pod("c", labels={"app": "chat", "tier": "cpu"}, node="n1")
    fake_apiserver.add_pod("d", namespace="other", labels={"app": "embed"})

    def names(**kw: Any) -> list:
        return sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)

    assert names(label_selector="app=embed") == ["a", "b"]
    assert names(label_selector="app==embed,tier") == ["a"]
    assert names(label_selector="app!=embed") == ["c"]
    assert names(label_selector="tier in (gpu, cpu)") == ["a", "c"]
    assert names(label_selector="tier notin (gpu)") == ["b", "c"]
    assert names(label_selector="!tier") == ["b"]
    assert names(field_selector="spec.nodeName=n1") == ["a", "c"]
    assert names(field_selector="status.phase!=Running") == ["b"]
    assert names(field_selector="metadata.name=c", label_selector="app") == ["c"]
    assert sorted(p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector="app=embed").items) == \
        ["a", "b", "d"]
    with pytest.raises(ApiException) as bad:
        core.list_namespaced_pod("default", label_selector="app in (x")
    assert bad.value.status == 400


def test_patch_kinds_and_replace_conflict(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("p", labels={"a": "1"})
    merged = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"b": "2", "a": None}}},
                                       _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"b": "2"}
    jp = core.patch_namespaced_pod("p", "default", [{"op": "add", "path": "/metadata/annotations",
                                                     "value": {"x": "y"}}],
                                   _content_type="application/json-patch+json")
    assert jp.metadata.annotations == {"x": "y"}
    with pytest.raises(ApiException) as failed_test:
        core.patch_namespaced_pod("p", "default", [{"op": "test", "path": "/metadata/labels/b", "value": "9"}],
                                  _content_type="application/json-patch+json")
    assert failed_test.value.status == 422
    stale = core.read_namespaced_pod("p", "default")
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"c": "3"}}})  # someone else writes
    stale.metadata.labels = {"mine": "1"}
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_pod("p", "default", stale)
    assert conflict.value.status == 409 and _status(conflict.value)["reason"] == "Conflict"
    assert "the object has been modified" in _status(conflict.value)["message"]
    fresh = core.read_namespaced_pod("p", "default")
    fresh.metadata.labels = {"mine": "1"}
    assert core.replace_namespaced_pod("p", "default", fresh).metadata.labels == {"mine": "1"}


def test_strategic_merge_merges_conditions_by_type(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("p")
    core.patch_namespaced_pod_status("p", "default", {"status": {"conditions": [
        {"type": "Restored", "status": "True", "reason": "RestoreSucceeded"}]}})
    conditions = {c.type: c.status for c in core.read_namespaced_pod_status("p", "default").status.conditions}
    assert conditions == {"PodScheduled": "True", "Ready": "True", "Restored": "True"}


def test_status_subresource_semantics(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("p")
    before = core.read_namespaced_pod("p", "default")
    # the main resource ignores status; /status ignores everything else
    core.patch_namespaced_pod("p", "default", {"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "1"}}},
                              _content_type="application/merge-patch+json")
    after_main = core.read_namespaced_pod("p", "default")
    assert after_main.status.phase == "Running" and after_main.metadata.labels == {"x": "1"}
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"},
                                                      "metadata": {"labels": {"y": "2"}}},
                                     _content_type="application/merge-patch+json")
    after_status = core.read_namespaced_pod("p", "default")
    assert after_status.status.phase == "Succeeded" and after_status.metadata.labels == {"x": "1"}
    assert int(after_status.metadata.resource_version) > int(before.metadata.resource_version)
    assert after_status.metadata.generation == before.metadata.generation


def test_delete_with_finalizers_waits_for_them(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("p")
    core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["example.io/hold"]}},
                              _content_type="application/merge-patch+json")
    answer = core.delete_namespaced_pod("p", "default")
    assert answer.metadata.deletion_timestamp is not None
    held = core.read_namespaced_pod("p", "default")
    assert held.metadata.deletion_timestamp is not None and held.metadata.finalizers == ["example.io/hold"]
    with pytest.raises(ApiException) as late:
        core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["example.io/hold", "new"]}},
                                  _content_type="application/merge-patch+json")
    assert late.value.status == 422 and "no new finalizers" in _status(late.value)["message"]
    core.patch_namespaced_pod("p", "default", [{"op": "remove", "path": "/metadata/finalizers/0"}],
                              _content_type="application/json-patch+json")
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("p", "default")
    assert gone.value.status == 404
    assert fake_apiserver.store.get("pods", "p", "default") is None


def test_delete_precondition_uid(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("p")
    with pytest.raises(ApiException) as wrong:
        core.delete_namespaced_pod("p", "default", body={"preconditions": {"uid": "not-this-one"}})
    assert wrong.value.status == 409 and "Precondition failed" in _status(wrong.value)["message"]
    uid = core.read_namespaced_pod("p", "default").metadata.uid
    core.delete_namespaced_pod("p", "default", body={"preconditions": {"uid": uid}})
    assert fake_apiserver.store.get("pods", "p", "default") is None


# --- CRDs and custom objects ------------------------------------------------------------

def test_crd_serves_custom_objects_with_discovery(fake_apiserver: FakeApiServer, crds: Any) -> None:
    api = _api(fake_apiserver)
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(f"widgets.{GROUP}")
    assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    groups = [g.name for g in client.ApisApi(api).get_api_versions().groups]
    assert GROUP in groups and "apiextensions.k8s.io" in groups
    resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION)
    assert {r.name for r in resources.resources} == {"widgets", "widgets/status", "gadgets"}
    assert client.VersionApi(api).get_code().git_version.startswith("v1.")
    created = crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets", _widget("w1", junk=1))
    assert created["metadata"]["uid"] and created["spec"]["colour"] == "red"  # defaulted
    assert "junk" not in created["spec"]  # pruned
    gadget_body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": "g"},
                   "anything": {"goes": True}}
    gadget = crds.create_cluster_custom_object(GROUP, VERSION, "gadgets", gadget_body)
    assert "namespace" not in gadget["metadata"] and gadget["anything"] == {"goes": True}
    with pytest.raises(ApiException) as missing:
        crds.get_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "nope")
    assert _status(missing.value)["message"] == f'widgets.{GROUP} "nope" not found'


def test_crd_schema_rejects_wrong_types_and_enum(crds: Any) -> None:
    with pytest.raises(ApiException) as bad:
        crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets",
                                             _widget("w", size="big", colour="green"))
    message = _status(bad.value)["message"]
    assert bad.value.status == 422
    assert "spec.size" in message and "must be of type integer" in message and 'supported values: "red"' in message
    with pytest.raises(ApiException) as required:
        crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets",
                                             {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget",
                                              "metadata": {"name": "w"}, "spec": {}})
    assert "spec.size: Required value" in _status(required.value)["message"]


def test_immutable_rule_and_generation(crds: Any) -> None:
    w = crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets", _widget("w"))
    assert w["metadata"]["generation"] == 1
    bigger = crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", {"spec": {"size": 5}})
    assert bigger["metadata"]["generation"] == 2
    labelled = crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w",
                                                   {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as immutable:
        crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w",
                                            {"spec": {"source": {"pod": "b"}}})
    assert immutable.value.status == 422
    assert "spec.source: Invalid value" in _status(immutable.value)["message"]
    assert "source is immutable" in _status(immutable.value)["message"]


def test_custom_replace_needs_current_resource_version(crds: Any) -> None:
    w = crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets", _widget("w"))
    stale = dict(w, spec=dict(w["spec"], size=3))
    crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", {"spec": {"size": 2}})
    with pytest.raises(ApiException) as conflict:
        crds.replace_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", stale)
    assert conflict.value.status == 409
    unversioned = dict(stale)
    unversioned["metadata"] = {"name": "w"}
    with pytest.raises(ApiException) as no_rv:
        crds.replace_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", unversioned)
    assert no_rv.value.status == 422 and "must be specified for an update" in _status(no_rv.value)["message"]


def test_custom_status_subresource_and_strategic_merge_refused(crds: Any) -> None:
    crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets",
                                         dict(_widget("w"), status={"phase": "ignored-on-create"}))
    w = crds.get_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w")
    assert "status" not in w
    crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", {"status": {"phase": "main"}})
    assert "status" not in crds.get_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w")
    done = crds.patch_namespaced_custom_object_status(GROUP, VERSION, "default", "widgets", "w",
                                                      {"status": {"phase": "Done", "free": {"any": [1]}},
                                                       "spec": {"size": 99}})
    assert done["status"] == {"phase": "Done", "free": {"any": [1]}} and done["spec"]["size"] == 1
    with pytest.raises(ApiException) as smp:
        crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", {"spec": {"size": 2}},
                                            _content_type="application/strategic-merge-patch+json")
    assert smp.value.status == 415


def test_custom_finalizers_and_delete_status(crds: Any) -> None:
    crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets",
                                         dict(_widget("w"), metadata={"name": "w", "finalizers": ["hold"]}))
    pending = crds.delete_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w")
    assert pending["metadata"]["deletionTimestamp"]
    listed = crds.list_namespaced_custom_object(GROUP, VERSION, "default", "widgets")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w"] and listed["kind"] == "WidgetList"
    crds.patch_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "w", {"metadata": {"finalizers": None}})
    assert crds.list_namespaced_custom_object(GROUP, VERSION, "default", "widgets")["items"] == []
    crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets", _widget("x"))
    answer = crds.delete_namespaced_custom_object(GROUP, VERSION, "default", "widgets", "x")
    assert answer["kind"] == "Status" and answer["status"] == "Success"


def test_deleting_crd_removes_its_objects(fake_apiserver: FakeApiServer, crds: Any) -> None:
    crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets", _widget("w"))
    client.ApiextensionsV1Api(_api(fake_apiserver)).delete_custom_resource_definition(f"widgets.{GROUP}")
    with pytest.raises(ApiException) as unserved:
        crds.list_namespaced_custom_object(GROUP, VERSION, "default", "widgets")
    assert unserved.value.status == 404
    assert fake_apiserver.store.objects.get((GROUP, "widgets")) is None


def test_crd_name_must_match_plural_and_group(fake_apiserver: FakeApiServer) -> None:
    bad = json.loads(json.dumps(WIDGET_CRD))
    bad["metadata"]["name"] = "widgets.elsewhere.io"
    with pytest.raises(ApiException) as err:
        client.ApiextensionsV1Api(_api(fake_apiserver)).create_custom_resource_definition(bad)
    assert err.value.status == 422 and "must be spec.names.plural" in _status(err.value)["message"]


def test_the_collections_crds_pass_kubernetes_own_schema_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    import yaml  # pylint: disable=import-outside-toplevel

    with FakeApiServer() as server:
        server.install_crds()  # roles/k8s_crds/files/crds.yaml, checked as the real server checks an apply
        assert len(server.store.list("customresourcedefinitions", group="apiextensions.k8s.io")) == 5
    crds = yaml.safe_load(fake_server_module.CRDS.read_text())
    crds["items"][0]["spec"]["scop"] = "Namespaced"
    crds["items"][0]["spec"]["versions"][0]["served"] = "yes"
    broken = tmp_path / "crds.yaml"
    broken.write_text(yaml.safe_dump(crds))
    with FakeApiServer() as server, pytest.raises(ValueError) as refused:
        server.install_crds(broken)
    assert "podsnapshots.snapshot.warmstart.io" in str(refused.value) and "unknown field spec.scop" in str(refused.value)
    assert "spec.versions[0].served" in str(refused.value), refused.value


def test_bearer_token_is_required_when_configured(tmp_path: Path) -> None:
    with FakeApiServer(token="s3cret") as server:
        good = server.write_kubeconfig(tmp_path / "good")
        bad = server.write_kubeconfig(tmp_path / "bad", token="wrong")
        ok = client.CoreV1Api(config.new_client_from_config(config_file=str(good), persist_config=False))
        assert ok.list_namespaced_pod("default").items == []
        refused = client.CoreV1Api(config.new_client_from_config(config_file=str(bad), persist_config=False))
        with pytest.raises(ApiException) as denied:
            refused.list_namespaced_pod("default")
        assert denied.value.status == 401 and _status(denied.value)["reason"] == "Unauthorized"
        assert server.requests[-1]["path"] == "/api/v1/namespaces/default/pods"


def test_dry_run_stores_nothing_and_writes_are_recorded(fake_apiserver: FakeApiServer, core: Any) -> None:
    core.create_namespaced_pod("default", _pod("p"), dry_run="All")
    assert fake_apiserver.store.get("pods", "p", "default") is None
    core.list_namespaced_pod("default")
    assert [w["method"] for w in fake_apiserver.writes()] == ["POST"]
    assert fake_apiserver.writes()[0]["query"] == {"dryRun": "All"}


def test_builtin_workload_and_rbac_objects_are_stored_like_core_objects(fake_apiserver: FakeApiServer) -> None:
    """Secrets, DaemonSets and ClusterRoles round-trip through the real client; strategic merge works on them."""
    from kubernetes import dynamic  # the real client, as the modules use it

    config.load_kube_config(str(fake_apiserver.kubeconfig))
    dyn = dynamic.DynamicClient(client.ApiClient())
    secrets = dyn.resources.get(api_version="v1", kind="Secret")
    secrets.create(body={"metadata": {"name": "s3"}, "data": {"key": "dg=="}}, namespace="default")
    daemonsets = dyn.resources.get(api_version="apps/v1", kind="DaemonSet")
    daemonsets.create(body={"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}},
        "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [
            {"name": "agent", "image": "a"}]}}}}, namespace="default")
    daemonsets.patch(body={"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "b"}]}}}},
                     name="agent", namespace="default", content_type="application/strategic-merge-patch+json")
    roles = dyn.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="ClusterRole")
    roles.create(body={"metadata": {"name": "warmstart-agent"}, "rules": [{"apiGroups": [""], "resources": ["pods"],
                                                                           "verbs": ["get"]}]})
    assert fake_apiserver.store.get("secrets", "s3", "default")["data"] == {"key": "dg=="}
    assert fake_apiserver.store.get("daemonsets", "agent", "default")["spec"]["template"]["spec"]["containers"] == [
        {"name": "agent", "image": "b"}]
    assert fake_apiserver.store.get("clusterroles", "warmstart-agent")["rules"][0]["verbs"] == ["get"]


# --- watch ----------------------------------------------------------------------------

def _events(stream: Any, until: int) -> list:
    """(type, name, resourceVersion) of raw watch events, until ``until`` of them (then stop the watch)."""
    out = []
    for ev in stream:
        meta = ev["raw_object"].get("metadata") or {}
        out.append((ev["type"], meta.get("name"), meta.get("resourceVersion")))
        if len(out) >= until:
            break
    return out


def _soon(action: Any, delay: float = 0.2) -> threading.Thread:
    """Run ``action`` in a thread after ``delay`` seconds (while the test reads a stream)."""
    def run() -> None:
        time.sleep(delay)
        action()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_streams_every_write_after_the_list(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.add_pod("old")
    listed = core.list_namespaced_pod("default")
    rv = listed.metadata.resource_version

    def writes() -> None:
        core.create_namespaced_pod("default", _pod("web"))
        core.patch_namespaced_pod("web", "default", {"metadata": {"labels": {"v": "2"}}})
        core.patch_namespaced_pod_status("web", "default", {"status": {"phase": "Running"}})
        core.delete_namespaced_pod("web", "default")
        core.delete_namespaced_pod("old", "default")

    _soon(writes)
    seen = _events(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv,
                                        timeout_seconds=5), 5)
    assert [(t, n) for t, n, _rv in seen] == [("ADDED", "web"), ("MODIFIED", "web"), ("MODIFIED", "web"),
                                              ("DELETED", "web"), ("DELETED", "old")]
    rvs = [int(r) for _t, _n, r in seen]
    assert rvs == sorted(rvs) and len(set(rvs)) == 5 and rvs[0] > int(rv)  # a DELETED event has its own rv


def test_watch_without_resource_version_starts_with_the_current_objects(fake_apiserver: FakeApiServer,
                                                                        core: Any) -> None:
    fake_apiserver.add_pod("a")
    fake_apiserver.add_pod("b", namespace="other")
    seen = _events(watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=1), 10)
    assert sorted(n for t, n, _rv in seen if t == "ADDED") == ["a", "b"]
    only_default = _events(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1), 10)
    assert [n for _t, n, _rv in only_default] == ["a"]


def test_watch_applies_field_and_label_selectors_like_the_watch_cache(fake_apiserver: FakeApiServer,
                                                                      core: Any) -> None:
    """A pod bound to the node arrives as ADDED, one that stops matching leaves as DELETED."""
    rv = core.list_pod_for_all_namespaces().metadata.resource_version

    def writes() -> None:
        core.create_namespaced_pod("default", _pod("elsewhere", nodeName="n2"))
        core.create_namespaced_pod("default", _pod("pending", labels={"app": "embed"}))
        core.patch_namespaced_pod("pending", "default", {"spec": {"nodeName": "n1"}})
        core.patch_namespaced_pod("pending", "default", {"metadata": {"labels": {"app": "chat"}}})

    _soon(writes)
    seen = _events(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv,
                                        field_selector="spec.nodeName=n1", label_selector="app=embed",
                                        timeout_seconds=2), 2)
    assert [(t, n) for t, n, _rv in seen] == [("ADDED", "pending"), ("DELETED", "pending")]
    with pytest.raises(ApiException) as bad:
        _events(watch.Watch().stream(core.list_pod_for_all_namespaces, field_selector="spec.bogus=1",
                                     timeout_seconds=1), 1)
    assert bad.value.status == 400


def test_watch_sees_a_delete_held_by_finalizers_and_its_end(fake_apiserver: FakeApiServer, core: Any) -> None:
    core.create_namespaced_pod("default", dict(_pod("held"), metadata={"name": "held", "finalizers": ["x/y"]}))
    rv = core.list_namespaced_pod("default").metadata.resource_version

    def writes() -> None:
        core.delete_namespaced_pod("held", "default")
        core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})

    _soon(writes)
    seen = list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=2))
    assert [e["type"] for e in seen] == ["MODIFIED", "DELETED"]
    assert seen[0]["raw_object"]["metadata"]["deletionTimestamp"]
    assert not seen[1]["raw_object"]["metadata"].get("finalizers")


def test_watch_custom_objects(fake_apiserver: FakeApiServer, crds: Any) -> None:
    rv = crds.list_namespaced_custom_object(GROUP, VERSION, "default", "widgets")["metadata"]["resourceVersion"]

    def writes() -> None:
        crds.create_namespaced_custom_object(GROUP, VERSION, "default", "widgets", _widget("w1"))
        crds.patch_namespaced_custom_object_status(GROUP, VERSION, "default", "widgets", "w1",
                                                   {"status": {"phase": "Ready"}})

    _soon(writes)
    seen = list(watch.Watch().stream(crds.list_namespaced_custom_object, GROUP, VERSION, "default", "widgets",
                                     resource_version=rv, timeout_seconds=1))
    assert [e["type"] for e in seen] == ["ADDED", "MODIFIED"]
    assert seen[1]["object"]["status"] == {"phase": "Ready"}  # custom objects come as dicts


def test_bookmarks_carry_only_a_resource_version_and_advance_the_watch(tmp_path: Path) -> None:
    with FakeApiServer(bookmark_interval=0.1) as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        core = client.CoreV1Api(_api(server))
        rv = core.list_namespaced_pod("default").metadata.resource_version
        server.add_pod("other", namespace="elsewhere")  # bumps the resourceVersion, not this watch's objects
        w = watch.Watch()
        seen = []
        for ev in w.stream(core.list_namespaced_pod, "default", resource_version=rv, allow_watch_bookmarks=True,
                           timeout_seconds=1):
            seen.append(ev)
            if ev["type"] == "BOOKMARK":
                break
        assert seen[0]["type"] == "BOOKMARK"
        assert seen[0]["raw_object"] == {"kind": "Pod", "apiVersion": "v1",
                                         "metadata": {"resourceVersion": str(server.store.rv)}}
        assert w.resource_version == str(server.store.rv) != rv


def test_timeout_seconds_ends_the_stream_cleanly(fake_apiserver: FakeApiServer, core: Any) -> None:
    started = time.monotonic()
    assert list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version="1",
                                     timeout_seconds=1)) == []
    assert 0.9 <= time.monotonic() - started < 3


def test_resume_older_than_the_history_answers_410_gone(fake_apiserver: FakeApiServer, core: Any) -> None:
    rv = core.list_namespaced_pod("default").metadata.resource_version
    fake_apiserver.add_pod("a")
    fake_apiserver.compact()
    with pytest.raises(ApiException) as gone:
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1))
    assert gone.value.status == 410
    assert _status(gone.value)["reason"] == "Expired" and "too old resource version" in _status(gone.value)["message"]
    assert list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=str(fake_apiserver.store.rv),
                                     timeout_seconds=1)) == []  # from now on is fine


def test_history_is_bounded(tmp_path: Path) -> None:
    with FakeApiServer(history=3) as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        core = client.CoreV1Api(_api(server))
        rv = core.list_namespaced_pod("default").metadata.resource_version
        for i in range(3):
            server.add_pod(f"p{i}")
        assert len(list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv,
                                             timeout_seconds=1))) == 3
        server.add_pod("p3")
        with pytest.raises(ApiException) as gone:
            list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1))
        assert gone.value.status == 410


def test_compact_sends_an_error_410_in_the_middle_of_a_stream(fake_apiserver: FakeApiServer, core: Any) -> None:
    rv = core.list_namespaced_pod("default").metadata.resource_version

    def writes() -> None:
        fake_apiserver.add_pod("before")
        time.sleep(0.2)
        fake_apiserver.compact()

    _soon(writes)
    seen = []
    with pytest.raises(ApiException) as gone:
        for ev in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5):
            seen.append(ev["type"])
    assert seen == ["ADDED"]
    assert gone.value.status == 410 and "Expired" in gone.value.reason
    # and a resume from before the compaction is refused at the start, with the HTTP status itself
    assert _raw_status(fake_apiserver, f"/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}") == 410


def _raw_status(server: FakeApiServer, path: str) -> int:
    """The HTTP status of a GET read with http.client (the wire itself, no client library)."""
    conn = http.client.HTTPConnection(server.url[len("http://"):], timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_watch_is_a_chunked_stream_of_json_lines(fake_apiserver: FakeApiServer) -> None:
    fake_apiserver.add_pod("a")
    conn = http.client.HTTPConnection(fake_apiserver.url[len("http://"):], timeout=5)
    conn.request("GET", "/api/v1/pods?watch=1&timeoutSeconds=1")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
    body = resp.read().decode()  # http.client undoes the chunking and stops at the last chunk
    events = [json.loads(line) for line in body.splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]
    conn.close()


def test_drop_watches_cuts_the_connection_mid_stream(fake_apiserver: FakeApiServer, core: Any) -> None:
    rv = core.list_namespaced_pod("default").metadata.resource_version
    _soon(lambda: (fake_apiserver.wait_watches(1), fake_apiserver.add_pod("a"), time.sleep(0.2),
                   fake_apiserver.drop_watches()), delay=0)
    seen = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for ev in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5):
            seen.append(ev["type"])
    assert seen == ["ADDED"]
    assert fake_apiserver.open_watches() == []


def test_open_watches_lists_each_stream_and_its_position(fake_apiserver: FakeApiServer, core: Any) -> None:
    rv = core.list_namespaced_pod("default").metadata.resource_version
    reader = _soon(lambda: list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv,
                                                     field_selector="spec.nodeName=n1", timeout_seconds=1)), 0)
    opened = fake_apiserver.wait_watches(1, path="/api/v1/namespaces/default/pods")
    assert opened[0]["query"]["fieldSelector"] == "spec.nodeName=n1" and opened[0]["resource_version"] == rv
    reader.join(5)
    assert fake_apiserver.open_watches() == []


def test_answer_errors_403_names_the_verb_and_resource_then_heals(fake_apiserver: FakeApiServer, core: Any) -> None:
    fake_apiserver.answer_errors(403)
    with pytest.raises(ApiException) as listed:
        core.list_pod_for_all_namespaces()
    assert listed.value.status == 403 and _status(listed.value)["reason"] == "Forbidden"
    assert _status(listed.value)["message"] == ('pods is forbidden: User "system:serviceaccount:warmstart:agent" '
                                                'cannot list resource "pods" in API group "" at the cluster scope')
    with pytest.raises(ApiException) as watched:
        list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1))
    assert watched.value.status == 403 and "cannot watch resource" in _status(watched.value)["message"]
    fake_apiserver.heal()
    assert core.list_pod_for_all_namespaces().items == []
    fake_apiserver.answer_errors(503, seconds=0.2)
    with pytest.raises(ApiException) as unavailable:
        core.list_pod_for_all_namespaces()
    assert unavailable.value.status == 503
    time.sleep(0.3)
    assert core.list_pod_for_all_namespaces().items == []


def test_go_offline_refuses_connections_until_back_on_the_same_port(fake_apiserver: FakeApiServer,
                                                                    core: Any) -> None:
    url = fake_apiserver.url
    fake_apiserver.go_offline(seconds=0.5)
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        core.list_namespaced_pod("default", _request_timeout=2)
    time.sleep(0.8)
    assert fake_apiserver.url == url
    assert core.list_namespaced_pod("default", _request_timeout=2).items == []


# --- built-in objects against Kubernetes' own schemas ----------------------------------


POD_WITH_UNKNOWN = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                    "spec": {"containers": [{"name": "main", "image": "i", "imagePullPolice": "Always"}],
                             "restartPolicyy": "Never"}}


def test_unknown_fields_are_refused_when_strict_and_dropped_with_a_warning_otherwise(
        fake_apiserver: FakeApiServer) -> None:
    code, _headers, answer = fake_apiserver.request("POST", "/api/v1/namespaces/default/pods", POD_WITH_UNKNOWN,
                                                    "?fieldValidation=Strict")
    assert code == 400 and answer["reason"] == "BadRequest", answer
    assert 'unknown field "spec.containers[0].imagePullPolice"' in answer["message"]
    assert 'unknown field "spec.restartPolicyy"' in answer["message"]
    assert fake_apiserver.store.get("pods", "p", "default") is None
    code, headers, answer = fake_apiserver.request("POST", "/api/v1/namespaces/default/pods", POD_WITH_UNKNOWN)
    assert code == 201 and "restartPolicyy" not in answer["spec"]
    assert answer["spec"]["containers"] == [{"name": "main", "image": "i"}]
    assert sorted(headers.get_all("Warning")) == ['299 - "unknown field \\"spec.containers[0].imagePullPolice\\""',
                                                  '299 - "unknown field \\"spec.restartPolicyy\\""']
    code, headers, _answer = fake_apiserver.request("POST", "/api/v1/namespaces/default/configmaps",
                                                    {"metadata": {"name": "c"}, "data": {"a": "b"}, "dta": {}},
                                                    "?fieldValidation=Ignore")
    assert code == 201 and headers.get_all("Warning") is None
    assert "dta" not in fake_apiserver.store.get("configmaps", "c", "default")


def test_every_schema_violation_of_a_builtin_object_is_named_at_once(fake_apiserver: FakeApiServer) -> None:
    bad = {"metadata": {"name": "agent"}, "spec": {"template": {"spec": {"containers": [
        {"image": 5}, {"name": "b", "image": "i", "ports": [{"containerPort": "eighty"}]}]}}}}
    code, _headers, answer = fake_apiserver.request("POST", "/apis/apps/v1/namespaces/default/daemonsets", bad)
    assert code == 422 and answer["reason"] == "Invalid"
    fields = sorted(c["field"] for c in answer["details"]["causes"])
    assert fields == ["spec.selector", "spec.template.spec.containers[0].image",
                      "spec.template.spec.containers[0].name",
                      "spec.template.spec.containers[1].ports[0].containerPort"], answer
    assert fake_apiserver.store.get("daemonsets", "agent", "default") is None
