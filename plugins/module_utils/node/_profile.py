# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Application profiles: how warmstart tells a stock server is warm, quiesces it and releases it (issue 34).

A server that knows nothing about warmstart's control files is described by a profile::

    name: vllm                       # shipped profiles: _profiles_shipped.SHIPPED
    vars: {port: 8000}               # {port} in any string below; a task overrides them
    ready:   {http: {url: "http://127.0.0.1:{port}/health"}, timeout: 900}
    quiesce: [{http: {url: "http://127.0.0.1:{port}/sleep?level=1", method: POST}}]
    resume:  [{http: {url: "http://127.0.0.1:{port}/wake_up", method: POST}}]
    release: [{http: {url: "http://127.0.0.1:{port}/wake_up", method: POST}}]
    serving: {http: {url: "http://127.0.0.1:{port}/health"}, timeout: 120}

- ``ready``: the probe that says the server is warm (``wait_ready`` of ``workload`` and ``checkpoint``);
- ``quiesce``: steps run on the source after it is ready and before anything is stopped (e.g. drop the KV
  cache); ``resume``: the steps that undo them, run on a source that keeps running after the dump and on one
  whose checkpoint failed;
- ``release``: steps run on a restored copy once CRIU let it go; ``serving``: the probe that says it serves
  again (default: ``ready``).

