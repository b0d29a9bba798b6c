"""The shape the engine promises to keep (issue 19), checked on the source itself.

- plugins/module_utils imports nothing from Ansible, and its modules import each other without cycles;
- its packages are layers (``LAYERS``, drawn in docs/architecture.md): a package imports only from packages on
  lower rows, never from one on its own row or above;
- no function there is longer than MAX_FUNCTION_LINES, no file longer than MAX_FILE_LINES;
- every exception class the engine defines derives from _errors.WarmstartError;
- every module's main() is its AnsibleModule argument spec plus one run_module() call;
- every module ships (imports, directly or through other engine files) exactly one runner file, its own
  (runners/_<module>.py), besides _adapter, _specs and _common, and the modules that only read the node or a
  store ship nothing of the snapshot engine, the Kubernetes client or the agent (issue 33);
- no test module imports another test module, and bench scripts do not edit sys.path;
- no file is written, chmod'ed or chown'ed by path outside _safefs (issue 32): no os.chmod/os.chown/os.lchown/
  shutil.chown, no open() for writing, and every os.open that writes has O_NOFOLLOW and creates only with O_EXCL
  or relative to a directory descriptor.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"
ENGINE = PLUGINS / "module_utils"
PACKAGE = "ansible_collections.warmstart.snapshot.plugins.module_utils"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


# The engine's packages, lowest first. A package imports only from packages on lower rows: packages on one
# row never import each other. docs/architecture.md draws this table.
LAYERS = [
    ("core",),                       # errors, safe file operations, processes, namespaces, progress, paths, TLS
    ("criu", "accel", "runtime"),    # CRIU itself; GPU and NPU checkpoint APIs; container runtimes
    ("store",),                      # manifests, checksums, the file system, S3 and peer stores, signing, compression
    ("catalog", "node"),             # listing, retention, cleanup; this node: facts, compatibility, workloads, metrics
    ("snapshot", "k8s"),             # checkpoint and restore of processes and containers; the Kubernetes API
    ("agent",),                      # the node agent for Kubernetes
    ("runners",),                    # what each Ansible module runs
]
RANK = {package: row for row, packages in enumerate(LAYERS) for package in packages}


def _engine_files() -> List[Path]:
    return sorted(p for p in ENGINE.rglob("_*.py") if p.name != "__init__.py")


def _module_name(path: Path) -> str:
    """``store.security._signing`` for plugins/module_utils/store/security/_signing.py."""
    return ".".join(path.relative_to(ENGINE).with_suffix("").parts)


def _imports(tree: ast.Module) -> Set[str]:
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module.startswith(PACKAGE):
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_engine_files_exist() -> None:
    assert len(_engine_files()) > 20


@pytest.mark.parametrize("path", _engine_files(), ids=lambda p: p.name)
def test_engine_does_not_import_ansible(path: Path) -> None:
    bad = sorted(n for n in _imports(_tree(path)) if n == "ansible" or n.startswith("ansible."))
    assert not bad, f"{path.name} imports {bad}: the engine stays free of Ansible"


@pytest.mark.parametrize("path", _engine_files(), ids=lambda p: p.name)
def test_engine_functions_are_short(path: Path) -> None:
    long = [f"{node.name} (line {node.lineno}, {node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def test_engine_files_hold_one_concept_each() -> None:
    """A reader finds a concept in one file of a few hundred lines: none grows past MAX_FILE_LINES."""
    big = [f"{_module_name(p)} ({n} lines)" for p in _engine_files()
           if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not big, f"engine files over {MAX_FILE_LINES} lines, split them along their seams: {', '.join(big)}"


def _engine_graph() -> Dict[str, Set[str]]:
    """{engine module: the engine modules it imports}, as ``store._store`` (names imported from a module, such
    as a class, are dropped: only module files count)."""
    modules = {_module_name(p) for p in _engine_files()}
    graph: Dict[str, Set[str]] = {}
    for path in _engine_files():
        name = _module_name(path)
        deps = {n[len(PACKAGE) + 1:] for n in _imports(_tree(path)) if n.startswith(PACKAGE + ".")}
        graph[name] = (deps & modules) - {name}
    return graph


def _layer_problems(graph: Dict[str, Set[str]]) -> List[str]:
    """Every import from a package on the importer's row or above (``LAYERS``), and every package not in it."""
    problems = []
    for name, deps in sorted(graph.items()):
        home = name.split(".")[0]
        if home not in RANK:
            problems.append(f"{name}: package {home!r} is on no row of LAYERS")
            continue
        for dep in sorted(deps):
            there = dep.split(".")[0]
            if there != home and RANK.get(there, len(LAYERS)) >= RANK[home]:
                problems.append(f"{name} imports {dep}: {there} is not below {home}")
    return problems


