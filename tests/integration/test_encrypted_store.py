"""Encryption at rest on real CRIU: a workload holding a random marker in memory is checkpointed into an
encrypted filesystem store and an encrypted bucket (moto on loopback); no stored byte sequence holds the
marker, the restored process holds it again, and a wrong or missing key-encryption key is refused before
any process is touched. The bucket's objects also carry the provider's server-side encryption (SSE-KMS).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from .marked_lab import holders, in_memory, kill_marked, marker, running, start, write_kek
from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration


@pytest.fixture
def keys(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's keys dir (WARMSTART_KEYS_DIR, as node_prep lays it out): one KEK, kek/fleet.key."""
    top = lab.tmp / "keys"
    write_kek(top / "kek", "fleet")
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(top))
    return top


@pytest.fixture(autouse=True)
def _stop_marked(lab: Lab) -> Iterator[None]:
    yield
    kill_marked(lab)


def test_fs_store_holds_no_plaintext_and_restores(lab: Lab, keys: Path) -> None:
    port = free_port()
    opts = {"encryption": True, "cache_dir": str(lab.tmp / "cache")}
    res = lab.play([start(lab, "m", port),
                    lab.checkpoint("checkpoint", workload="m", leave_running=False, store_options=opts)])
    snap = res["checkpoint"]["snapshot"]
    mark = marker(lab, "m")
    assert not holders(lab.store, mark), "the marker is stored in plaintext"
    assert not holders(lab.store, mark[:32]), "a part of the marker is stored in plaintext"
    # the node that took it keeps its decrypted copy (0700): it holds the marker, and a restore reuses it
    plain = lab.tmp / "cache" / "plain"
    assert holders(plain, mark) and all(d.stat().st_mode & 0o077 == 0 for d in plain.rglob("*"))
    shutil.rmtree(plain)  # another node's view: decrypt from the store
    res = lab.play([lab.restore("restore", snapshot=snap["id"], store_options=opts)])
    state = query(port)
    assert state["marker"] == mark.hex() and state["whole"], "the marker is back in the restored process"
    assert [in_memory(pid, mark) for pid in running(lab)] == [True], "read from /proc/<pid>/mem"
    assert not holders(lab.store, mark)


def test_wrong_or_missing_kek_is_refused_before_anything_runs(lab: Lab, keys: Path) -> None:
    port = free_port()
    opts = {"encryption": True, "cache_dir": str(lab.tmp / "cache")}
    snap = lab.play([start(lab, "k", port, 4),
                     lab.checkpoint("checkpoint", workload="k", leave_running=False, store_options=opts)])
    snap = snap["checkpoint"]["snapshot"]
    shutil.rmtree(lab.tmp / "cache" / "plain")
    shutil.rmtree(keys / "kek")
    write_kek(keys / "kek", "other")
    res = lab.play([
        lab.restore("wrong kek", snapshot=snap["id"], store_options=opts, expect_fail=True),
        lab.restore("no encryption", snapshot=snap["id"], store_options={"cache_dir": opts["cache_dir"]},
                    expect_fail=True),
        {"name": "drop keks", "ansible.builtin.file": {"path": str(keys / "kek"), "state": "absent"}},
        lab.restore("missing kek", snapshot=snap["id"], store_options=opts, expect_fail=True),
    ])
    assert "which is not in" in res["wrong kek"]["msg"] and "other" in res["wrong kek"]["msg"]
    assert "set store_options.encryption" in res["no encryption"]["msg"]
    assert "node_prep_keks" in res["missing kek"]["msg"]
    assert not running(lab), "nothing may have been started"
    assert not lab.restore_root.exists() or not list(lab.restore_root.iterdir()), "nothing restored"
    assert not (lab.tmp / "cache" / "plain").exists() or not list((lab.tmp / "cache" / "plain").rglob("*.img"))
    # no KEK to write with: the checkpoint is refused before CRIU touches the workload
    res = lab.play([start(lab, "k2", free_port(), 4),
                    lab.checkpoint("checkpoint without kek", workload="k2", store_options=opts, expect_fail=True)])
    assert "node_prep_keks" in res["checkpoint without kek"]["msg"]
    assert lab.published() == [snap["id"]] and not lab.staging()
    assert len(running(lab)) == 1 and open(f"/proc/{running(lab)[0]}/stat").read().split()[2] in "RS"


def test_bucket_holds_no_plaintext_carries_sse_and_restores(lab: Lab, keys: Path, s3: Dict[str, Any]) -> None:
    port = free_port()
    opts = dict(s3["opts"], encryption=True, sse="aws:kms", sse_kms_key_id="warmstart-test-key")
    res = lab.play([start(lab, "b", port),
                    lab.checkpoint("checkpoint", s3["url"], workload="b", leave_running=False, store_options=opts)])
    snap = res["checkpoint"]["snapshot"]
    mark = marker(lab, "b")
    client, bucket = s3["client"], s3["bucket"]
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"fleet/snapshots/{snap['id']}/")["Contents"]
    assert len(listed) > 3
    for obj in listed:
        body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        assert mark[:32] not in body, f"{obj['Key']} holds the marker in plaintext"
        head = client.head_object(Bucket=bucket, Key=obj["Key"])
        assert head["ServerSideEncryption"] == "aws:kms" and "warmstart-test-key" in head["SSEKMSKeyId"], obj["Key"]
    assert not holders(s3["cache"] / "s3", mark) if (s3["cache"] / "s3").exists() else True
    shutil.rmtree(s3["cache"] / "plain")  # another node's view: decrypt from the bucket
    res = lab.play([lab.restore("restore", s3["url"], snapshot=snap["id"], store_options=opts)])
    state = query(port)
    assert state["marker"] == mark.hex() and state["whole"]
    assert [in_memory(pid, mark) for pid in running(lab)] == [True]
    assert res["restore"]["restore"]["transfer"]["downloaded"] == snap["size"]