A probe is one of ``http`` (``url``, ``method`` GET, ``status`` [200], ``body`` regex), ``tcp`` (``port``,
``host`` 127.0.0.1), ``log`` (``regex`` over the server's ``stream`` stdout|stderr|any, or a ``path``),
``file`` (``path``) or ``control`` (true: the ``ready-for-snapshot`` control file), with ``timeout`` and
``interval`` in seconds. A step is one of ``http`` (``method`` POST, ``status``, ``json`` body), ``signal``
(a name such as SIGUSR1) or ``command`` (argv, run in the server's namespaces), with ``timeout``.

``parse`` checks a profile and lists every problem at once (``ProfileError.reasons``); ``resolve`` turns what a
task gives (a shipped name, a file, a mapping that names a shipped profile and overrides its vars, or a whole
profile) into a checked ``Profile`` with its vars filled in. This module only describes; ``_appsteps`` runs.
"""
from __future__ import annotations

import importlib
import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.node._profiles_shipped import SHIPPED

PROBE_KINDS = ("http", "tcp", "log", "file", "control")
STEP_KINDS = ("http", "signal", "command")
PHASES = ("quiesce", "resume", "release")
TOP_KEYS = frozenset({"name", "description", "written_for", "vars", "ready", "serving", *PHASES})
PROBE_DEFAULT_TIMEOUT = 300.0
STEP_DEFAULT_TIMEOUT = 60.0
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_FIELDS: Dict[str, Dict[str, type]] = {
    "probe.http": {"url": str, "method": str, "status": list, "body": str, "headers": dict},
    "probe.tcp": {"port": int, "host": str},
    "probe.log": {"regex": str, "stream": str, "path": str},
    "probe.file": {"path": str},
    "step.http": {"url": str, "method": str, "status": list, "json": object, "headers": dict},
}


class ProfileError(WarmstartError):
    """A profile that cannot be used; ``reasons`` lists every problem found."""


@dataclass(frozen=True)
class Probe:
    """How to tell a server is warm (or serving again): one check, retried every ``interval`` until ``timeout``."""

    kind: str
    spec: Dict[str, Any]
    timeout: float = PROBE_DEFAULT_TIMEOUT
    interval: float = 0.5

    def describe(self) -> str:
        if self.kind == "http":
            return f"HTTP {self.spec.get('method', 'GET')} {self.spec['url']}"
        if self.kind == "tcp":
            return f"TCP connect {self.spec.get('host', '127.0.0.1')}:{self.spec['port']}"
        if self.kind == "log":
            return f"log line /{self.spec['regex']}/ in {self.spec.get('path') or self.spec.get('stream', 'any')}"
        if self.kind == "file":
            return f"file {self.spec['path']}"
        return "control file ready-for-snapshot"


@dataclass(frozen=True)
class Step:
    """One action on a server: an HTTP call, a signal or a command, bounded by ``timeout`` seconds."""

    kind: str
    spec: Any
    timeout: float = STEP_DEFAULT_TIMEOUT

    def describe(self) -> str:
        if self.kind == "http":
            return f"HTTP {self.spec.get('method', 'POST')} {self.spec['url']}"
        if self.kind == "signal":
            return f"signal {self.spec}"
        return "command " + " ".join(self.spec)


@dataclass(frozen=True)
class Profile:
    """A checked profile, vars filled in."""

    name: str
    ready: Probe
    serving: Probe
    quiesce: Tuple[Step, ...] = ()
    resume: Tuple[Step, ...] = ()
    release: Tuple[Step, ...] = ()
    vars: Dict[str, Any] = field(default_factory=dict)
    description: str = ""
    written_for: str = ""
    source: Dict[str, Any] = field(default_factory=dict)  # the definition as given (vars not filled in)

    def record(self) -> Dict[str, Any]:
        """What a manifest keeps: the definition and the vars, enough to ``resolve`` it again on another node."""
        return {"name": self.name, "definition": self.source, "vars": dict(self.vars)}


def shipped_names() -> List[str]:
    return sorted(SHIPPED)


_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _fill(value: Any, variables: Mapping[str, Any], problems: List[str], where: str) -> Any:
    """``value`` with every ``{var}`` replaced in every string (a regex's ``{3}`` is no var); an unknown var is a
    problem."""
    if isinstance(value, str):
        missing = sorted({n for n in _VAR.findall(value) if n not in variables})
        if missing:
            problems.append(f"{where}: uses {', '.join('{' + n + '}' for n in missing)}, which vars does not define")
            return value
        return _VAR.sub(lambda m: str(variables[m.group(1)]), value)
    if isinstance(value, list):
        return [_fill(v, variables, problems, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _fill(v, variables, problems, f"{where}.{k}") for k, v in value.items()}
    return value


def _seconds(entry: Mapping[str, Any], key: str, default: float, where: str, problems: List[str]) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        problems.append(f"{where}.{key}: must be a number of seconds above 0, not {value!r}")
        return default
    return float(value)


def _check_fields(kind: str, spec: Any, where: str, problems: List[str]) -> None:
    """Types and allowed keys of one probe's or step's mapping."""
    allowed = _FIELDS[kind]
    if not isinstance(spec, dict):
        problems.append(f"{where}: must be a mapping, not {type(spec).__name__}")
        return
    for key in sorted(set(spec) - set(allowed)):
        problems.append(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")
    for key, want in allowed.items():
        if key in spec and want is not object and not isinstance(spec[key], want):
            problems.append(f"{where}.{key}: must be {want.__name__}, not {type(spec[key]).__name__}")
    if kind.endswith(".http"):
        url = spec.get("url")
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            problems.append(f"{where}.url: must be an http:// or https:// URL, not {url!r}")
        status = spec.get("status", [200])
        if not isinstance(status, list) or not status or not all(isinstance(s, int) and 100 <= s < 600 for s in status):
            problems.append(f"{where}.status: must be a list of HTTP status codes, not {status!r}")
        if isinstance(spec.get("method", ""), str) and spec.get("method", "GET").upper() not in (
                "GET", "POST", "PUT", "HEAD", "DELETE", "PATCH"):
            problems.append(f"{where}.method: {spec.get('method')!r} is not an HTTP method")
    for key in ("body", "regex"):
        if isinstance(spec.get(key), str):
            try:
                re.compile(spec[key])
            except re.error as exc:
                problems.append(f"{where}.{key}: the regex does not compile: {exc}")


def _one_kind(entry: Any, kinds: Sequence[str], extra: Sequence[str], where: str,
              problems: List[str]) -> Optional[str]:
    """The one kind ``entry`` (a mapping) has of ``kinds``, besides the keys ``extra``; None (and why) otherwise."""
    if not isinstance(entry, dict):
        problems.append(f"{where}: must be a mapping with one of {', '.join(kinds)}, not {entry!r}")
        return None
    have = [k for k in kinds if k in entry]
    for key in sorted(set(entry) - set(kinds) - set(extra)):
        problems.append(f"{where}: unknown key {key!r}")
    if len(have) != 1:
        problems.append(f"{where}: must have exactly one of {', '.join(kinds)} (has {', '.join(have) or 'none'})")
        return None
    return have[0]


def _probe(entry: Any, where: str, problems: List[str]) -> Optional[Probe]:
    kind = _one_kind(entry, PROBE_KINDS, ("timeout", "interval"), where, problems)
    if kind is None:
        return None
    spec = entry[kind]
    timeout = _seconds(entry, "timeout", PROBE_DEFAULT_TIMEOUT, where, problems)
    interval = _seconds(entry, "interval", 0.5, where, problems)
    if kind == "control":
        if spec is not True:
            problems.append(f"{where}.control: must be true")
        return Probe("control", {}, timeout, interval)
    _check_fields(f"probe.{kind}", spec, f"{where}.{kind}", problems)
    if not isinstance(spec, dict):
        return None
    if kind == "tcp" and not (isinstance(spec.get("port"), int) and 0 < spec["port"] < 65536):
        problems.append(f"{where}.tcp.port: must be a port number, not {spec.get('port')!r}")
    if kind == "log":
        if not isinstance(spec.get("regex"), str):
            problems.append(f"{where}.log.regex: required")
        if spec.get("stream", "any") not in ("stdout", "stderr", "any"):
            problems.append(f"{where}.log.stream: must be stdout, stderr or any, not {spec.get('stream')!r}")
    if kind in ("file", "log") and "path" in spec and not (isinstance(spec["path"], str) and spec["path"].startswith("/")):
        problems.append(f"{where}.{kind}.path: must be an absolute path, not {spec.get('path')!r}")
    if kind == "file" and "path" not in spec:
        problems.append(f"{where}.file.path: required")
    return Probe(kind, dict(spec), timeout, interval)


def _step(entry: Any, where: str, problems: List[str]) -> Optional[Step]:
    kind = _one_kind(entry, STEP_KINDS, ("timeout",), where, problems)
    if kind is None:
        return None
    spec = entry[kind]
    timeout = _seconds(entry, "timeout", STEP_DEFAULT_TIMEOUT, where, problems)
    if kind == "http":
        _check_fields("step.http", spec, f"{where}.http", problems)
        return Step("http", dict(spec) if isinstance(spec, dict) else {}, timeout)
    if kind == "signal":
        name = spec if isinstance(spec, str) else ""
        name = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        if not isinstance(spec, str) or not hasattr(signal, name) or name in ("SIGKILL", "SIGSTOP"):
            problems.append(f"{where}.signal: {spec!r} is not a signal a server can handle (e.g. SIGUSR1)")
        return Step("signal", name, timeout)
    if not (isinstance(spec, list) and spec and all(isinstance(a, str) for a in spec)):
        problems.append(f"{where}.command: must be a non-empty list of strings (argv), not {spec!r}")
        return None
    return Step("command", list(spec), timeout)


def parse(definition: Any, variables: Optional[Mapping[str, Any]] = None, what: str = "profile") -> Profile:
    """A checked ``Profile`` from a definition (vars filled in; ``variables`` override the profile's own)."""
    problems: List[str] = []
    if not isinstance(definition, dict):
        raise ProfileError(f"{what}: must be a mapping, not {type(definition).__name__}")
    for key in sorted(set(definition) - TOP_KEYS):
        problems.append(f"{what}: unknown key {key!r} (allowed: {', '.join(sorted(TOP_KEYS))})")
    name = definition.get("name", "custom")
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(f"{what}.name: {name!r} is not a profile name (lower case letters, digits, _ . -)")
    own = definition.get("vars") or {}
    if not isinstance(own, dict):
        problems.append(f"{what}.vars: must be a mapping")
        own = {}
    merged = {**own, **dict(variables or {})}
    for key, value in merged.items():
        if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, (str, int, float)) \
                or isinstance(value, bool):
            problems.append(f"{what}.vars.{key}: must map a name to a string or number, not {value!r}")
    filled = _fill({k: v for k, v in definition.items() if k not in ("vars", "description", "written_for")},
                   merged, problems, what)
    ready = _probe(filled.get("ready"), f"{what}.ready", problems) if "ready" in filled else None
    if "ready" not in filled:
        problems.append(f"{what}.ready: required (how to tell the server is warm)")
    serving = _probe(filled["serving"], f"{what}.serving", problems) if "serving" in filled else ready
    phases: Dict[str, Tuple[Step, ...]] = {}
    for phase in PHASES:
        steps = filled.get(phase) or []
        if not isinstance(steps, list):
            problems.append(f"{what}.{phase}: must be a list of steps")
            steps = []
        parsed = [_step(s, f"{what}.{phase}[{i}]", problems) for i, s in enumerate(steps)]
        phases[phase] = tuple(s for s in parsed if s is not None)
    if problems or ready is None or serving is None:
        raise ProfileError(f"{what} {name!r} cannot be used: {len(problems)} problem(s)", reasons=problems)
    return Profile(name=name, ready=ready, serving=serving, vars=merged, source=dict(definition),
                   description=str(definition.get("description", "")),
                   written_for=str(definition.get("written_for", "")), **phases)


def resolve(given: Any, what: str = "profile") -> Optional[Profile]:
    """The profile a task names: None, a shipped name, an absolute path to a JSON or YAML file, a mapping
    ``{name: <shipped>, vars: {...}}`` (a shipped profile with other vars) or a whole definition."""
    if given is None or given == "" or given == {}:
        return None
    if isinstance(given, str):
        if given.startswith("/"):
            return parse(_load_file(given, what), what=f"{what} file {given}")
        if given not in SHIPPED:
            raise ProfileError(f"{what}: no shipped profile is called {given!r} "
                               f"(shipped: {', '.join(shipped_names())}; or give a path or a mapping)")
        return parse(SHIPPED[given], what=f"{what} {given}")
    if isinstance(given, dict):
        base = given.get("name")
        if isinstance(base, str) and base in SHIPPED and not (set(given) - {"name", "vars"}):
            extra = given.get("vars") or {}
            if not isinstance(extra, dict):
                raise ProfileError(f"{what}.vars: must be a mapping")
            return parse(SHIPPED[base], extra, what=f"{what} {base}")
        return parse(given, what=what)
    raise ProfileError(f"{what}: must be a shipped profile's name, a file's path or a mapping, not {given!r}")


def from_record(record: Any) -> Optional[Profile]:
    """The profile a manifest recorded (``Profile.record``), checked again: the store is input."""
    if not record:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("definition"), dict):
        raise ProfileError("the snapshot's profile record is malformed")
    return parse(record["definition"], record.get("vars") or {}, what=f"the snapshot's profile {record.get('name')!r}")


def _load_file(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError as exc:
        raise ProfileError(f"{what}: cannot read {path}: {exc.strerror}") from None
    return load_text(data.decode("utf-8", errors="replace"), f"{what}: {path}")


def load_text(text: str, what: str) -> Any:
    """A profile's definition from its text: JSON, or YAML where PyYAML is installed (``what`` names the source)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        yaml: Any = importlib.import_module("yaml")  # PyYAML, where the node has it
    except ImportError:
        raise ProfileError(f"{what} is not JSON, and PyYAML is not installed to read YAML") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{what} is neither JSON nor YAML: {exc}") from None
