"""Run real ansible-playbook / ansible commands against this machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict:
        """The json callback's document (plays, stats)."""
        return json.loads(self.stdout)

    def stats(self, host: str = "localhost") -> dict:
        return self.result["stats"][host]

    def messages(self) -> str:
        """Every failure message, joined: what a user would read."""
        out = []
        for play in self.result.get("plays", []):
            for task in play.get("tasks", []):
                for res in task.get("hosts", {}).values():
                    if res.get("failed") or res.get("unreachable"):
                        out.append(str(res.get("msg", "")))
        return "\n".join(out)


def prep_vars() -> dict:
    """The tests' prepare_nodes variables on this machine: signing by default opted out (the tests make unsigned
    snapshots by hand; test_cross_node runs the default on its nodes) and the keys dir the tests' own
    (``WARMSTART_KEYS_DIR``, set by tests/conftest.py), never this machine's /etc/warmstart/keys."""
    return {"node_prep_sign_snapshots": False, "node_prep_keys_dir": os.environ["WARMSTART_KEYS_DIR"]}


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_NOCOLOR="1",
    )
    return env


def playbook(name: str, *args: str, extra: dict | None = None, timeout: int = 1200,
             prefix: tuple[str, ...] = ()) -> Run:
    """``ansible-playbook name`` on localhost; ``prefix``: a command it runs under (e.g. in a namespace)."""
    cmd = [*prefix, str(VENV_BIN / "ansible-playbook"), name, "-i", "localhost,", "-c", "local", *args]
    # no summary JSON unless a test asks for one: runs of different tests would rewrite one shared file
    cmd += ["-e", json.dumps({"warmstart_summary_file": ""})]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def k8s_tasks(kubeconfig: Path, tmp_path: Path, tasks: list, *args: str) -> Run:
    """Run ``tasks`` in one play on localhost against the API server of ``kubeconfig`` (module_defaults of the
    collection's k8s group give it), with this venv's Python as the module interpreter (the kubernetes library
    lives there)."""
    play = [{"name": "k8s modules", "hosts": "localhost", "gather_facts": False,
             "module_defaults": {"group/warmstart.snapshot.k8s": {"kubeconfig": str(kubeconfig)}},
             "tasks": tasks}]
    path = tmp_path / f"play-{len(list(tmp_path.glob('play-*.yml')))}.yml"
    path.write_text(json.dumps(play))
    return playbook(str(path), *args, extra={"ansible_python_interpreter": sys.executable}, timeout=300)


def task_results(run: Run) -> dict[str, dict]:
    """Task name (without its role) -> localhost's result; a run that printed no JSON fails the test."""
    try:
        doc = run.result
    except ValueError:
        pytest.fail(f"ansible-playbook printed no JSON (rc {run.rc}): {run.stderr[-3000:]}")
    return {task["task"]["name"].split(" : ")[-1]: task["hosts"]["localhost"]  # without "role : "
            for play in doc["plays"] for task in play["tasks"]}
