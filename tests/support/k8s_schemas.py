"""The real schemas of Kubernetes' built-in objects (the ``kubernetes-validate`` package's, generated from the
OpenAPI of Kubernetes ``VERSION``), for the fake API server and for tests of what the collection renders.

``check(obj)`` answers every problem at once: the fields a real API server does not know (``unknown``: paths
such as ``spec.containers[0].bogus``) apart from every other violation (``invalid``: wrong types, missing
required fields, values outside an enum). ``prune(obj, unknown)`` drops the unknown fields, as a real server
does when field validation is ``Warn`` or ``Ignore``.
"""
from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jsonschema
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

VERSION = "1.37.0"  # the newest Kubernetes the pinned kubernetes-validate knows


@dataclass
class Problems:
    unknown: List[Tuple[Tuple[Any, ...], str]] = field(default_factory=list)  # (path to the object, field name)
    invalid: List[str] = field(default_factory=list)

    def unknown_paths(self) -> List[str]:
        return [dotted(tuple(path) + (name,)) for path, name in self.unknown]


def dotted(path: Sequence[Any]) -> str:
    """``spec.containers[0].name`` for ('spec', 'containers', 0, 'name')."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + str(part))
    return out


def _schema_dir(strict: bool) -> str:
    version = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(VERSION)][-1]
    return f"v{version}-local" + ("-strict" if strict else "")


@functools.lru_cache(maxsize=None)
def _validator(kind: str, api_version: str) -> Optional[Any]:
    """A Draft 2020-12 validator for ``kind`` (strict: unknown fields are errors); None for a kind it lacks."""
    directory = _schema_dir(strict=True)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(f"kubernetes-json-schema/{directory}/{kind.lower()}-{group_version}.json",
                                    VERSION)
    except FileNotFoundError:
        return None
    definitions = kv.schema_contents(f"kubernetes-json-schema/{directory}/_definitions.json", VERSION)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def known(kind: str, api_version: str) -> bool:
    return _validator(kind, api_version) is not None


def check(obj: Dict[str, Any]) -> Problems:
    """Every problem of ``obj`` against its kind's schema (none for a kind the schemas lack)."""
    out = Problems()
    validator = _validator(str(obj.get("kind")), str(obj.get("apiVersion")))
    if validator is None:
        return out
    for error in validator.iter_errors(obj):
        _classify(error, out)
    return out


def _classify(error: Any, out: Problems) -> None:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set((error.schema.get("properties") or {}))
        for name in sorted(set(error.instance) - allowed):
            out.unknown.append((path, name))
        return
    if error.context:  # anyOf / oneOf: the branch errors say more than "is not valid under any given schema"
        for sub in error.context:
            _classify(sub, out)
        return
    message = error.message
    if error.validator == "required":
        missing = re.search(r"'([^']+)' is a required property", message)
        where = dotted(path + ((missing.group(1),) if missing else ()))
        out.invalid.append(f"{where}: Required value")
    elif error.validator == "enum":
        supported = ", ".join(f'"{v}"' for v in error.validator_value)
        out.invalid.append(f"{dotted(path)}: Unsupported value: {error.instance!r}: supported values: {supported}")
    else:
        out.invalid.append(f"{dotted(path) or '<root>'}: Invalid value: {message}")


def prune(obj: Dict[str, Any], unknown: Sequence[Tuple[Tuple[Any, ...], str]]) -> Dict[str, Any]:
    """``obj`` without the unknown fields (a copy)."""
    out = copy.deepcopy(obj)
    for path, name in unknown:
        node: Any = out
        for part in path:
            node = node[part]
        if isinstance(node, dict):
            node.pop(name, None)
    return out
