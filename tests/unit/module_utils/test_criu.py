"""CRIU lookup, version, check and feature probes (_criu), against a fake and the real CRIU."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu._criu import (
    FEATURES,
    CriuError,
    criu_check,
    criu_info,
    criu_version,
    find_criu,
    parse_version_output,
    probe_features,
    run_criu,
)


def make_fake_criu(
    directory: Path,
    version_out: str = "Version: 4.2.1\n",
    version_rc: int = 0,
    check_out: str = "Looks good.\n",
    check_rc: int = 0,
    features_ok: Iterable[str] = ("uffd", "timens"),
    sleep: Optional[float] = None,
    name: str = "criu",
) -> Path:
    """Write a shell script that answers like criu: --version, check, check --feature NAME."""
    directory.mkdir(parents=True, exist_ok=True)
    ok = " ".join(features_ok)
    nap = f"sleep {sleep}\n" if sleep else ""
    script = f"""#!/bin/sh
{nap}case "$1" in
  --version) printf '%s' '{version_out}'; exit {version_rc} ;;
  check)
    if [ "$2" = "--feature" ]; then
      for f in {ok}; do
        if [ "$f" = "$3" ]; then echo "$3 is supported"; exit 0; fi
      done
      echo "Warn (criu/cr-check.c:824): $3 is not supported" >&2
      exit 1
    fi
    printf '%s' '{check_out}' >&2
    exit {check_rc} ;;
