"""Nodes restoring one snapshot from S3 share its chunks (``store_options.peers``), against moto on loopback.

Three "nodes" (S3 stores with their own caches, peer servers on loopback ports) fetch the same snapshot at
once: the bucket sends each chunk about once, every copy is whole and verified; a peer that sends other bytes
is caught by the chunk digests and replaced by the bucket; a peer that is down costs nothing but its share.
"""
from __future__ import annotations

import base64
import os
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _peers as pr
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _s3store as s3s
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _stores as stores
from tests.support.store_fixtures import publish_images

from .process_lab import Lab, free_port

pytestmark = pytest.mark.integration

MIB = 1 << 20
SIZES = {"pages-1.img": 12 * MIB + 4321, "pages-2.img": 5 * MIB, "core-1.img": 3000}


@pytest.fixture
def published(s3: Dict[str, Any], lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """A snapshot of random files with 1 MiB chunk digests (the page images), published to the bucket."""
    monkeypatch.setattr(s3s, "PART", MIB)
    writer = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "writer"))
    sid = mf.new_id()
    staging = writer.stage(sid)
    blobs = {rel: os.urandom(size) for rel, size in SIZES.items()}
    files = []
    for rel, blob in blobs.items():
        (Path(staging.path) / rel).write_bytes(blob)
        files.append(dg.hash_file(str(Path(staging.path) / rel), rel, chunk_size=MIB))
    manifest = mf.new_manifest(sid, "peers", {}, {"hostname": "writer"})
    manifest["files"] = files
    staging.publish(manifest)
    return {"id": sid, "blobs": blobs}


def nodes(s3: Dict[str, Any], lab: Lab, count: int, **options: Any) -> List[s3s.S3Store]:
    addresses = [f"127.0.0.1:{free_port()}" for _n in range(count)]
    stores = []
    for n, me in enumerate(addresses):
        config = pr.PeerConfig.from_options({"peers": addresses, "peer_listen": me, "peer_wait": 20,
                                             "peer_linger": 2, **options})
        stores.append(s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / f"n{n}"),
                                  concurrency=4, peers=config))
    return stores


def fetch_all(stores: List[s3s.S3Store], sid: str, skip: int = -1) -> List[Any]:
    """``local_dir`` on every store at once (but ``skip``); each one's directory or exception."""
    out: List[Any] = [None] * len(stores)

    def one(n: int) -> None:
        try:
            out[n] = stores[n].local_dir(sid)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[n] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(stores)) if n != skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def assert_whole(local: Any, blobs: Dict[str, bytes]) -> None:
    assert isinstance(local, str), f"fetch failed: {local!r}"
    for rel, blob in blobs.items():
        assert (Path(local) / rel).read_bytes() == blob, f"{rel} differs from what was published"
    assert not list(Path(local).glob("*.part*")), "no partial download left behind"


def test_three_nodes_read_the_snapshot_from_the_bucket_about_once(
        s3: Dict[str, Any], lab: Lab, published: Dict[str, Any]) -> None:
    stores = nodes(s3, lab, 3)
    results = fetch_all(stores, published["id"])
    for local in results:
        assert_whole(local, published["blobs"])
    total = sum(SIZES.values())
    from_store = sum(s.transfer["downloaded"] for s in stores)
    from_peers = sum(s.transfer["from_peers"] for s in stores)
    assert from_store <= 1.2 * total, f"the bucket sent {from_store} bytes for a {total}-byte snapshot to 3 nodes"
    assert from_store + from_peers == 3 * total, "every node got every byte, from the bucket or a peer"
    assert all(s.transfer["from_peers"] > 0 and s.transfer["served"] > 0 for s in stores), \
        [s.transfer for s in stores]
    assert sum(s.transfer["peer_rejected"] for s in stores) == 0


