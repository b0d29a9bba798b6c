"""The collection builds into an installable tarball, and every module's docs render from it."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

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
