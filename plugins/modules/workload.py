#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: workload
short_description: Start or stop a process so that it can be checkpointed and restored
version_added: 0.1.0
description:
  - Starts a command as a restorable workload - the init of its own PID namespace (restored PIDs cannot
    collide with the node's), leader of its own session, stdin from C(/dev/null), stdout and stderr
    appended to files that only it holds (CRIU checks the size of open files at restore).
  - Its state lives in C(<root>/<name>/) - C(pid), C(spec.json), C(stdout.log), C(stderr.log) and
    C(control/), exported to the command as E(SNAPSHOT_CONTROL_DIR).
  - By default it also has a mount namespace of its own - every mount a slave of the node's (mounts and
    unmounts on the node still reach it, its own do not reach the node) and a C(/proc) that shows its PID
    namespace, as CUDA and anything else that reads C(/proc/self) need. A checkpoint keeps that namespace;
    see O(mount_namespace) for what a restore needs of the node.
  - It runs without io_uring, which CRIU cannot checkpoint - a seccomp filter answers the io_uring system
    calls with C(ENOSYS), so libuv (uvloop under C(uvicorn[standard])), liburing and the servers built on them
    fall back to epoll; every child inherits the filter, and CRIU restores it with the tree.
    M(warmstart.snapshot.checkpoint) refuses a tree that holds an io_uring instance anyway (a
    O(warmstart.snapshot.checkpoint#module:pid) target started another way), naming the process, before anything
    is touched.
  - Idempotent - an already running workload of that name is left alone (C(changed=false)).
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Reports whether it would start or stop the workload, and does nothing.
  platform:
    description: Linux only (PID namespaces).
options:
  name:
    description: Name of the workload; letters, digits, C(.), C(_) and C(-).
    type: str
    required: true
  command:
    description: Command and arguments (a list; a string is split like a shell would, without a shell).
    type: raw
  state:
    description: V(started) starts the workload unless it runs; V(stopped) stops it (SIGTERM, then SIGKILL).
    type: str
    choices: [started, stopped]
    default: started
  env:
    description: Extra environment variables for the command (the module's environment is inherited).
    type: dict
    default: {}
  chdir:
    description: Working directory of the command (default C(/)); it must exist on the nodes it is restored on.
    type: path
  root:
    description: Directory that holds the workloads' state directories.
    type: path
    default: /var/lib/warmstart/workloads
  wait_ready:
    description:
      - After starting, wait until the workload is warm - its O(app_profile)'s ready probe passes, or, without a
        profile, it writes C(ready-for-snapshot) into its control directory.
    type: bool
    default: false
  ready_timeout:
    description:
      - Seconds to wait for readiness (O(wait_ready)); default the profile's ready timeout, else 300.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
  app_profile:
    description:
      - The application profile of a stock server that knows nothing about warmstart - how to tell it is warm,
        quiesce it before a dump and release it after a restore (see C(docs/profiles.md)).
      - A shipped profile's name (V(vllm), V(vllm-sleep), V(sglang), V(sglang-memory-saver), V(tgi), V(tei),
        V(llama-cpp), V(llama-cpp-python), V(ollama), V(triton), V(mlserver), V(generic-http)); a mapping
        C({name, vars}) naming one with other vars (C(port) ...); a whole profile as a mapping; or the absolute
        path of a JSON or YAML file holding one. A bad profile is refused listing every problem.
      - Kept in C(spec.json) - M(warmstart.snapshot.checkpoint) of this workload uses it unless given another.
    type: raw
  stop_timeout:
    description:
      - Seconds between SIGTERM and SIGKILL when stopping.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 10
  mount_namespace:
    description:
      - Run the workload in a mount namespace of its own with a C(/proc) of its PID namespace (V(true)), or in
        the node's, whose C(/proc) shows the node's PIDs (V(false); a CUDA process then fails to initialise).
      - A snapshot keeps the mounts the workload saw, except those of other containers, pods and sessions
        (container runtimes' and the kubelet's directories, C(/run/user), C(/run/netns), overlay roots, kernel
        debug file systems) that no process of it holds a file on. A restore binds each kept mount again from
        the same path of the restoring node, and refuses, naming them, when a path is missing there or is not
        a shared mount where the source's copy received the node's mounts.
      - Takes effect when the workload starts; recorded in C(spec.json).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Start an inference server that can be snapshotted
  warmstart.snapshot.workload:
    name: embed
    command: [/opt/venv/bin/python, /opt/app/server.py, --port, "8765"]
    env:
      HF_HUB_OFFLINE: "1"
    wait_ready: true

- name: Start a stock vLLM server; wait until its /health answers
  warmstart.snapshot.workload:
    name: llm
    command: [/opt/vllm/bin/vllm, serve, Qwen/Qwen3-0.6B, --port, "8001"]
    app_profile: {name: vllm, vars: {port: 8001}}
    wait_ready: true

- name: Stop it
  warmstart.snapshot.workload:
    name: embed
    state: stopped
"""

RETURN = r"""
workload:
  description: The workload after the change.
  returned: always
  type: dict
  contains:
    name:
      description: Workload name.
      type: str
      returned: always
      sample: embed
    running:
      description: Whether it runs.
      type: bool
      returned: always
      sample: true
    pid:
      description: Host PID of the workload (the init of its PID namespace).
      type: int
      returned: always
      sample: 4242
    dir:
      description: State directory.
      type: str
      returned: always
      sample: /var/lib/warmstart/workloads/embed
    pidfile:
      description: Pidfile.
      type: str
      returned: always
      sample: /var/lib/warmstart/workloads/embed/pid
    control:
      description: Control directory (SNAPSHOT_CONTROL_DIR).
      type: str
      returned: always
      sample: /var/lib/warmstart/workloads/embed/control
    stdout:
      description: File receiving stdout.
      type: str
      returned: always
      sample: /var/lib/warmstart/workloads/embed/stdout.log
    stderr:
      description: File receiving stderr.
      type: str
      returned: always
      sample: /var/lib/warmstart/workloads/embed/stderr.log
    ready_after:
      description: Seconds until the workload was ready (O(wait_ready)).
      type: float
      returned: when waited
      sample: 12.5
    spec:
      description: What it was started with (C(spec.json) - command, env, chdir, mount_namespace, app_profile).
      type: dict
      returned: when the workload was ever started
      sample: {"command": ["python3", "server.py"], "env": {}, "chdir": null, "mount_namespace": true,
               "app_profile": null}
    stopped:
      description: How it was stopped (terminated, killed, not running).
      type: str
      returned: when stopped
      sample: terminated
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _workload
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            command=dict(type="raw"),
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            env=dict(type="dict", default={}),
            chdir=dict(type="path"),
            root=dict(type="path", default="/var/lib/warmstart/workloads"),
            wait_ready=dict(type="bool", default=False),
            ready_timeout=dict(type="raw"),
            app_profile=dict(type="raw"),
            stop_timeout=dict(type="raw", default=10),
            mount_namespace=dict(type="bool", default=True),
        ),
        required_if=[("state", "started", ("command",))],
        supports_check_mode=True,
    )
    run_module(module, _workload.run)


if __name__ == "__main__":
    main()
