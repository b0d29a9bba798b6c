"""Where snapshots go: PodSnapshotPolicy / PodSnapshotStorageConfig + Secret -> store and store_options
(plugins/module_utils/k8s/_k8s_storage.py), against the fake API server with the real kubernetes client."""
from __future__ import annotations

import base64
from typing import Any, Dict, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as storage
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store
from tests.support import fake_apiserver as fake_server_module
from tests.support.fake_apiserver import FakeApiServer

fake_apiserver = fake_server_module.fake_apiserver  # the pytest fixture

ACCESS, SECRET, TOKEN = "AKIAEXAMPLE", "s3cr3t-Value/with+chars", "session-token-xyz"


@pytest.fixture(name="server")
def fixture_server(fake_apiserver: FakeApiServer) -> FakeApiServer:
    fake_apiserver.install_crds()
    return fake_apiserver


def cluster(server: FakeApiServer) -> _k8s.Cluster:
    return _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(server: FakeApiServer, name: str, namespace: str, **data: str) -> None:
    server.store.put("secrets", {"metadata": {"name": name, "namespace": namespace},
                                 "data": {k: b64(v) for k, v in data.items()}}, group="")


def config(server: FakeApiServer, name: str, url: str, options: Optional[Dict[str, Any]] = None,
           secret_ref: Optional[Dict[str, Any]] = None) -> None:
    spec: Dict[str, Any] = {"storeUrl": url}
    if options:
        spec["options"] = options
    if secret_ref:
        spec["credentialsSecretRef"] = secret_ref
    cluster(server).create(podapi.KIND_STORAGE_CONFIG, {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_STORAGE_CONFIG,
                                                        "metadata": {"name": name}, "spec": spec})


def policy(server: FakeApiServer, name: str, **spec: Any) -> None:
    server.store.put("podsnapshotpolicies", {"apiVersion": podapi.API_VERSION, "kind": podapi.KIND_POLICY,
                                             "metadata": {"name": name, "namespace": "ml"},
                                             "spec": dict({"selector": {"matchLabels": {"app": "e"}}}, **spec)},
                     group=podapi.GROUP)


def test_an_inline_store_url_still_works(server: FakeApiServer) -> None:
    policy(server, "inline", storeUrl="/mnt/snapshots")
    out = storage.resolve_store(cluster(server), "ml", policy="inline")
    assert out == {"store": "/mnt/snapshots", "store_options": {}, "storage_config": None, "credentials_secret": None,
                   "source": "PodSnapshotPolicy ml/inline storeUrl"}


def test_a_storage_config_with_a_secret_gives_store_options_with_credentials(server: FakeApiServer) -> None:
    secret(server, "s3-creds", "warmstart", AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET,
           AWS_SESSION_TOKEN=TOKEN)
    config(server, "shared-s3", "s3://snapshots/prod", {"endpointUrl": "http://minio:9000", "region": "eu-1",
                                                        "concurrency": 4},
           {"name": "s3-creds", "namespace": "warmstart"})
    policy(server, "embed", storageConfigName="shared-s3")
    out = storage.resolve_store(cluster(server), "ml", policy="embed")
    assert out["store"] == "s3://snapshots/prod" and out["storage_config"] == "shared-s3"
    assert out["store_options"] == {"endpoint_url": "http://minio:9000", "region": "eu-1", "concurrency": 4,
                                    "access_key_id": ACCESS, "secret_access_key": SECRET, "session_token": TOKEN}
    assert out["credentials_secret"] == "warmstart/s3-creds"
    assert "storageConfigName of PodSnapshotPolicy ml/embed" in out["source"]
    # by name too; the store modules take the options as they are
    direct = storage.resolve_store(cluster(server), "ml", storage_config="shared-s3")
    assert direct["store_options"] == out["store_options"]
    store = open_store(direct["store"], direct["store_options"])
    assert store.describe()["url"] == "s3://snapshots/prod" and SECRET not in repr(store.describe())


def test_custom_keys_default_namespace_and_an_optional_token(server: FakeApiServer) -> None:
    secret(server, "mine", "ml", key="k", secret="s")
    config(server, "custom", "s3://b/p", secret_ref={"name": "mine", "keys": {"accessKeyId": "key",
                                                                              "secretAccessKey": "secret"}})
    out = storage.resolve_store(cluster(server), "ml", storage_config="custom")
    assert out["credentials_secret"] == "ml/mine"
    assert {k: out["store_options"][k] for k in ("access_key_id", "secret_access_key")} == {
        "access_key_id": "k", "secret_access_key": "s"}
    assert "session_token" not in out["store_options"]


