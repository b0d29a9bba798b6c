"""Signed snapshots on real CRIU through the real modules: what a writer of the store can no longer plant.

The node's keys directory is a temp dir (WARMSTART_KEYS_DIR, which ansible-playbook and its modules inherit):
``signing.key`` signs every checkpoint, ``trusted/*.pub`` is the trust set every restore, snapshot_info and
page server checks. One real snapshot of a real workload per module; each tamper case copies it under a new
id (signed again by the fleet key, as a legitimate snapshot would be), then does what someone with write
access to the store could: rewrite an image and its digest, sign with a key of their own, copy another
snapshot's signature. Every one is refused with its reason, before anything is read or started.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg
from tests.support.signing_keys import new_key, trust, write_signing_key
from tests.support.store_fixtures import tree

from .process_lab import Lab, free_port, port_open, query
from .s3_lab import keys as bucket_keys

pytestmark = pytest.mark.integration

BAD = "is refused: bad signature by key"


@pytest.fixture(scope="module", name="keys")
def fixture_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """The node's keys directory: the fleet key signs and is trusted; ``stranger`` is a key nobody trusts."""
    top = tmp_path_factory.mktemp("keys")
    private, public, kid = new_key()
    write_signing_key(top, private)
    trust(top, "fleet-1", public)
    other, _pub, other_kid = new_key()
    write_signing_key(top / "stranger", other)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WARMSTART_KEYS_DIR", str(top))
        yield {"dir": top, "kid": kid, "fleet": sg.load_signing_key(str(top / "signing.key")),
               "stranger": sg.load_signing_key(str(top / "stranger" / "signing.key")), "stranger_kid": other_kid}