def test_a_peer_sending_other_bytes_is_caught_and_replaced_by_the_bucket(
        s3: Dict[str, Any], lab: Lab, published: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    stores = nodes(s3, lab, 3)
    liar = stores[0].peers.listen if stores[0].peers else ""
    real_read = pr.Session._read  # pylint: disable=protected-access

    def lying_read(self: pr.Session, entry: Any, start: int) -> Any:
        data = real_read(self, entry, start)
        if data is None or self.config.listen != liar:
            return data
        return bytes([data[0] ^ 0xFF]) + data[1:]  # one flipped byte in every chunk it serves

    monkeypatch.setattr(pr.Session, "_read", lying_read)
    results = fetch_all(stores, published["id"])
    for local in results:
        assert_whole(local, published["blobs"])
    rejected = sum(s.transfer["peer_rejected"] for s in stores[1:])
    assert rejected > 0, "the other nodes should have asked the liar for its share and refused every answer"
    assert sum(s.transfer["downloaded"] for s in stores) <= sum(SIZES.values()) * 1.2 + rejected * MIB


def test_a_peer_that_is_down_costs_only_its_share(s3: Dict[str, Any], lab: Lab, published: Dict[str, Any]) -> None:
    stores = nodes(s3, lab, 3)
    results = fetch_all(stores, published["id"], skip=2)  # node 2 is listed but never comes up
    for local in results[:2]:
        assert_whole(local, published["blobs"])
    assert all(s.transfer["from_peers"] > 0 for s in stores[:2]), [s.transfer for s in stores]
    assert all(s.transfer["seconds"] < 15 for s in stores[:2]), "a refused connection is not waited on"


def test_a_node_with_the_snapshot_cached_serves_its_share(s3: Dict[str, Any], lab: Lab,
                                                          published: Dict[str, Any]) -> None:
    """A node whose cache is intact (it restored before) serves its share of the chunks at once: the newcomer
    reads from the bucket only its own share and what is not shared (files without chunk digests)."""
    first = s3s.S3Store(s3["url"], endpoint_url=s3["opts"]["endpoint_url"], cache=str(lab.tmp / "n0"))
    first.local_dir(published["id"])
    stores = nodes(s3, lab, 2)  # n0 (the cache above) and n1 (empty)
    results = fetch_all(stores, published["id"])
    for local in results:
        assert_whole(local, published["blobs"])
    assert stores[0].transfer["downloaded"] == 0 and stores[0].transfer["reused"] == sum(SIZES.values())
    config = stores[0].peers
    assert config is not None
    owned_by_n0 = sum(min(MIB, size - off) for rel, size in SIZES.items() if size > MIB
                      for off in range(0, size, MIB) if config.owner(rel, off // MIB) == config.listen)
    assert owned_by_n0 > 0
    assert stores[1].transfer["from_peers"] == owned_by_n0
    assert stores[1].transfer["downloaded"] == sum(SIZES.values()) - owned_by_n0


def test_a_node_that_cannot_listen_fetches_alone(s3: Dict[str, Any], lab: Lab, published: Dict[str, Any]) -> None:
    """Its port taken, a node cannot serve: it says so in its transfer report and reads the bucket itself."""
    import socket  # pylint: disable=import-outside-toplevel
    stores = nodes(s3, lab, 2)
    assert stores[0].peers is not None
    taken = socket.socket()
    taken.bind(pr.split_address(stores[0].peers.listen))
    taken.listen()
    try:
        assert_whole(stores[0].local_dir(published["id"]), published["blobs"])
    finally:
        taken.close()
    assert "cannot listen on" in stores[0].transfer["peer_error"]
    assert stores[0].transfer["downloaded"] == sum(SIZES.values())


def test_encrypted_snapshots_are_shared_as_ciphertext(s3: Dict[str, Any], lab: Lab,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With encryption at rest the nodes share the stored, encrypted chunks (each checked against the manifest),
    then decrypt their own copy; the ciphertext copy is dropped once the plaintext one is whole."""
    monkeypatch.setattr(s3s, "PART", MIB)
    monkeypatch.setattr(dg, "CHUNK_SIZE", MIB)  # the stored bytes' chunk digests, as the 64 MiB ones at full size
    keys = lab.tmp / "keys" / "kek"
    keys.mkdir(parents=True, mode=0o700)
    (keys / "fleet.key").write_text(base64.b64encode(os.urandom(32)).decode())
    (keys / "fleet.key").chmod(0o600)
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys.parent))
    blobs = {"pages-1.img": os.urandom(6 * MIB + 777), "core-1.img": os.urandom(3000)}
    writer = stores.open_store(s3["url"], dict(s3["opts"], encryption=True, cache_dir=str(lab.tmp / "writer")))
    doc = publish_images(writer, blobs)
    assert all(e["size"] <= MIB or e["chunks"]["size"] == MIB for e in doc["files"]), "no chunk digests of stored bytes"
    addresses = [f"127.0.0.1:{free_port()}" for _n in range(3)]
    nodes = [stores.open_store(s3["url"], dict(s3["opts"], encryption=True, cache_dir=str(lab.tmp / f"e{n}"),
                                               peers=addresses, peer_listen=me, peer_wait=20, peer_linger=2))
             for n, me in enumerate(addresses)]
    results = fetch_all(nodes, doc["id"])
    for n, local in enumerate(results):
        assert_whole(local, {f"containers/w/criu/{k}": v for k, v in blobs.items()})
        assert not os.path.exists(getattr(nodes[n], "inner").cache_dir(doc["id"])), "the ciphertext copy was kept"
        assert [p.name for p in (lab.tmp / f"e{n}").rglob(doc["id"])] == [doc["id"]], "one copy: the plaintext one"
    transfers = [getattr(s, "inner").transfer for s in nodes]
    stored = sum(e["size"] for e in doc["files"])
    assert sum(t["downloaded"] for t in transfers) <= 1.2 * stored, transfers
    assert all(t["from_peers"] > 0 and t["served"] > 0 for t in transfers), transfers
