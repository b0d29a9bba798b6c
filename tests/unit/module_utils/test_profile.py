"""node/_profile: application profiles are checked whole (every problem at once), shipped ones parse, vars fill in."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.node import _profile as pf
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._profiles_shipped import SHIPPED

SERVERS = {"vllm", "sglang", "tgi", "llama-cpp", "ollama", "triton", "tei", "mlserver", "generic-http"}


def test_every_shipped_profile_parses_and_says_what_it_was_written_for() -> None:
    assert SERVERS <= set(pf.shipped_names())
    for name in pf.shipped_names():
        profile = pf.resolve(name)
        assert profile is not None and profile.name == name
        assert profile.description and profile.written_for, name
        assert profile.ready.kind == "http" and profile.ready.spec["url"].startswith("http://127.0.0.1:")
        assert "{" not in profile.ready.spec["url"], f"{name}: a var left unfilled"
        if profile.quiesce:  # what a quiesce does to the server, something must undo on a source that keeps running
            assert profile.resume and profile.release, name


def test_a_shipped_profile_takes_other_vars() -> None:
    profile = pf.resolve({"name": "vllm-sleep", "vars": {"port": 8001, "level": 2}})
    assert profile is not None
    assert profile.ready.spec["url"] == "http://127.0.0.1:8001/health"
    assert profile.quiesce[0].spec["url"] == "http://127.0.0.1:8001/sleep?level=2"
    assert profile.record()["vars"]["port"] == 8001


def test_a_bad_profile_is_refused_with_every_problem_at_once() -> None:
    bad: Dict[str, Any] = {
        "name": "Not Ok", "colour": "red",
        "ready": {"http": {"url": "ftp://x/{nope}", "status": [999], "body": "(unclosed"}, "timeout": -1},
        "quiesce": [{"signal": "SIGKILL"}, {"command": "not a list"}, {"tcp": {"port": 1}}],
        "release": {"http": {"url": "http://127.0.0.1/x"}},
        "serving": {"log": {"stream": "stdin"}},
    }
    with pytest.raises(pf.ProfileError) as err:
        pf.resolve(bad)
    reasons = "\n".join(err.value.reasons)
    for expected in ("unknown key 'colour'", "'Not Ok' is not a profile name", "{nope}", "status: must be a list",
                     "body: the regex does not compile", "timeout: must be a number", "'SIGKILL' is not a signal",
                     "command: must be a non-empty list", "must have exactly one of", "release: must be a list",
                     "log.regex: required", "stream: must be stdout, stderr or any"):
        assert expected in reasons, expected
    assert len(err.value.reasons) >= 12 and "cannot be used" in str(err.value)


def test_a_profile_needs_a_ready_probe() -> None:
    with pytest.raises(pf.ProfileError) as err:
        pf.resolve({"name": "x", "quiesce": []})
    assert any("ready: required" in r for r in err.value.reasons)


def test_an_unknown_name_lists_the_shipped_ones() -> None:
    with pytest.raises(pf.ProfileError, match="no shipped profile is called 'vlm'.*vllm"):
        pf.resolve("vlm")


def test_vars_fill_names_only_never_a_regex_quantifier() -> None:
    profile = pf.resolve({"name": "x", "vars": {"port": 9}, "ready": {"http": {
        "url": "http://127.0.0.1:{port}/", "body": "^a{2}b{1,3}$"}}})
    assert profile is not None
    assert profile.ready.spec == {"url": "http://127.0.0.1:9/", "body": "^a{2}b{1,3}$"}


def test_a_profile_file_json_or_yaml(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({"name": "mine", "ready": {"tcp": {"port": 80}}}))
    (tmp_path / "p.yaml").write_text("name: mine\nready:\n  file: {path: /tmp/ready}\n")
    assert pf.resolve(str(tmp_path / "p.json")).ready.kind == "tcp"  # type: ignore[union-attr]
    assert pf.resolve(str(tmp_path / "p.yaml")).ready.kind == "file"  # type: ignore[union-attr]
    with pytest.raises(pf.ProfileError, match="cannot read"):
        pf.resolve(str(tmp_path / "missing.json"))


def test_a_recorded_profile_is_checked_again() -> None:
    profile = pf.resolve({"name": "tgi", "vars": {"port": 8080}})
    assert profile is not None
    again = pf.from_record(json.loads(json.dumps(profile.record())))
    assert again is not None and again.ready == profile.ready and again.vars["port"] == 8080
    with pytest.raises(pf.ProfileError, match="malformed"):
        pf.from_record({"name": "x", "definition": "rm -rf /"})
    tampered = profile.record()
    tampered["definition"] = dict(tampered["definition"], quiesce=[{"command": 5}])
    with pytest.raises(pf.ProfileError):
        pf.from_record(tampered)


def test_no_profile_is_none() -> None:
    assert pf.resolve(None) is None and pf.resolve("") is None and pf.from_record(None) is None


def test_every_shipped_entry_is_keyed_by_its_name() -> None:
    assert all(SHIPPED[key]["name"] == key for key in SHIPPED)