def test_a_directory_store_and_file_urls(server: FakeApiServer) -> None:
    config(server, "nfs", "file:///mnt/nfs/snapshots", {"cacheDir": "/var/cache/w"})
    out = storage.resolve_store(cluster(server), "ml", storage_config="nfs")
    want = ("/mnt/nfs/snapshots", {"cache_dir": "/var/cache/w"}, None)
    assert (out["store"], out["store_options"], out["credentials_secret"]) == want
    with pytest.raises(_k8s.K8sError, match="is neither an absolute directory"):
        storage.store_url("relative/dir", "X")
    with pytest.raises(_k8s.K8sError, match="is not file:///absolute/path"):
        storage.store_url("file://host/dir", "X")


def test_a_missing_secret_or_key_names_the_secret_the_key_and_the_config(server: FakeApiServer) -> None:
    config(server, "no-secret", "s3://b/p", secret_ref={"name": "absent", "namespace": "warmstart"})
    with pytest.raises(_k8s.K8sError) as missing:
        storage.resolve_store(cluster(server), "ml", storage_config="no-secret")
    assert ("Secret warmstart/absent not found (credentialsSecretRef of PodSnapshotStorageConfig no-secret)"
            in missing.value.message)
    assert "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in missing.value.message

    secret(server, "half", "warmstart", AWS_ACCESS_KEY_ID=ACCESS, other=SECRET)
    config(server, "half-secret", "s3://b/p", secret_ref={"name": "half", "namespace": "warmstart",
                                                          "keys": {"sessionToken": "TOKEN"}})
    with pytest.raises(_k8s.K8sError) as keys:
        storage.resolve_store(cluster(server), "ml", storage_config="half-secret")
    assert keys.value.reasons == [
        "Secret warmstart/half has no key 'AWS_SECRET_ACCESS_KEY' (credentialsSecretRef.keys.secretAccessKey of "
        "PodSnapshotStorageConfig half-secret); its keys: AWS_ACCESS_KEY_ID, other",
        "Secret warmstart/half has no key 'TOKEN' (credentialsSecretRef.keys.sessionToken of "
        "PodSnapshotStorageConfig half-secret); its keys: AWS_ACCESS_KEY_ID, other"]
    everything = keys.value.full_message() + repr(keys.value.details)
    assert SECRET not in everything and ACCESS not in everything and b64(SECRET) not in everything


def test_policy_refusals_name_both_fields_and_missing_configs(server: FakeApiServer) -> None:
    policy(server, "both", storeUrl="/mnt/s", storageConfigName="shared")
    with pytest.raises(_k8s.K8sError, match=r"PodSnapshotPolicy ml/both sets both storeUrl \('/mnt/s'\) and "
                                            r"storageConfigName \('shared'\): set only one"):
        storage.resolve_store(cluster(server), "ml", policy="both")
    policy(server, "neither")
    with pytest.raises(_k8s.K8sError, match="sets neither storeUrl nor storageConfigName"):
        storage.resolve_store(cluster(server), "ml", policy="neither")
    policy(server, "dangling", storageConfigName="gone")
    with pytest.raises(_k8s.K8sError, match=r"PodSnapshotStorageConfig gone not found \(named by "
                                            r"PodSnapshotPolicy ml/dangling in storageConfigName\)"):
        storage.resolve_store(cluster(server), "ml", policy="dangling")
    with pytest.raises(_k8s.K8sError, match="uses storageConfigName 'gone', not PodSnapshotStorageConfig 'other'"):
        storage.resolve_store(cluster(server), "ml", policy="dangling", storage_config="other")
    with pytest.raises(_k8s.K8sError, match="neither was given"):
        storage.resolve_store(cluster(server), "ml")
    server.store.put("podsnapshotstorageconfigs", {"metadata": {"name": "dir-creds"},
                                                   "spec": {"storeUrl": "/mnt/s",
                                                            "credentialsSecretRef": {"name": "x"}}}, group=podapi.GROUP)
    with pytest.raises(_k8s.K8sError, match="is a directory: credentials are for an s3:// store only"):
        storage.resolve_store(cluster(server), "ml", storage_config="dir-creds")
