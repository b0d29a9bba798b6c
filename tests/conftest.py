"""Shared pytest set-up: make the collection importable by its FQCN."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The integration tests' shared helpers (non-test modules) get pytest's assertion messages, as they did when
# they lived in test modules.
pytest.register_assert_rewrite("tests.integration.process_lab", "tests.integration.container_lab",
                               "tests.integration.s3_lab")

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".collections"
_link = COLLECTIONS / "ansible_collections" / "warmstart" / "snapshot"
if not _link.exists():
    _link.parent.mkdir(parents=True, exist_ok=True)
    _link.symlink_to(Path("../../.."))
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))


@pytest.fixture(scope="session", autouse=True)
def node_keys_of_our_own(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' node keys directory: an empty one of their own (``WARMSTART_KEYS_DIR``, which ansible-playbook,
    its modules and every helper process inherit), never this machine's ``/etc/warmstart/keys``: ``make demo``
    and ``prepare_nodes`` sign by default and install a trust set there, which would turn every hand-made test
    snapshot into a refused unsigned one. A test that wants keys sets its own directory (monkeypatch)."""
    keys = tmp_path_factory.mktemp("node-keys")
    os.environ["WARMSTART_KEYS_DIR"] = str(keys)
    return keys
