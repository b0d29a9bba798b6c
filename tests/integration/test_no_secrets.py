"""Nothing secret on the node or in Ansible's output: the modules run through Ansible with every secret the
collection takes, and every place a run leaves text is searched for the secret values.

Secrets given: the S3 secret access key and session token (``store_options``; the access key id is an
identifier, shown in results like a user name, but kept out of the node's files too), the page server's
TLS private key (``tls_key``: a path; its PEM contents are searched), the SSE-C customer key
(``store_options.sse_customer_key``) and, in the node's keys directory (this test's own), the snapshot-signing
key (checkpoints sign, restores verify) and the key-encryption key of the encrypted store (``encryption``);
key material is searched as text and as raw bytes. Searched: the JSON Ansible printed for
every play (results, failure messages, invocations), its stderr, and every file the runs left - the store's
objects (moto), the node-local cache, the restore work dirs with CRIU's logs, the page server's logs,
progress files, metrics, the workload's control files and the fleet playbook's summary.

Also checked without running anything: every module option whose name says secret (``secret``, ``token``,
``password``, ``*_customer_key``) is ``no_log``, and every other string option named ``*key*`` says
``no_log`` explicitly (as ``ansible-test sanity`` requires).
"""
from __future__ import annotations

import base64
import importlib
import os
import re
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from tests.support.signing_keys import keys_dir
from tests.support.tls_certs import Pki

from .ansible_run import REPO, playbook
from .process_lab import Lab, free_port, query

pytestmark = pytest.mark.integration

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
SECRET_NAME = re.compile(r"secret|token|password|passphrase|customer_key")
COVERED = {"secret_access_key", "session_token", "sse_customer_key"}  # the no_log options test_no_secret_in_output... passes


def findings(where: str, data: bytes, secrets: Dict[str, bytes]) -> List[str]:
    return [f"{name} in {where}" for name, value in secrets.items() if value in data]


