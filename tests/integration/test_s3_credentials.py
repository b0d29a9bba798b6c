"""A PodSnapshotStorageConfig's credentials Secret reaches a real S3-compatible server (moto on loopback): the
credentials come only from the Secret, through resolve_store and store_options - none in the environment or in
AWS config files of this node."""
from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as _k8s
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_storage as storage
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import StoreError
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._stores import open_store
from tests.support.fake_apiserver import FakeApiServer

from .s3_lab import SECRET

pytestmark = pytest.mark.integration


@pytest.fixture(name="server")
def fixture_server(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A fake API server with the CRDs."""
    with FakeApiServer() as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server.install_crds()


@pytest.fixture(name="bare_node")
def fixture_bare_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS credentials on this node: not in the environment, not in config files."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_the_secrets_credentials_reach_the_bucket(server: FakeApiServer, endpoint: str, bare_node: None,
                                                  tmp_path: Path) -> None:
    import boto3  # pylint: disable=import-outside-toplevel
    bucket = f"ws-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="warmstart-test",
                 aws_secret_access_key=SECRET).create_bucket(Bucket=bucket)
    server.store.put("secrets", {"metadata": {"name": "s3", "namespace": "warmstart"}, "data": {
        "AWS_ACCESS_KEY_ID": base64.b64encode(b"warmstart-test").decode(),
        "AWS_SECRET_ACCESS_KEY": base64.b64encode(SECRET.encode()).decode()}}, group="")
    options = {"endpointUrl": endpoint, "region": "us-east-1", "cacheDir": str(tmp_path / "cache")}
    server.store.put("podsnapshotstorageconfigs", {"metadata": {"name": "shared"}, "spec": {
        "storeUrl": f"s3://{bucket}/fleet", "options": options,
        "credentialsSecretRef": {"name": "s3", "namespace": "warmstart"}}}, group=podapi.GROUP)
    cluster = _k8s.cluster_from({"kubeconfig": str(server.kubeconfig)})
    where = storage.resolve_store(cluster, "ml", storage_config="shared")

    without = {k: v for k, v in where["store_options"].items() if k not in storage.SECRET_OPTIONS}
    with pytest.raises(StoreError) as refused:
        open_store(where["store"], without).ensure()
    assert "credentials" in str(refused.value).lower() and SECRET not in str(refused.value)

    store = open_store(where["store"], where["store_options"])
    store.ensure()
    assert store.list() == [] and (tmp_path / "cache").is_dir()
    assert SECRET not in repr(store.describe())
