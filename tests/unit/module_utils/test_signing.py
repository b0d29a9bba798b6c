"""_signing: key files, the trust set, canonical bytes, sign and check with every refusal reason."""
from __future__ import annotations

import base64
import builtins
import copy
import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _schema as schema
from ansible_collections.warmstart.snapshot.plugins.module_utils.store.security import _signing as sg
from tests.support.signing_keys import new_key, trust, write_signing_key


def _doc(snapshot_id: str = "20261202T120000Z-1a2b3c4d") -> Dict[str, Any]:
    doc = mf.new_manifest(snapshot_id, "embed", {"model": "m\u00e9"}, {"hostname": "node-a", "arch": "x86_64"})
    doc["files"] = [{"path": "containers/embed/criu/pages-1.img", "size": 4, "sha256": "a" * 64}]
    doc["targets"] = [{"name": "embed", "kind": "process", "path": "containers/embed"}]
    doc["timings"] = {"dump": 0.1}
    return doc


@pytest.fixture(name="keys")
def fixture_keys(tmp_path: Path) -> Dict[str, Any]:
    private, public, kid = new_key()
    path = write_signing_key(tmp_path / "keys", private)
    trust(tmp_path / "keys", "fleet-1", public)
    return {"dir": tmp_path / "keys", "path": str(path), "kid": kid, "public": public,
            "key": sg.load_signing_key(str(path)), "trust": sg.load_trust_set(str(tmp_path / "keys" / "trusted"))}


def test_sign_then_check_and_round_trip_through_the_manifest_file(keys: Dict[str, Any], tmp_path: Path) -> None:
    signed = sg.sign(_doc(), keys["key"])
    assert signed["signature"]["alg"] == "ed25519" and signed["signature"]["key_id"] == keys["kid"]
    assert len(base64.b64decode(signed["signature"]["value"])) == 64
    assert sg.check(signed, keys["trust"], "store") == keys["kid"]
    mf.dump(signed, str(tmp_path / "manifest.json"))  # indented, ASCII-escaped: canonical bytes are not the file's
    loaded = mf.load(str(tmp_path / "manifest.json"))
    assert sg.check(loaded, keys["trust"], "store") == keys["kid"]
    assert schema.problems(loaded, mf.SCHEMA_VERSION) == []


def test_canonical_bytes_exclude_the_signature_and_are_compact_sorted_utf8() -> None:
    doc = {"b": 1, "a": "\u00e9", "signature": {"x": 1}}
    assert sg.canonical(doc) == '{"a":"\u00e9","b":1}'.encode("utf-8")
    assert sg.canonical({"a": "\ud800"}) == b'{"a":"\xed\xa0\x80"}'  # a lone surrogate is still bytes


@pytest.mark.parametrize("change", [
    lambda d: d["files"][0].update(sha256="b" * 64),          # an image rewritten and its digest updated
    lambda d: d["files"][0].update(size=5),
    lambda d: d["source"].update(hostname="node-b"),
    lambda d: d.update(encryption={"alg": "aes-256-gcm"}),
    lambda d: d["labels"].update(extra="1"),
])
def test_any_change_after_signing_is_a_bad_signature(keys: Dict[str, Any], change: Any) -> None:
    signed = sg.sign(_doc(), keys["key"])
    change(signed)
    with pytest.raises(sg.SignatureError, match="bad signature by key .* was changed after it was signed"):
        sg.check(signed, keys["trust"], "store")


def test_a_signature_of_another_snapshot_is_refused(keys: Dict[str, Any]) -> None:
    other = sg.sign(_doc("20261202T120000Z-00000000"), keys["key"])
    target = _doc()
    target["signature"] = copy.deepcopy(other["signature"])
    with pytest.raises(sg.SignatureError, match="or the signature belongs to another snapshot"):
        sg.check(target, keys["trust"], "store")


