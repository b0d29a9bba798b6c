"""Pods, pod templates, PodSnapshots and PodSnapshotContents as plain dicts, for the unit tests of the pod contract."""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podbuild as podbuild
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _spechash as spechash


def template() -> Dict[str, Any]:
    """A Deployment's spec.template with every kind of hashed field in use."""
    return {
        "metadata": {"labels": {"app": "embed", "model": "minilm"}},
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox:1.36", "command": ["sh", "-c", "cp /w /data"],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "containers": [
                {"name": "main", "image": "embed:1.4", "command": ["python3", "/app/server.py"], "args": ["--port", "8080"],
                 "ports": [{"containerPort": 8080, "name": "http"}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/embed"}],
                 "env": [{"name": "MODEL", "value": "minilm"}],
                 "resources": {"limits": {"cpu": "2", "memory": "2Gi"}},
                 "readinessProbe": {"httpGet": {"path": "/health", "port": 8080}}},
                {"name": "sidecar", "image": "proxy:2", "ports": [{"containerPort": 9090}]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}},
                        {"name": "config", "configMap": {"name": "embed-config"}}],
        },
    }


def deployment() -> Dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "embed", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "embed"}}, "template": template()}}


def pod(name: str = "embed-0") -> Dict[str, Any]:
    doc = template()
    doc["apiVersion"] = "v1"
    doc["kind"] = "Pod"
    doc["metadata"].update({"name": name, "namespace": "default"})
    return doc


def read_back(obj: Dict[str, Any]) -> Dict[str, Any]:
    """The pod as the API returns it once created from ``obj``: defaults, injected token volume, status."""
    out = copy.deepcopy(obj)
    out.setdefault("apiVersion", "v1")
    out.setdefault("kind", "Pod")
    meta = out["metadata"]
    meta.update({"name": "embed-7d9c-x2x4q", "namespace": "default", "uid": "0a1b", "resourceVersion": "812",
                 "creationTimestamp": "2026-01-10T10:00:00Z"})
    meta["labels"]["pod-template-hash"] = "7d9c"
    spec = out["spec"]
    spec.update({"dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                 "securityContext": dict(spec.get("securityContext") or {}), "serviceAccountName": "default",
                 "serviceAccount": "default", "terminationGracePeriodSeconds": 30, "enableServiceLinks": True,
                 "nodeName": "node-a", "priority": 0, "preemptionPolicy": "PreemptLowerPriority",
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}]})
    token = {"name": "kube-api-access-5x7kq", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["defaultMode"] = 420
    spec["volumes"] = spec.get("volumes", []) + [token]
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind, []):
            container.update({"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                              "imagePullPolicy": "IfNotPresent"})
            container.setdefault("resources", {})
            for port in container.get("ports", []):
                port.setdefault("protocol", "TCP")
            container["volumeMounts"] = container.get("volumeMounts", []) + [
                {"name": token["name"], "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    out["status"] = {"phase": "Running", "podIP": "10.0.0.7", "hostIP": "192.168.1.2"}
    return out


def restore_pod(**kwargs: Any) -> Dict[str, Any]:
    return podbuild.build(pod(), "embed-abc", **kwargs)


def snapshot(name: str, created: str, source: Optional[Dict[str, Any]] = None, ready: bool = True,
             labels: Optional[Dict[str, str]] = None, scope: Optional[str] = None, uid: str = "u-1") -> Dict[str, Any]:
    spec: Dict[str, Any] = {"source": {"podRef": {"name": "embed-0"}}}
    if scope:
        spec["scope"] = scope
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "reason": "Published" if ready else "Uploading",
                   "message": "" if ready else "copying pages", "lastTransitionTime": created}]
    return {"apiVersion": podapi.API_VERSION, "kind": "PodSnapshot",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "labels": labels or {"model": "minilm"},
                         "creationTimestamp": created},
            "spec": spec,
            "status": {"boundSnapshotContentName": "content-" + name, "podSpecHash": spechash.pod_spec_hash(source or template()),
                       "createdAt": created, "conditions": conditions}}


def contents_for(*pairs: Any) -> Dict[str, Dict[str, Any]]:
    return {"content-" + name: {"metadata": {"name": "content-" + name}, "status": {"podSpecFields": spechash.pod_spec_fields(src)}}
            for name, src in pairs}


def changed_template(**container: Any) -> Dict[str, Any]:
    doc = template()
    doc["spec"]["containers"][0].update(container)
    return doc


def content(snap: Dict[str, Any], **ref: str) -> Dict[str, Any]:
    backlink = {"namespace": "default", "name": snap["metadata"]["name"], "uid": snap["metadata"]["uid"]}
    backlink.update(ref)
    return {"apiVersion": podapi.API_VERSION, "kind": "PodSnapshotContent", "metadata": {"name": "content-" + snap["metadata"]["name"]},
            "spec": {"snapshotRef": backlink, "source": {"podRef": {"namespace": "default", "name": "embed-0"}, "nodeName": "node-a"},
                     "store": {"url": "/mnt/snapshots", "snapshotId": "20260110T100000Z-1a2b3c4d"}}}


def set_path(path: List[Any], value: Any) -> Callable[[Dict[str, Any]], None]:
    def change(doc: Dict[str, Any]) -> None:
        node = doc
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value
    return change


def append_path(path: List[Any], value: Any) -> Callable[[Dict[str, Any]], None]:
    def change(doc: Dict[str, Any]) -> None:
        node = doc
        for key in path:
            node = node.setdefault(key, []) if isinstance(key, str) and key in ("env", "volumes", "volumeMounts") else node[key]
        node.append(value)
    return change