def files_under(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            yield path


def test_no_secret_in_output_results_logs_store_or_cache(lab: Lab, s3: Dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    access = "AKIDWS" + uuid.uuid4().hex[:14].upper()
    secret_key = "sk-" + uuid.uuid4().hex + uuid.uuid4().hex
    token = "tok-" + uuid.uuid4().hex + uuid.uuid4().hex
    pki = Pki(lab.tmp / "pki")
    ca = pki.ca("fleet")
    cert, key = pki.issue("node", "fleet", ips=["127.0.0.1"], server=True)
    key_body = max(key.read_text().splitlines(), key=len)  # the longest base64 line of the private key
    keys = lab.tmp / "keys"
    kid = keys_dir(keys)
    monkeypatch.setenv("WARMSTART_KEYS_DIR", str(keys))  # the node's keys: this checkpoint signs, restores verify
    signing_body = max((keys / "signing.key").read_text().splitlines(), key=len)
    kek, sse_c = os.urandom(32), os.urandom(32)
    (keys / "kek").mkdir(mode=0o700)
    fd = os.open(keys / "kek" / "fleet.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(base64.b64encode(kek).decode() + "\n")
    secrets = {"secret_access_key": secret_key.encode(), "session_token": token.encode(),
               "TLS private key": key_body.encode(), "signing key": signing_body.encode(),
               "KEK": base64.b64encode(kek), "sse_customer_key": base64.b64encode(sse_c)}
    node_secrets = dict(secrets, access_key_id=access.encode(), **{"KEK (raw)": kek, "sse_customer_key (raw)": sse_c})

    opts = dict(s3["opts"], access_key_id=access, secret_access_key=secret_key, session_token=token,
                encryption=True, sse_customer_key=base64.b64encode(sse_c).decode())
    store = s3["url"]
    tls = {"tls": True, "tls_ca": str(ca), "tls_cert": str(cert), "tls_key": str(key)}
    progress, metrics = lab.tmp / "progress", lab.tmp / "metrics"
    progress.mkdir()
    outputs: List[Tuple[str, str]] = []

    def play(tasks: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
        res = lab.play(tasks)
        assert lab.last is not None
        outputs.append((f"play {lab.runs}", lab.last.stdout + lab.last.stderr))
        return res

    port = free_port()
    snap = play([
        lab.start("sec", port, 16),
        lab.checkpoint("checkpoint", store, workload="sec", leave_running=False, store_options=opts,
                       progress_interval=0.2, progress_file=str(progress / "checkpoint.json"),
                       metrics_dir=str(metrics)),
    ])["checkpoint"]["snapshot"]
    ps_port = free_port()
    res = play([
        {"name": "info", "warmstart.snapshot.snapshot_info": {"store": store, "store_options": opts, "verify": True}},
        {"name": "serve", "warmstart.snapshot.page_server": {
            "store": store, "store_options": opts, "snapshot": snap["id"], "address": "0.0.0.0", "port": ps_port,
            "timeout": 120, "log_dir": str(lab.tmp / "ps"), **tls}},
        lab.restore("restore from the page server", store, snapshot=snap["id"], store_options=opts, lazy_wait=True,
                    page_server=f"127.0.0.1:{ps_port}", progress_interval=0.2,
                    progress_file=str(progress / "restore.json"), metrics_dir=str(metrics), **tls),
        lab.restore("refused: no such bucket", f"s3://nope-{uuid.uuid4().hex[:8]}/x", snapshot=snap["id"],
                    store_options=opts, expect_fail=True),
        lab.restore("refused: a second copy", store, snapshot=snap["id"], store_options=opts, expect_fail=True),
    ])
    assert res["restore from the page server"]["restore"]["lazy"]["complete_after"] > 0
    assert res["refused: no such bucket"]["failed"] and res["refused: a second copy"]["failed"]
    got = query(port)
    assert got["sha256"] == got["digest_at_start"]

    summary = lab.tmp / "summary.json"
    fleet = playbook("warmstart.snapshot.snapshot", extra={
        "warmstart_store": store, "warmstart_store_options": opts, "warmstart_become": False,
        "warmstart_summary_file": str(summary), "warmstart_snapshot_target": {
            "workload": "sec", "workloads_root": str(lab.workloads), "leave_running": True}})
    assert fleet.rc == 0, fleet.messages() or fleet.stderr[-2000:]
    assert summary.exists()
    outputs.append(("the snapshot playbook", fleet.stdout + fleet.stderr))

    found: List[str] = []
    for where, text in outputs:
        found += findings(where, text.encode(), secrets)
        assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in text, f"{where}: no masked option (not searched?)"
    searched = 0
    for path in files_under(lab.tmp):
        if path.parent == lab.tmp / "pki" or lab.tmp / "keys" in path.parents or path.name.startswith("play"):
            continue  # the test's own inputs: the keys it made, the playbooks naming the secrets it passes
        found += findings(str(path.relative_to(lab.tmp)), path.read_bytes(), node_secrets)
        searched += 1
    client = s3["client"]
    objects = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"])
               for o in page.get("Contents", [])]
    for name in objects:
        body = client.get_object(Bucket=s3["bucket"], Key=name, SSECustomerAlgorithm="AES256",
                                 SSECustomerKey=sse_c)["Body"].read()
        found += findings(f"s3://{s3['bucket']}/{name}", body, node_secrets)
    assert not found, found
    control = findings("the test's own playbook", (lab.tmp / "play2.yml").read_bytes(), secrets)
    control += findings("the key files", key.read_bytes() + (keys / "signing.key").read_bytes()
                        + (keys / "kek" / "fleet.key").read_bytes(), secrets)
    assert len(control) == 6, f"the search does not find what it looks for: {control}"
    manifest = client.get_object(Bucket=s3["bucket"], Key=f"fleet/snapshots/{snap['id']}/manifest.json",
                                 SSECustomerAlgorithm="AES256", SSECustomerKey=sse_c)["Body"].read().decode()
    assert f'"key_id": "{kid}"' in manifest, "the snapshot was not signed: the signing key was not used"
    assert '"encryption"' in manifest, "the snapshot was not encrypted: the KEK was not used"
    logs = [p.name for p in files_under(lab.tmp)]
    for wanted in ("restore.log", "lazy-pages.log", f"page-server-{ps_port}.log", "checkpoint.json", "restore.json",
                   "summary.json", "manifest.json"):
        assert wanted in logs, f"{wanted} was not searched (not written where expected): {sorted(set(logs))}"
    assert searched > 20 and len(objects) > 5, (searched, objects)


# --- no_log in the module specs -----------------------------------------------------------------

class _Captured(Exception):
    pass


def argument_spec(name: str, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """The argument spec module ``name`` hands to AnsibleModule (its main() stopped there)."""
    mod = importlib.import_module(f"ansible_collections.warmstart.snapshot.plugins.modules.{name}")
    seen: Dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs.get("argument_spec") or args[0])
        raise _Captured()

    monkeypatch.setattr(mod, "AnsibleModule", capture)
    with pytest.raises(_Captured):
        mod.main()
    return seen


def options(spec: Dict[str, Any], prefix: str = "") -> Iterator[Tuple[str, Dict[str, Any]]]:
    for name, opt in spec.items():
        yield prefix + name, opt
        if opt.get("options"):
            yield from options(opt["options"], f"{prefix}{name}.")


@pytest.mark.parametrize("module", MODULES)
def test_secret_options_are_no_log(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    problems = []
    for name, opt in options(argument_spec(module, monkeypatch)):
        leaf = name.rsplit(".", 1)[-1]
        if SECRET_NAME.search(leaf) and opt.get("no_log") is not True:
            problems.append(f"{name}: a secret, not no_log")
        elif "key" in leaf and opt.get("type", "str") == "str" and "no_log" not in opt:
            problems.append(f"{name}: a string named like a key, no explicit no_log")
    assert not problems, f"{module}: {problems}"


def test_the_secrets_the_collection_takes_are_covered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret options the end-to-end test above passes are no_log options the modules take (the test follows
    the modules' options; a secret option added to them belongs in COVERED and in that test)."""
    secret = {name.rsplit(".", 1)[-1] for module in ("checkpoint", "restore", "page_server", "snapshot_info", "cleanup")
              for name, opt in options(argument_spec(module, monkeypatch)) if opt.get("no_log") is True}
    assert COVERED <= secret, f"options the end-to-end test passes that are no secret option: {COVERED - secret}"