def test_unsigned_unknown_signer_bad_alg_and_garbage_value(keys: Dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(sg.SignatureError, match=r"is refused: it is not signed, and this node trusts only .*\("
                                                + keys["kid"]):
        sg.check(_doc(), keys["trust"], "store")
    private, _pub, other_kid = new_key()
    stranger = sg.load_signing_key(str(write_signing_key(tmp_path / "other", private)))
    with pytest.raises(sg.SignatureError) as err:
        sg.check(sg.sign(_doc(), stranger), keys["trust"], "s3://b/p")
    assert str(err.value) == (f"snapshot 20261202T120000Z-1a2b3c4d (s3://b/p) is refused: it is signed by key "
                              f"{other_kid}, which is not in the trust set {keys['trust'].path} (an unknown signer, "
                              f"or a key removed from the trust set on rotation); trusted key ids: {keys['kid']}")
    bad = sg.sign(_doc(), keys["key"])
    bad["signature"]["alg"] = "rsa"
    with pytest.raises(sg.SignatureError, match="signature algorithm 'rsa' is not supported"):
        sg.check(bad, keys["trust"], "store")
    for value in ("not base64!", base64.b64encode(b"short").decode()):
        bad = sg.sign(_doc(), keys["key"])
        bad["signature"]["value"] = value
        with pytest.raises(sg.SignatureError, match="bad signature"):
            sg.check(bad, keys["trust"], "store")


def test_rotation_several_trusted_keys(keys: Dict[str, Any], tmp_path: Path) -> None:
    private, public, new_kid = new_key()
    trust(keys["dir"], "fleet-2", public)
    both = sg.load_trust_set(str(keys["dir"] / "trusted"))
    assert both.ids == sorted([keys["kid"], new_kid])
    new = sg.load_signing_key(str(write_signing_key(tmp_path / "new", private)))
    old_signed, new_signed = sg.sign(_doc(), keys["key"]), sg.sign(_doc(), new)
    assert sg.check(old_signed, both, "s") == keys["kid"] and sg.check(new_signed, both, "s") == new_kid
    os.unlink(keys["dir"] / "trusted" / "fleet-1.pub")
    only_new = sg.load_trust_set(str(keys["dir"] / "trusted"))
    assert sg.check(new_signed, only_new, "s") == new_kid
    with pytest.raises(sg.SignatureError, match="or a key removed from the trust set on rotation"):
        sg.check(old_signed, only_new, "s")


def test_signing_key_file_refusals(tmp_path: Path) -> None:
    private, public, _kid = new_key()
    path = write_signing_key(tmp_path, private)
    for mode in (0o640, 0o604, 0o620):
        os.chmod(path, mode)
        with pytest.raises(sg.KeyFileError, match=f"signing key {path} is accessible by group or others "
                                                  f"\\(mode 0{mode:o}\\); refusing to use it: chmod 600"):
            sg.load_signing_key(str(path))
    os.chmod(path, 0o400)
    assert sg.load_signing_key(str(path)).path == str(path)
    with pytest.raises(sg.KeyFileError, match=f"signing key {tmp_path} is not a regular file"):
        sg.load_signing_key(str(tmp_path))
    with pytest.raises(sg.KeyFileError, match=f"signing key {tmp_path}/missing cannot be read: No such file"):
        sg.load_signing_key(str(tmp_path / "missing"))
    pub = tmp_path / "pub.key"
    fd = os.open(pub, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, public)
    os.close(fd)
    with pytest.raises(sg.KeyFileError, match="is not an unencrypted PEM \\(PKCS8\\) private key"):
        sg.load_signing_key(str(pub))


def test_trust_set_refusals(tmp_path: Path) -> None:
    with pytest.raises(sg.KeyFileError, match=f"trust set {tmp_path}/none cannot be read: No such file"):
        sg.load_trust_set(str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README").write_text("not a key")
    with pytest.raises(sg.KeyFileError, match=r"holds no \*.pub public key: every snapshot would be refused"):
        sg.load_trust_set(str(tmp_path / "empty"))
    (tmp_path / "empty" / "bad.pub").write_text("garbage")
    (tmp_path / "empty" / "dir.pub").mkdir()
    with pytest.raises(sg.KeyFileError, match="2 key file") as err:
        sg.load_trust_set(str(tmp_path / "empty"))
    assert [r.split(": ")[0] for r in err.value.reasons] == [
        f"trusted key {tmp_path}/empty/bad.pub is not a PEM public key",
        f"trusted key {tmp_path}/empty/dir.pub is not a regular file; refusing to use it"]


def test_missing_cryptography_names_node_prep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = builtins.__import__

    def no_crypto(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cryptography"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    private, _pub, _kid = new_key()
    path = write_signing_key(tmp_path, private)
    monkeypatch.setattr(builtins, "__import__", no_crypto)
    with pytest.raises(sg.KeyFileError, match="python3-cryptography.*warmstart.snapshot.node_prep"):
        sg.load_signing_key(str(path))


@pytest.mark.parametrize("block, fragment", [
    ("x", "signature: not a mapping"),
    ({"alg": "ed25519", "key_id": "ABC", "value": "AA=="}, "signature.key_id: not 16 lowercase hex digits"),
    ({"alg": 1, "key_id": "0" * 16, "value": "AA=="}, "signature.alg: missing or not a short string"),
    ({"alg": "ed25519", "key_id": "0" * 16, "value": "A" * 2000}, "signature.value: not base64 of at most 1024 characters"),
    ({"alg": "ed25519", "key_id": "0" * 16, "value": "AA==", "by": 1}, "signature: unknown field(s) by"),
])
def test_schema_lists_signature_problems(block: Any, fragment: str) -> None:
    doc = json.loads(json.dumps(_doc()))
    doc["signature"] = block
    assert fragment in schema.problems(doc, mf.SCHEMA_VERSION)
