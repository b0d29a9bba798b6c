"""The one container-map syntax (core._containermap), as ``into`` and the pod contract both read it."""
from __future__ import annotations

from typing import Any, List, Optional

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _containermap as cmap


@pytest.mark.parametrize("value, sources, want", [
    ("main=a, main=b,side=c", None, [("main", "a"), ("main", "b"), ("side", "c")]),
    (["main=a", ["side", "b"], {"src": "x", "dst": "c"}], None, [("main", "a"), ("side", "b"), ("x", "c")]),
    ({"main": ["a", "b"], "side": "c"}, None, [("main", "a"), ("main", "b"), ("side", "c")]),
    ("ph1", ["src"], [("src", "ph1")]),
    (["src=ph1", "ph2"], ["src"], [("src", "ph1"), ("src", "ph2")]),
    (None, ["src"], []),
    ("  ", None, []),
])
def test_forms(value: Any, sources: Optional[List[str]], want: List[Any]) -> None:
    assert cmap.read(value, sources) == (want, [])


@pytest.mark.parametrize("value, sources, needle", [
    ("a=ph,b=ph", ["a", "b"], "destination 'ph' already receives 'a'"),
    ("b=ph", ["a"], "the snapshot holds no container 'b' (it holds a)"),
    ("ph", ["a", "b"], "names no source container, and the snapshot holds 2 (a, b)"),
    ("ph", None, "entry 'ph' is not of the form src=dst"),
    ("a=", ["a"], "entry 'a=' has an empty destination"),
    ("a=x,,a=y", None, "has an empty entry"),
    ([42], None, "entry 42 is neither"),
    (42, None, "must be a string, list or mapping, not int"),
])
def test_problems_name_the_entry_and_the_cause(value: Any, sources: Optional[List[str]], needle: str) -> None:
    pairs, problems = cmap.read(value, sources)
    assert any(needle in p for p in problems), problems


def test_every_problem_at_once_and_the_good_pairs_kept() -> None:
    pairs, problems = cmap.read("a=x,b=x,c=,Bad=y", ["a", "b", "c", "Bad"], is_name=str.islower, name_rule="lower case")
    assert pairs == [("a", "x")]
    assert len(problems) == 3, problems
    assert "source 'Bad' is not lower case" in problems[2]


def test_format_is_canonical() -> None:
    assert cmap.format_map([("side", "c"), ("main", "b"), ("main", "a")]) == "main=a,main=b,side=c"
    assert cmap.read(cmap.format_map([("s", "d"), ("s", "e")])) == ([("s", "d"), ("s", "e")], [])