@pytest.fixture(scope="module")
def world(keys: Dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    lab = Lab(tmp_path_factory.mktemp("signed"))
    port = free_port()
    try:
        res = lab.play([lab.start("victim", port, 8),
                        lab.checkpoint("checkpoint", workload="victim", leave_running=False)])
        yield {"lab": lab, "sid": res["checkpoint"]["snapshot"]["id"], "port": port, "keys": keys, "copies": []}
    finally:
        lab.cleanup()


@pytest.fixture(autouse=True)
def _drop_copies(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "world" in request.fixturenames:
        found = request.getfixturevalue("world")
        for path in found["copies"]:
            shutil.rmtree(path, ignore_errors=True)
        found["copies"].clear()


def manifest(top: Path) -> Dict[str, Any]:
    return dict(json.loads((top / "manifest.json").read_text()))


def write(top: Path, doc: Dict[str, Any]) -> None:
    os.chmod(top / "manifest.json", 0o600)
    (top / "manifest.json").write_text(json.dumps(doc))


def copy(world: Dict[str, Any], signer: Optional[sg.SigningKey] = None) -> Path:
    """The module's snapshot under a new id, signed by ``signer`` (default: the fleet key)."""
    lab: Lab = world["lab"]
    sid = mf.new_id()
    dst = lab.store / "snapshots" / sid
    shutil.copytree(lab.store / "snapshots" / world["sid"], dst, symlinks=True)
    doc = manifest(dst)
    doc["id"] = sid
    write(dst, sg.sign(doc, signer or world["keys"]["fleet"]))
    world["copies"].append(dst)
    return dst


def plant(top: Path, doc: Dict[str, Any]) -> str:
    """The attack: a pages image rewritten (same size) and its SHA256 updated in ``doc``; returns its path."""
    entry = next(e for e in doc["files"] if "/pages-" in e["path"])
    path = top / entry["path"]
    os.chmod(path, 0o600)
    data = bytearray(path.read_bytes())
    data[:16] = b"planted code!!!!"
    path.write_bytes(bytes(data))
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    return str(entry["path"])


def untouched(lab: Lab) -> Callable[[], None]:
    """A check that the restore root and the workloads root are as they are now and no workload runs."""
    before = (tree(lab.restore_root) if lab.restore_root.exists() else [], tree(lab.workloads))

    def check() -> None:
        assert lab.ours() == [], "a copy of the workload runs"
        assert (tree(lab.restore_root) if lab.restore_root.exists() else [], tree(lab.workloads)) == before
    return check


def refused(world: Dict[str, Any], sid: str, why: str) -> Dict[str, Any]:
    """A restore of ``sid`` that is refused with ``why``, having touched nothing; returns its result."""
    lab: Lab = world["lab"]
    check = untouched(lab)
    res = lab.play([lab.restore("restore", snapshot=sid, expect_fail=True)])["restore"]
    assert res.get("failed") and why in res["msg"], res.get("msg")
    assert "criu_log_tail" not in res, "CRIU ran"
    check()
    return res


# --- the good case ----------------------------------------------------------------------------------

def test_a_signed_snapshot_is_listed_verified_and_restores(world: Dict[str, Any]) -> None:
    lab: Lab = world["lab"]
    doc = manifest(lab.store / "snapshots" / world["sid"])
    assert doc["signature"]["alg"] == "ed25519" and doc["signature"]["key_id"] == world["keys"]["kid"]
    res = lab.play([{"name": "info", "warmstart.snapshot.snapshot_info": {"store": str(lab.store), "verify": True}},
                    lab.restore("restore", snapshot=world["sid"])])
    assert [(s["id"], s["intact"]) for s in res["info"]["snapshots"]] == [(world["sid"], True)]
    assert res["info"]["broken"] == []
    assert query(world["port"])["pair_ok"]
    lab.play([lab.stop("victim")])


# --- tampering in an fs store ---------------------------------------------------------------------------

def test_an_image_rewritten_with_its_digest_updated_is_refused(world: Dict[str, Any]) -> None:
    lab: Lab = world["lab"]
    top = copy(world)
    doc = manifest(top)
    rel = plant(top, doc)
    write(top, doc)  # the digest now matches the planted image: only the signature tells
    res = refused(world, top.name, BAD)
    assert "was changed after it was signed" in res["msg"]
    info = lab.play([{"name": "info", "warmstart.snapshot.snapshot_info": {"store": str(lab.store), "verify": True}}])
    broken = {b["id"]: b["error"] for b in info["info"]["broken"]}
    assert BAD in broken[top.name] and top.name not in [s["id"] for s in info["info"]["snapshots"]]
    assert rel.startswith("containers/")


def test_page_server_refuses_a_tampered_snapshot(world: Dict[str, Any]) -> None:
    lab: Lab = world["lab"]
    top = copy(world)
    doc = manifest(top)
    plant(top, doc)
    write(top, doc)
    port = free_port()
    res = lab.play([{"name": "serve", "ignore_errors": True, "warmstart.snapshot.page_server": {
        "store": str(lab.store), "snapshot": top.name, "address": "127.0.0.1", "port": port,
        "log_dir": str(lab.tmp / "ps-logs")}}])["serve"]
    assert res.get("failed") and BAD in res["msg"], res.get("msg")
    assert not port_open(port) and not (lab.tmp / "ps-logs").exists()


def test_a_snapshot_signed_by_an_unknown_key_is_refused(world: Dict[str, Any]) -> None:
    top = copy(world, world["keys"]["stranger"])
    res = refused(world, top.name, f"signed by key {world['keys']['stranger_kid']}, which is not in the trust set")
    assert f"trusted key ids: {world['keys']['kid']}" in res["msg"]


def test_a_signature_of_another_snapshot_copied_over_is_refused(world: Dict[str, Any]) -> None:
    lab: Lab = world["lab"]
    top = copy(world)
    doc = manifest(top)
    doc["signature"] = manifest(lab.store / "snapshots" / world["sid"])["signature"]
    write(top, doc)
    refused(world, top.name, "or the signature belongs to another snapshot")


def test_an_unsigned_snapshot_is_refused(world: Dict[str, Any]) -> None:
    top = copy(world)
    doc = manifest(top)
    del doc["signature"]
    write(top, doc)
    refused(world, top.name, "is refused: it is not signed")


# --- rotation ----------------------------------------------------------------------------------------------

def test_rotation_old_signatures_verify_until_the_old_key_is_removed(world: Dict[str, Any]) -> None:
    lab: Lab = world["lab"]
    keys = world["keys"]
    private, public, new_kid = new_key()
    trust(keys["dir"], "fleet-2", public)                   # 1. every node trusts the new key
    old_key = (keys["dir"] / "signing.key").read_bytes()
    write_signing_key(keys["dir"], private)                 # 2. the snapshotting node signs with it
    try:
        port = free_port()
        res = lab.play([lab.start("rotated", port, 8),
                        lab.checkpoint("checkpoint", workload="rotated", leave_running=False),
                        lab.restore("old still verifies", snapshot=world["sid"], check=True)])
        new_sid = res["checkpoint"]["snapshot"]["id"]
        assert manifest(lab.store / "snapshots" / new_sid)["signature"]["key_id"] == new_kid
        assert not res["old still verifies"].get("failed")
        os.unlink(keys["dir"] / "trusted" / "fleet-1.pub")  # 3. the old key leaves the trust set
        res = refused(world, world["sid"], f"signed by key {keys['kid']}, which is not in the trust set")
        assert "or a key removed from the trust set on rotation" in res["msg"] and new_kid in res["msg"]
        res = lab.play([lab.restore("new one restores", snapshot=new_sid)])
        assert query(port)["pair_ok"]
        lab.play([lab.stop("rotated")])
    finally:
        write_signing_key(keys["dir"], old_key)
        trust(keys["dir"], "fleet-1", sg_public(keys["fleet"]))
        os.unlink(keys["dir"] / "trusted" / "fleet-2.pub")


def sg_public(key: sg.SigningKey) -> bytes:
    from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
    return bytes(key.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))


# --- tampering in a bucket ---------------------------------------------------------------------------------

def test_s3_an_object_rewritten_with_its_digest_updated_is_refused(keys: Dict[str, Any], lab: Lab,
                                                                   s3: Dict[str, Any]) -> None:
    port = free_port()
    store, opts = s3["url"], s3["opts"]
    snap = lab.play([lab.start("c", port, 8), lab.checkpoint("checkpoint", store, workload="c", leave_running=False,
                                                             store_options=opts)])["checkpoint"]["snapshot"]
    shutil.rmtree(s3["cache"])  # the restore downloads it: the copy is checked against the admitted manifest
    lab.play([lab.restore("restore intact", store, snapshot=snap["id"], store_options=opts)])
    assert query(port)["pair_ok"]
    lab.play([lab.stop("c")])
    client, bucket = s3["client"], s3["bucket"]
    mkey = f"fleet/snapshots/{snap['id']}/manifest.json"
    doc = json.loads(client.get_object(Bucket=bucket, Key=mkey)["Body"].read())
    assert doc["signature"]["key_id"] == keys["kid"]
    entry = next(e for e in doc["files"] if "/pages-" in e["path"])
    okey = f"fleet/snapshots/{snap['id']}/{entry['path']}"
    body = bytearray(client.get_object(Bucket=bucket, Key=okey)["Body"].read())
    body[:16] = b"planted code!!!!"
    client.put_object(Bucket=bucket, Key=okey, Body=bytes(body))
    entry["sha256"] = hashlib.sha256(body).hexdigest()
    client.put_object(Bucket=bucket, Key=mkey, Body=json.dumps(doc).encode())
    assert bucket_keys(s3)[okey] == len(body)
    shutil.rmtree(s3["cache"])
    check = untouched(lab)
    res = lab.play([lab.restore("restore", store, expect_fail=True, snapshot=snap["id"], store_options=opts),
                    {"name": "info", "warmstart.snapshot.snapshot_info": {"store": store, "store_options": opts,
                                                                          "verify": True}}])
    assert res["restore"].get("failed") and BAD in res["restore"]["msg"], res["restore"].get("msg")
    assert "criu_log_tail" not in res["restore"]
    check()
    assert [p for p in s3["cache"].rglob("*") if snap["id"] in str(p)] == [], "the tampered snapshot was downloaded"
    assert BAD in {b["id"]: b["error"] for b in res["info"]["broken"]}[snap["id"]]


# --- selection never falls back silently (issue 32, class 4) ---------------------------------------------------------

def test_a_newer_snapshot_with_a_broken_signature_refuses_a_restore_by_name(world: Dict[str, Any]) -> None:
    """A store writer breaks the newest signature to make an older version run: by name, the restore refuses,
    naming the newer snapshot; with skip_unreadable it restores the older one and says what it passed over."""
    lab: Lab = world["lab"]
    newest = copy(world)
    doc = manifest(newest)
    doc["labels"] = dict(doc.get("labels") or {}, tampered="yes")  # any change after signing
    write(newest, doc)
    check = untouched(lab)
    res = lab.play([lab.restore("by name", name="victim", expect_fail=True),
                    lab.restore("by name, check mode", name="victim", check=True, expect_fail=True)])
    for task in ("by name", "by name, check mode"):
        failed = res[task]
        assert failed.get("failed") and "refusing to fall back to an older one silently" in failed["msg"], json.dumps(failed)[-3000:]
        assert any(r.startswith(f"{newest.name}: unreadable: ") and BAD in r for r in failed["reasons"]), failed
        assert "criu_log_tail" not in failed
    check()

    done = lab.play([lab.restore("skipping", name="victim", skip_unreadable=True)])["skipping"]["restore"]
    try:
        assert done["id"] == world["sid"]
        passed = {p["id"]: p["reason"] for p in done["passed_over"]}
        assert BAD in passed[newest.name], passed
        assert query(world["port"])["pair_ok"] is True
    finally:
        lab.play([lab.stop("victim")])
