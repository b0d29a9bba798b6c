"""The collection builds into an installable tarball, and every module's docs render from it."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.support.tool_venvs import tool_venv

from .ansible_run import REPO, VENV_BIN, ansible_env

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if not p.stem.startswith("_"))


def test_build_install_and_render_docs(tmp_path: Path) -> None:
    env = ansible_env()
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(REPO)],
                   cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    tarballs = list(tmp_path.glob("warmstart-snapshot-*.tar.gz"))
    assert len(tarballs) == 1
    with tarfile.open(tarballs[0]) as tar:
        names = tar.getnames()
    assert "galaxy.yml" not in names and "MANIFEST.json" in names
    assert "roles/node_prep/files/build_criu_bundle.sh" in names and "playbooks/demo.yml" in names
    assert not [n for n in names if n.startswith((".venv", ".collections", ".ansible", "tests/output")) or "__pycache__" in n]

    dest = tmp_path / "installed"
    env_installed = dict(env, ANSIBLE_COLLECTIONS_PATH=str(dest))
    env_installed.pop("ANSIBLE_CONFIG")  # only the installed copy, not this checkout
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "-p", str(dest), str(tarballs[0])],
                   cwd=tmp_path, env=env_installed, check=True, capture_output=True, text=True)
    assert (dest / "ansible_collections" / "warmstart" / "snapshot" / "MANIFEST.json").is_file()
    doc = subprocess.run([str(VENV_BIN / "ansible-doc"), "--json", *[f"warmstart.snapshot.{m}" for m in MODULES]],
                         cwd=tmp_path, env=env_installed, check=True, capture_output=True, text=True)
    rendered = json.loads(doc.stdout)
    assert rendered, doc.stderr
    assert sorted(rendered) == [f"warmstart.snapshot.{m}" for m in MODULES]
    for name, entry in rendered.items():
        assert entry["doc"]["short_description"], name
        assert os.path.realpath(entry["doc"]["filename"]).startswith(str(dest)), name
    role = subprocess.run([str(VENV_BIN / "ansible-doc"), "-t", "role", "warmstart.snapshot.node_prep"],
                          cwd=tmp_path, env=env_installed, check=True, capture_output=True, text=True)
    assert "node_prep_criu_min_version" in role.stdout


PLAY = """
- name: The installed collection runs on its own
  hosts: localhost
  gather_facts: false
  vars:
    root: "{root}"
  tasks:
    - name: Read this node
      warmstart.snapshot.node_info:
        probe_features: false
        snapshot_root: "{{{{ root }}}}/snapshots"
      register: node

    - name: Start a workload
      warmstart.snapshot.workload:
        name: installed
        command: [sleep, "300"]
        root: "{{{{ root }}}}/workloads"
      register: started

    - name: List an empty store
      warmstart.snapshot.snapshot_info:
        store: "{{{{ root }}}}/store"
      register: listed

    - name: Stop the workload
      warmstart.snapshot.workload:
        name: installed
        state: stopped
        root: "{{{{ root }}}}/workloads"
      register: stopped

    - name: Report, with the collection's role and filters
      ansible.builtin.include_role:
        name: warmstart.snapshot.fleet_report
      vars:
        fleet_report_title: installed
        fleet_report_given_rows:
          - {{pod: localhost, result: "{{{{ 'ok' if started.changed and stopped.changed and listed.snapshots == [] else 'failed' }}}}"}}
        fleet_report_file: "{{{{ root }}}}/report.json"
"""


def floor_pin() -> str:
    """``ansible-core==<the newest release of the lowest minor meta/runtime.yml claims>`` (requires_ansible)."""
    claimed = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert claimed == f">={FLOOR_MINOR}.0", f"requires_ansible is {claimed}: test that floor (FLOOR_MINOR, FLOOR_PIN)"
    return FLOOR_PIN


FLOOR_MINOR = "2.17"
FLOOR_PIN = "ansible-core==2.17.14"


@pytest.mark.parametrize("core", ["main", "floor"])
def test_the_installed_tarball_runs_a_playbook_of_its_own(tmp_path: Path, core: str) -> None:
    """``build_ignore`` drops nothing a user needs: from the built tarball alone, installed into an empty
    collections path, modules (with their module_utils), a role and its filters run - on the ansible-core this
    checkout develops with, and on the oldest one meta/runtime.yml claims (its own venv, ``.venv-floor``)."""
    env = ansible_env()
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(REPO)],
                   cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    bin_dir = VENV_BIN if core == "main" else tool_venv("floor", [floor_pin()])
    dest = tmp_path / "installed"
    env_installed = dict(env, ANSIBLE_COLLECTIONS_PATH=str(dest))
    env_installed.pop("ANSIBLE_CONFIG")  # only the installed copy, not this checkout
    env_installed.pop("ANSIBLE_STDOUT_CALLBACK", None)  # ansible.builtin.json is newer than the floor
    subprocess.run([str(bin_dir / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(dest),
                    str(next(tmp_path.glob("warmstart-snapshot-*.tar.gz")))],
                   cwd=tmp_path, env=env_installed, check=True, capture_output=True, text=True)
    (tmp_path / "play.yml").write_text(PLAY.format(root=tmp_path / "run"))
    done = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={bin_dir / 'python'}", "play.yml"],
                          cwd=tmp_path, env=env_installed, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    version = subprocess.run([str(bin_dir / "ansible"), "--version"], capture_output=True, text=True, check=True)
    assert (FLOOR_PIN.split("==")[1] in version.stdout.splitlines()[0]) is (core == "floor"), version.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report == {"title": "installed", "rows": [{"pod": "localhost", "result": "ok"}]}, report


# What the oldest ansible-core reads of the collection: module docs and argument specs, its own imports (the
# module_utils a module ships), plugin docs, meta/runtime.yml. The full sanity run is make sanity's (the newest).
FLOOR_SANITY = ["validate-modules", "ansible-doc", "import", "runtime-metadata"]


def test_the_floor_ansible_core_accepts_the_collection_s_docs_specs_and_imports(tmp_path: Path) -> None:
    """``ansible-test sanity`` of the lowest ansible-core meta/runtime.yml claims passes the tests that read what
    that ansible-core loads (``FLOOR_SANITY``) - a doc key, argspec feature or import newer than the floor fails."""
    bin_dir = tool_venv("floor", [floor_pin()])
    tree = tmp_path / "ansible_collections" / "warmstart" / "snapshot"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.split(b"\0")
    for rel in filter(None, (f.decode() for f in files)):
        if (REPO / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes((REPO / rel).read_bytes())
    # ansible-test bootstraps pip in its venvs with a script it downloads; this machine has PyPI but not that
    # host, so it gets the offline one make sanity uses (tests/support/get_pip_offline.py)
    requirements = next((bin_dir.parent / "lib").glob("python3*/site-packages/ansible_test/_internal/"
                                                      "python_requirements.py")).read_text()
    pip = next(line.split("'")[1] for line in requirements.splitlines() if line.strip().startswith("pip='"))
    cache = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{pip.replace('.', '_')}.py"
    cache.parent.mkdir(parents=True, exist_ok=True)
    offline = (REPO / "tests" / "support" / "get_pip_offline.py").read_bytes()
    if not cache.is_file() or cache.read_bytes() != offline:
        cache.write_bytes(offline)
    args = [str(bin_dir / "ansible-test"), "sanity", "--local", "--python", "3.11", "--color", "no"]
    for test in FLOOR_SANITY:
        args += ["--test", test]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    done = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for test in FLOOR_SANITY:
        assert f'Running sanity test "{test}"' in done.stdout + done.stderr, f"{test} did not run"