def test_engine_packages_are_layers() -> None:
    problems = _layer_problems(_engine_graph())
    assert not problems, "wrong-way imports in plugins/module_utils:\n" + "\n".join(problems)


def test_the_layer_rule_catches_the_wrong_way_imports_it_was_made_for() -> None:
    """The two imports review found going the wrong way (TLS pulling in the signing store for the keys dir,
    the accelerator API taking its node type from the compatibility check), and one between packages of a row."""
    graph = {"core._tls": {"store.security._securestore"}, "accel._accel": {"node._compat"},
             "snapshot._snapshot": {"k8s._podcontract"}, "store._store": {"core._safefs"}}
    assert _layer_problems(graph) == [
        "accel._accel imports node._compat: node is not below accel",
        "core._tls imports store.security._securestore: store is not below core",
        "snapshot._snapshot imports k8s._podcontract: k8s is not below snapshot",
    ]


def test_engine_imports_have_no_cycle() -> None:
    graph = _engine_graph()
    state: Dict[str, int] = {}
    cycles: List[str] = []

    def visit(name: str, trail: List[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(trail[trail.index(dep):] + [dep]) if dep in trail else f"{name} -> {dep}")
            elif dep not in state:
                visit(dep, trail + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles in plugins/module_utils: " + "; ".join(cycles)


def test_every_engine_error_derives_from_the_root() -> None:
    root = importlib.import_module(f"{PACKAGE}.core._errors").WarmstartError
    strays = []
    for path in _engine_files():
        module = importlib.import_module(f"{PACKAGE}.{_module_name(path)}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, BaseException) and not issubclass(cls, root):
                strays.append(f"{path.stem}.{name}")
    assert not strays, f"engine errors outside WarmstartError: {strays}"


def _main(path: Path) -> ast.FunctionDef:
    found = [n for n in _tree(path).body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert found, f"{path.name} has no main()"
    return found[0]


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


@pytest.mark.parametrize("path", sorted((PLUGINS / "modules").glob("*.py")), ids=lambda p: p.name)
def test_module_main_is_spec_and_one_adapter_call(path: Path) -> None:
    body = _main(path).body
    shape = []
    for stmt in body:
        if isinstance(stmt, ast.Assign) and _call_name(stmt.value) == "AnsibleModule":
            shape.append("spec")
        elif isinstance(stmt, ast.Expr) and _call_name(stmt.value) == "run_module":
            shape.append("run")
        else:
            shape.append(type(stmt).__name__)
    assert shape == ["spec", "run"], f"{path.name}: main() is {shape}, not an argument spec and one run_module() call"


# --- what each module ships (issue 33) -------------------------------------------------------------------------------

# Runner files any module may ship besides its own runners/_<module>.py.
SHARED_RUNNER_FILES = {"runners._adapter", "runners._specs", "runners._common"}
# Modules that read the node or a store (or make the fleet key): none ships a file of these packages.
NODE_MODULES = ("node_info", "workload", "fleet_key", "snapshot_info", "cleanup")
NOT_FOR_NODE_MODULES = ("snapshot", "k8s", "agent")


@functools.lru_cache(maxsize=None)
def _engine_graph_once() -> Dict[str, Set[str]]:
    """``_engine_graph()``, computed once for the per-module tests below (they only read it)."""
    return _engine_graph()


def _shipped(path: Path, graph: Dict[str, Set[str]]) -> Set[str]:
    """The engine files a module file ships: the ones it imports and, transitively, everything they import."""
    todo = [n[len(PACKAGE) + 1:] for n in _imports(_tree(path)) if n.startswith(PACKAGE + ".")]
    shipped: Set[str] = set()
    while todo:
        name = todo.pop()
        if name in graph and name not in shipped:
            shipped.add(name)
            todo.extend(graph[name])
    return shipped


def _shipping_problems(module: str, shipped: Set[str]) -> List[str]:
    """What is wrong with the engine files ``module`` ships (``_shipped``), each naming the unexpected files."""
    problems = []
    runners = sorted(n for n in shipped if n.split(".")[0] == "runners" and n not in SHARED_RUNNER_FILES)
    if runners != [f"runners._{module}"]:
        problems.append(f"runner files {', '.join(runners) or 'none'}: it ships exactly one, runners._{module} "
                        f"(besides {', '.join(sorted(SHARED_RUNNER_FILES))})")
    banned = sorted(n for n in shipped if module in NODE_MODULES and n.split(".")[0] in NOT_FOR_NODE_MODULES)
    if banned:
        problems.append(f"{', '.join(banned)}: it ships nothing of {', '.join(NOT_FOR_NODE_MODULES)}")
    return problems


@pytest.mark.parametrize("path", sorted((PLUGINS / "modules").glob("*.py")), ids=lambda p: p.name)
def test_each_module_ships_its_own_runner_and_what_that_needs(path: Path) -> None:
    problems = _shipping_problems(path.stem, _shipped(path, _engine_graph_once()))
    assert not problems, f"module {path.stem} ships " + "; ".join(problems)


def test_the_shipping_rule_catches_the_hub_it_was_made_for() -> None:
    """A node module shipping the one runner file of every module (the old runners/_module.py, which pulled in the
    snapshot engine), a module shipping another module's runner, and one shipping none."""
    hub = {"runners._adapter", "runners._module", "snapshot._restore", "k8s._k8s_client", "node._node"}
    assert _shipping_problems("node_info", hub) == [
        "runner files runners._module: it ships exactly one, runners._node_info "
        "(besides runners._adapter, runners._common, runners._specs)",
        "k8s._k8s_client, snapshot._restore: it ships nothing of snapshot, k8s, agent",
    ]
    assert _shipping_problems("restore", {"runners._restore", "runners._checkpoint", "runners._common"}) == [
        "runner files runners._checkpoint, runners._restore: it ships exactly one, runners._restore "
        "(besides runners._adapter, runners._common, runners._specs)"]
    assert _shipping_problems("restore_pod", {"runners._adapter", "k8s._k8s_client"})[0].startswith("runner files none")
    assert _shipping_problems("workload", {"runners._workload", "runners._adapter", "runners._specs",
                                           "node._workload"}) == []
    assert _shipping_problems("restore", {"runners._restore", "runners._common", "snapshot._restore"}) == []


REPO = PLUGINS.parent


def _test_module_imports(path: Path) -> List[str]:
    """Test modules a test file imports (``test_x``, ``.test_x``, ``tests.unit.test_x``, ...)."""
    found = []
    for node in ast.walk(_tree(path)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
        found += [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another() -> None:
    bad = {str(p.relative_to(REPO)): _test_module_imports(p) for p in sorted((REPO / "tests").rglob("*.py"))
           if "output" not in p.parts}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"test modules importing test modules (shared helpers go to tests/support or a *_lab.py): {bad}"


def test_bench_shares_code_through_its_package() -> None:
    edits = [str(p.relative_to(REPO)) for p in sorted((REPO / "bench").glob("*.py"))
             if p.name != "__init__.py" and re.search(r"sys\.path\.(insert|append|extend)|sys\.path\[", p.read_text())]
    assert not edits, f"bench scripts editing sys.path (import through the bench package instead): {edits}"


# --- file operations by path (issue 32, class 2) -------------------------------------------------------------------

BY_PATH_CALLS = {("os", "chmod"), ("os", "chown"), ("os", "lchown"), ("shutil", "chown"), ("os", "lchmod")}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}


def _flag_names(node: ast.AST) -> Set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr.startswith("O_")} | \
        {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id.startswith("O_")}


def _by_path_problems(tree: ast.Module) -> List[str]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        dotted = (func.value.id, func.attr) if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            else None
        if dotted in BY_PATH_CALLS:
            out.append(f"line {node.lineno}: {'.'.join(dotted)} by path (use _safefs.set_mode or fchmod/fchown)")
        if isinstance(func, ast.Name) and func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                out.append(f"line {node.lineno}: open(..., {mode.value!r}) by path (use _safefs.write_file/open_file)")
        if dotted == ("os", "open") and len(node.args) > 1:
            flags = _flag_names(node.args[1])
            if flags & WRITE_FLAGS:
                if "O_NOFOLLOW" not in flags:
                    out.append(f"line {node.lineno}: os.open for writing without O_NOFOLLOW")
                if "O_CREAT" in flags and "O_EXCL" not in flags and not any(k.arg == "dir_fd" for k in node.keywords):
                    out.append(f"line {node.lineno}: os.open(O_CREAT) without O_EXCL or a dir_fd")
    return out


@pytest.mark.parametrize("path", [p for p in _engine_files() if p.name != "_safefs.py"], ids=lambda p: p.name)
def test_no_file_is_written_chmodded_or_chowned_by_path(path: Path) -> None:
    found = _by_path_problems(_tree(path))
    assert not found, f"{path.name}: " + "; ".join(found)


def test_the_by_path_rule_catches_what_it_names() -> None:
    bad = ast.parse("import os, shutil\nos.chmod(p, 0o600)\nopen(p, 'w')\nos.open(p, os.O_WRONLY | os.O_CREAT, 0o600)\n"
                    "shutil.chown(p, 0, 0)\nos.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)\n")
    assert len(_by_path_problems(bad)) == 6
    good = ast.parse("import os\nos.open(p, os.O_RDONLY)\nos.open(n, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=d)\n"
                     "os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)\nopen(p, 'rb')\nos.fchmod(f, 0o600)\n")
    assert _by_path_problems(good) == []


def test_action_groups_follow_the_auth_a_module_takes() -> None:
    """module_defaults by group: every module taking the Kubernetes auth options (doc fragment k8s_auth) is in
    the ``k8s`` group, every other module in ``snapshot`` - one group each, none left out."""
    import yaml  # pylint: disable=import-outside-toplevel

    groups = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["action_groups"]
    modules = sorted(p.stem for p in (PLUGINS / "modules").glob("*.py") if p.stem != "__init__")
    takes_auth = {m for m in modules if "warmstart.snapshot.k8s_auth" in (PLUGINS / "modules" / f"{m}.py").read_text()}
    assert sorted(groups) == ["k8s", "snapshot"]
    assert sorted(groups["k8s"]) == sorted(takes_auth)
    assert sorted(groups["snapshot"]) == sorted(set(modules) - takes_auth)


DURATION_NAME = re.compile(r"(^|_)(timeout|age|older_than)$")


def _documented_options(path: Path) -> Dict[str, dict]:
    """Every option of a module's DOCUMENTATION, suboptions as ``parent.child``."""
    import yaml  # pylint: disable=import-outside-toplevel

    doc = next(n.value.value for n in _tree(path).body if isinstance(n, ast.Assign)
               and getattr(n.targets[0], "id", "") == "DOCUMENTATION")
    out: Dict[str, dict] = {}

    def walk(options: Dict[str, dict], prefix: str) -> None:
        for name, spec in (options or {}).items():
            out[prefix + name] = spec
            walk(spec.get("suboptions") or {}, f"{prefix}{name}.")
    walk(yaml.safe_load(doc).get("options") or {}, "")
    return out


@pytest.mark.parametrize("path", sorted((PLUGINS / "modules").glob("[a-z]*.py")), ids=lambda p: p.name)
def test_every_duration_option_is_one_type(path: Path) -> None:
    """One duration type: every option named like a length of time is one of ``_duration.OPTIONS`` (which the
    adapter turns into float seconds), typed raw (seconds or ``30m``, ``12h``, ``7d``) in its spec and its docs."""
    dur = importlib.import_module(f"{PACKAGE}.core._duration")

    source = path.read_text()
    for name, spec in _documented_options(path).items():
        leaf = name.rsplit(".", 1)[-1]
        if not (DURATION_NAME.search(leaf) or leaf in dur.OPTIONS):
            continue
        assert "." not in name, f"{path.name}: {name} is a nested duration; the adapter converts top-level ones only"
        assert leaf in dur.OPTIONS, f"{path.name}: option {name} is a duration missing from _duration.OPTIONS"
        assert spec.get("type") == "raw", f"{path.name}: option {name} is documented as {spec.get('type')}, not raw"
        assert re.search(rf'\b{leaf}=dict\(type="raw"', source), f"{path.name}: option {name} is not type raw in its spec"