esac
echo "unexpected args: $*" >&2
exit 2
"""
    path = directory / name
    path.write_text(script)
    path.chmod(0o755)
    return path


# --- find_criu -------------------------------------------------------------


def test_find_explicit_path(tmp_path: Path) -> None:
    fake = make_fake_criu(tmp_path)
    assert find_criu(str(fake), candidates=(), search_path="") == str(fake)


@pytest.mark.parametrize("kind", ["missing", "not-executable", "directory"])
def test_find_explicit_path_that_is_not_executable_raises(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "criu"
    if kind == "not-executable":
        target.write_text("#!/bin/sh\n")
        target.chmod(0o644)
    elif kind == "directory":
        target.mkdir()
    with pytest.raises(CriuError, match="is not an executable file"):
        find_criu(str(target))


def test_find_prefers_candidates_in_order_and_skips_unusable_ones(tmp_path: Path) -> None:
    plain_file = tmp_path / "a" / "criu"
    plain_file.parent.mkdir()
    plain_file.write_text("not executable")
    second = make_fake_criu(tmp_path / "b")
    third = make_fake_criu(tmp_path / "c")
    on_path = make_fake_criu(tmp_path / "bin")
    found = find_criu(None, candidates=(str(tmp_path / "none"), str(plain_file), str(second), str(third)),
                      search_path=str(on_path.parent))
    assert found == str(second)


def test_find_falls_back_to_search_path(tmp_path: Path) -> None:
    on_path = make_fake_criu(tmp_path / "bin")
    assert find_criu(None, candidates=(str(tmp_path / "none"),), search_path=str(on_path.parent)) == str(on_path)


def test_find_nothing_returns_none(tmp_path: Path) -> None:
    assert find_criu(None, candidates=(str(tmp_path / "none"),), search_path=str(tmp_path)) is None


# --- version ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version", "gitid"),
    [
        ("Version: 4.2.1\n", "4.2.1", None),
        ("Version: 4.2\nGitID: v4.2-15-g1a2b3c4\n", "4.2", "v4.2-15-g1a2b3c4"),
        ("criu 3.17.1\n", "3.17.1", None),
        ("something else\n", None, None),
    ],
)
def test_parse_version_output(text: str, version: Optional[str], gitid: Optional[str]) -> None:
    assert parse_version_output(text) == {"version": version, "gitid": gitid}


def test_criu_version_from_fake(tmp_path: Path) -> None:
    fake = make_fake_criu(tmp_path, version_out="Version: 4.2\nGitID: v4.2-7-gdeadbee\n")
    assert criu_version(str(fake)) == {"version": "4.2", "gitid": "v4.2-7-gdeadbee"}


def test_criu_version_failure_raises_with_output(tmp_path: Path) -> None:
    fake = make_fake_criu(tmp_path, version_out="libprotobuf-c.so.1: cannot open shared object file\n", version_rc=127)
    with pytest.raises(CriuError) as info:
        criu_version(str(fake))
    assert "rc=127" in str(info.value)
    assert "libprotobuf-c.so.1" in str(info.value)
    assert info.value.log_tail is not None and "libprotobuf-c.so.1" in info.value.log_tail


# --- check -----------------------------------------------------------------


def test_check_looks_good(tmp_path: Path) -> None:
    result = criu_check(str(make_fake_criu(tmp_path)))
    assert result.ok is True
    assert result.output == "Looks good."


def test_check_failure_keeps_criu_words(tmp_path: Path) -> None:
    message = (
        "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds\n"
        "Error (criu/crtools.c:260): Could not initialize kernel features detection.\n"
    )
    result = criu_check(str(make_fake_criu(tmp_path, check_out=message, check_rc=1)))
    assert result.ok is False
    assert result.output == message.strip()


def test_check_maybe_is_not_ok(tmp_path: Path) -> None:
    maybe = "Looks good but some kernel features are missing\nwhich, depending on your process tree, may cause\n"
    result = criu_check(str(make_fake_criu(tmp_path, check_out=maybe, check_rc=1)))
    assert result.ok is False
    assert result.output.startswith("Looks good but")


def test_check_rc0_without_verdict_is_not_ok(tmp_path: Path) -> None:
    assert criu_check(str(make_fake_criu(tmp_path, check_out="", check_rc=0))).ok is False


def test_check_silent_failure_says_so(tmp_path: Path) -> None:
    result = criu_check(str(make_fake_criu(tmp_path, check_out="", check_rc=3)))
    assert result.ok is False
    assert result.output == "criu check failed with rc=3 and no output"


def test_check_timeout(tmp_path: Path) -> None:
    result = criu_check(str(make_fake_criu(tmp_path, sleep=5)), timeout=0.3)
    assert result.ok is False
    assert "did not finish within 0.3s" in result.output


def test_run_criu_errors(tmp_path: Path) -> None:
    with pytest.raises(CriuError, match="did not finish"):
        run_criu(str(make_fake_criu(tmp_path, sleep=5)), ["check"], timeout=0.3)
    with pytest.raises(CriuError, match="cannot run"):
        run_criu(str(tmp_path / "absent"), ["check"], timeout=1)


# --- features and the whole picture ---------------------------------------


def test_probe_features(tmp_path: Path) -> None:
    fake = make_fake_criu(tmp_path, features_ok=("uffd", "uffd-noncoop", "pidfd_store"))
    assert probe_features(str(fake)) == {
        "uffd": True,
        "uffd-noncoop": True,
        "mem_dirty_track": False,
        "pidfd_store": True,
        "timens": False,
        "network_lock_nftables": False,
    }


def test_criu_info_found(tmp_path: Path) -> None:
    fake = make_fake_criu(tmp_path, features_ok=("timens",))
    info = criu_info(str(fake))
    assert info["found"] is True
    assert info["path"] == str(fake)
    assert info["version"] == "4.2.1"
    assert info["check_ok"] is True
    assert info["check_output"] == "Looks good."
    assert info["features"] == {name: name == "timens" for name in FEATURES}


def test_criu_info_without_feature_probes(tmp_path: Path) -> None:
    info = criu_info(str(make_fake_criu(tmp_path)), features=False)
    assert info["features"] == {}
    assert info["check_ok"] is True


def test_criu_info_not_found(tmp_path: Path) -> None:
    info = criu_info(None, candidates=(str(tmp_path / "criu"),), search_path=str(tmp_path))
    assert info["found"] is False
    assert info["path"] is None and info["version"] is None
    assert info["check_ok"] is False
    assert "criu not found" in info["check_output"]
    assert info["features"] == {name: False for name in FEATURES}


def test_criu_info_broken_binary(tmp_path: Path) -> None:
    fake = make_fake_criu(tmp_path, version_out="Segmentation fault\n", version_rc=139)
    info = criu_info(str(fake))
    assert info["found"] is True
    assert info["version"] is None
    assert info["check_ok"] is False
    assert "Segmentation fault" in info["check_output"]


def test_criu_error_carries_log_tail() -> None:
    err = CriuError("dump failed", log_tail="Error (criu/cr-dump.c:1): oops")
    assert str(err) == "dump failed"
    assert err.message == "dump failed"
    assert err.log_tail == "Error (criu/cr-dump.c:1): oops"
    assert CriuError("x").log_tail is None
