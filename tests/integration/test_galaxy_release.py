"""Ready for Galaxy: the built collection passes galaxy-importer (the checks Galaxy runs on upload) with only
the findings justified below, antsibull-docs finds nothing to fix in the docs, and the changelog fragments are
what antsibull-changelog releases.

Both tools run from a venv of their own (``.venv-release``, built here when missing; pinned): they pin linters
of other versions than the main venv's. ansible-test sanity runs in ``make sanity``, so the importer skips it.

galaxy.yml has no ``repository`` yet - Galaxy requires one and only the project's owners can say where it is
published; until then the importer runs on a build whose galaxy.yml names a placeholder (never published).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.support.tool_venvs import tool_venv

from .ansible_run import REPO, VENV_BIN, ansible_env

pytestmark = pytest.mark.integration

PINS = ["galaxy-importer==0.4.44", "antsibull-docs==2.28.0", "antsibull-changelog==0.36.0"]
PLACEHOLDER_REPOSITORY = "https://example.invalid/warmstart/snapshot"

# Each finding the importer may report, and why it is not fixed:
JUSTIFIED = [
    # pycodestyle's W503 and W504 forbid both places a line can break at a binary operator; flake8 ignores both
    # by default and PEP 8 recommends breaking before the operator (W503), as the engine does.
    (r"^WARNING: plugins/\S+\.py:\d+:\d+: W50[34] line break (before|after) binary operator$", "W503/W504"),
    # the importer's flake8 reads filter plugins' YAML doc files (plugins/filter/*.yml, as ansible-core documents
    # filters) as Python
    (r"^WARNING: plugins/filter/\w+\.yml:\d+:\d+: E999 SyntaxError: ", "E999 on YAML filter docs"),
    # ansible-lint in the importer runs offline without the dependencies (galaxy.yml: kubernetes.core) or the
    # molecule scenarios' containers.podman installed, and without this collection installed, so it resolves
    # neither their modules nor this collection's playbooks imported by FQCN
    (r"^WARNING: (roles/k8s_agent/tasks/main\.yml|extensions/molecule/\w+/\w+\.yml):\d+:\d+: "
     r"syntax-check\[unknown-module\]: couldn't resolve module/action '(kubernetes\.core|containers\.podman)\.\w+'",
     "dependencies not installed"),
    (r"^WARNING: ERROR +Failed to find warmstart\.snapshot\.\w+ playbook\.$", "own playbooks by FQCN"),
]


@pytest.fixture(scope="module")
def release_bin() -> Path:
    return tool_venv("release", PINS)


def checkout_copy(dest: Path) -> Path:
    """The files git would ship, copied into ``dest`` (a collection tree)."""
    dest.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.split(b"\0")
    for rel in filter(None, files):
        src = REPO / rel.decode()
        if src.is_file():
            (dest / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel.decode())
    return dest


def unjustified(lines: List[str]) -> List[str]:
    return [line for line in lines if line.startswith("WARNING:")
            and not any(re.search(pattern, line) for pattern, _why in JUSTIFIED)]


def test_galaxy_importer_passes_with_only_justified_findings(tmp_path: Path, release_bin: Path) -> None:
    src = checkout_copy(tmp_path / "src")
    galaxy = src / "galaxy.yml"
    if not re.search(r"^repository:", galaxy.read_text(), re.M):
        galaxy.write_text(galaxy.read_text() + f"repository: {PLACEHOLDER_REPOSITORY}\n")
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(src)],
                   cwd=tmp_path, env=ansible_env(), check=True, capture_output=True, text=True)
    config = tmp_path / "importer.cfg"
    config.write_text("[galaxy-importer]\nRUN_ANSIBLE_TEST = False\nRUN_ANSIBLE_LINT = True\nRUN_FLAKE8 = True\n")
    env = dict(ansible_env(), GALAXY_IMPORTER_CONFIG=str(config), PATH=f"{release_bin}:/usr/bin:/bin")
    env.pop("ANSIBLE_CONFIG")
    done = subprocess.run([str(release_bin / "python"), "-m", "galaxy_importer.main",
                           str(next(tmp_path.glob("warmstart-snapshot-*.tar.gz")))],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Importer processing completed successfully" in out, out[-4000:]
    assert unjustified(out.splitlines()) == [], "\n".join(unjustified(out.splitlines()))


def test_the_justifications_match_real_findings() -> None:
    """Each justification matches the finding it was written for, and not a new finding of another kind."""
    assert unjustified(["WARNING: plugins/module_utils/k8s/_selection.py:12:13: W503 line break before binary operator",
                        "WARNING: plugins/filter/fleet_rows.yml:1:16: E999 SyntaxError: invalid syntax",
                        "WARNING: roles/k8s_agent/tasks/main.yml:58:3: syntax-check[unknown-module]: couldn't "
                        "resolve module/action 'kubernetes.core.k8s'. This often indicates a misspelling",
                        "WARNING: ERROR    Failed to find warmstart.snapshot.restore playbook."]) == []
    assert len(unjustified(["WARNING: plugins/modules/restore.py:3:1: E302 expected 2 blank lines, found 1",
                            "WARNING: roles/node_prep/tasks/main.yml:3:3: syntax-check[unknown-module]: couldn't "
                            "resolve module/action 'community.general.foo'",
                            "WARNING: plugins/filter/fleet_rows.py:1:16: E999 SyntaxError: invalid syntax"])) == 3


def test_antsibull_docs_lint_is_clean(tmp_path: Path, release_bin: Path) -> None:
    """The docs' markup (O(), RV(), M(), P() references included) resolves, as docs.ansible.com renders it."""
    root = tmp_path / "collections"
    tree = checkout_copy(root / "ansible_collections" / "warmstart" / "snapshot")
    env = dict(ansible_env(), ANSIBLE_COLLECTIONS_PATH=str(root), PATH=f"{VENV_BIN}:/usr/bin:/bin")
    env.pop("ANSIBLE_CONFIG")
    done = subprocess.run([str(release_bin / "antsibull-docs"), "lint-collection-docs", "--plugin-docs", "."],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout[-4000:] + done.stderr[-2000:]


def test_changelog_fragments_lint_and_release_into_changelog_md(tmp_path: Path, release_bin: Path) -> None:
    """Every change is a fragment antsibull-changelog accepts (its lint: sections, RST), and a release of this
    version turns every fragment item into CHANGELOG.md - none lost, none invented."""
    import yaml  # pylint: disable=import-outside-toplevel

    root = tmp_path / "collections"
    tree = checkout_copy(root / "ansible_collections" / "warmstart" / "snapshot")
    env = dict(ansible_env(), ANSIBLE_COLLECTIONS_PATH=str(root), PATH=f"{VENV_BIN}:/usr/bin:/bin")
    env.pop("ANSIBLE_CONFIG")
    tool = str(release_bin / "antsibull-changelog")
    lint = subprocess.run([tool, "lint"], cwd=tree, env=env, capture_output=True, text=True, check=False)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout[-4000:] + lint.stderr[-2000:]

    items = {}
    for fragment in sorted((tree / "changelogs" / "fragments").glob("*.yml")):
        for section, entries in yaml.safe_load(fragment.read_text()).items():
            items.setdefault(section, []).extend(entries)
    assert items.get("minor_changes") and set(items) <= {"minor_changes", "bugfixes", "major_changes",
                                                         "breaking_changes", "security_fixes", "known_issues"}
    version = yaml.safe_load((tree / "galaxy.yml").read_text())["version"]
    done = subprocess.run([tool, "release", "--version", str(version), "--date", "2026-12-07"], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    text = (tree / "CHANGELOG.md").read_text()
    titles = {"minor_changes": "Minor Changes", "bugfixes": "Bugfixes", "major_changes": "Major Changes",
              "breaking_changes": "Breaking Changes / Porting Guide", "security_fixes": "Security Fixes",
              "known_issues": "Known Issues"}
    for section, entries in items.items():
        block = text.split(f"### {titles[section]}\n", 1)[1].split("\n<a id=", 1)[0]
        assert len(re.findall(r"^\* ", block, re.M)) == len(entries), section
    assert not list((tree / "changelogs" / "fragments").glob("*.yml")), "a release consumes its fragments"
