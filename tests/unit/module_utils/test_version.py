"""Version parsing and comparison (_version)."""
from __future__ import annotations

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._version import (
    compare_versions,
    parse_version,
    version_at_least,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6.18.44-fc-v1045", (6, 18, 44)),
        ("5.12", (5, 12)),
        ("4.2.1", (4, 2, 1)),
        ("v4.2", (4, 2)),
        ("6.8.0-45-generic", (6, 8, 0)),
        ("5.15.0+rc1", (5, 15, 0)),
        ("  580.65.06\n", (580, 65, 6)),
        ("13", (13,)),
    ],
)
def test_parse_version(text: str, expected: tuple) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "Version: 4.2", "-1.2", ".5"])
def test_parse_version_rejects_non_versions(text: str) -> None:
    with pytest.raises(ValueError, match="not a version string"):
        parse_version(text)


@pytest.mark.parametrize(
    ("actual", "minimum", "ok"),
    [
        ("6.18.44-fc-v1045", "5.12", True),
        ("5.11.0", "5.12", False),
        ("5.12", "5.12", True),
        ("5.12.0", "5.12", True),
        ("5.12.1-arch1", "5.12", True),
        ("5.2", "5.12", False),  # numeric, not lexical
        ("4.2.1", "4.2", True),
        ("3.17.1", "4.2", False),
        ("10.0", "9.99.99", True),
    ],
)
def test_version_at_least(actual: str, minimum: str, ok: bool) -> None:
    assert version_at_least(actual, minimum) is ok


def test_compare_versions_pads_missing_parts() -> None:
    assert compare_versions("5.12", "5.12.0") == 0
    assert compare_versions("5.12", "5.12.1") == -1
    assert compare_versions("6.1", "5.19.9") == 1
