# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""containerd as a ``_runtime.Runtime`` (structurally: this file does not import ``_runtime``).

What it asks, all of it containerd's own machine-readable interfaces:

- ``ctr containers info ID`` (JSON): the container record - labels, image, snapshotter and snapshot key, and
  the OCI spec (mounts, hostname, cgroup path);
- ``ctr snapshots info KEY`` (JSON): the snapshot's parent, the chain id of the image's layers, which is the
  ``image_id`` (equal for two containers of one image, different for another image);
- ``ctr containers ls -q`` with label filters: ids of a pod's containers by the kubelet's CRI labels;
- the runtime v2 task state containerd keeps in its state dir (``<state>/io.containerd.runtime.v2.task/<ns>/<id>/``:
  ``init.pid``, the mounted ``rootfs``), the task's status from ``runc state`` (JSON) under the shim's runc root,
  and the overlay upper dir from the host's mountinfo entry of that rootfs.

Where containerd lives, as ``ctr`` itself reads it from the environment: ``CONTAINERD_ADDRESS`` (default
/run/containerd/containerd.sock), ``CONTAINERD_NAMESPACE`` (default ``k8s.io``, the kubelet's); its state dir
is the socket's dir unless ``WARMSTART_CONTAINERD_STATE`` names it (k3s: socket
/run/k3s/containerd/containerd.sock, state /run/k3s/containerd).

Every failure (no ctr, no socket or no access to it, an id that is not valid, an unknown container) is a
TargetError naming the container and the socket; nothing here changes a container.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.runtime._containerinfo import (
    POD_CONTAINER, POD_NAME, POD_NAMESPACE, ContainerInfo)
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._proc import TargetError, alive

TIMEOUT = 120
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
DEFAULT_NAMESPACE = "k8s.io"
DEFAULT_RUNC_ROOT = "/run/containerd/runc"
TASKS = "io.containerd.runtime.v2.task"
STATE_ENV = "WARMSTART_CONTAINERD_STATE"
VALID_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$")     # containerd's identifiers
VALID_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,252})$")  # Kubernetes names


def _last_error(res: "subprocess.CompletedProcess[str]") -> str:
    return res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"


def label_filter(labels: Mapping[str, str]) -> str:
    """One ``ctr ... ls`` filter that matches containers carrying every label (its terms are ANDed)."""
    return ",".join(f'labels."{key}"=="{value}"' for key, value in labels.items())


def upper_dir(mountinfo_text: str, mountpoint: str) -> Optional[str]:
    """The ``upperdir=`` of the overlay mounted at ``mountpoint`` (from a mountinfo text), None if it is none."""
    found = None
    for line in mountinfo_text.splitlines():
        parts = line.split()
        if "-" not in parts or len(parts) < 10 or parts[4].replace("\\040", " ") != mountpoint:
            continue
        sep = parts.index("-")
        if parts[sep + 1] != "overlay" or len(parts) <= sep + 3:
            found = None  # a later mount over it hides the overlay
            continue
        found = next((o[len("upperdir="):].replace("\\040", " ") for o in parts[sep + 3].split(",")
                      if o.startswith("upperdir=")), None)
    return found


def container_info(record: Dict[str, Any], status: str, pid: int, rootfs: str, upper: Optional[str],
                   image_id: str, cgroup: str = "") -> ContainerInfo:
    """A ContainerInfo from containerd's container record (``ctr containers info``) and its task's state."""
    spec = record.get("Spec") or {}
    mounts = [{"destination": m.get("destination"), "source": m.get("source"), "type": m.get("type"),
               "rw": "ro" not in (m.get("options") or [])} for m in spec.get("mounts") or []]
    cgroups_path = str((spec.get("linux") or {}).get("cgroupsPath") or "")
    return ContainerInfo(
        id=str(record.get("ID") or ""), name=str(record.get("ID") or ""), runtime=Containerd.name,
        image=str(record.get("Image") or ""), image_id=image_id, running=status == "running" and pid > 0,
        status=status, pid=pid, cgroup_path=cgroup or cgroups_path, rootfs=rootfs, upper_dir=upper,
        hostname=str(spec.get("hostname") or ""), mounts=mounts)


def unified_cgroup(pid: int) -> str:
    """The cgroup v2 (``0::``) path of ``pid``, or its first v1 hierarchy's; "" when unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup", "r", encoding="utf-8") as handle:
            lines = [line.strip().split(":", 2) for line in handle if line.count(":") >= 2]
    except OSError:
        return ""
    paths = {parts[0]: parts[2] for parts in lines}
    unified = paths.get("0", "")
    return unified if unified not in ("", "/") else next((path for key, path in paths.items() if key != "0"), "")


class Containerd:
    """containerd on this node through its ``ctr`` (``binary``, default: ctr on PATH), one namespace."""

    name = "containerd"

    def __init__(self, binary: Optional[str] = None, address: Optional[str] = None, namespace: Optional[str] = None,
                 state: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if env is None else env
        self.binary = binary or shutil.which("ctr") or ""
        address = address or env.get("CONTAINERD_ADDRESS") or DEFAULT_ADDRESS
        self.address = address[len("unix://"):] if address.startswith("unix://") else address
        self.namespace = namespace or env.get("CONTAINERD_NAMESPACE") or DEFAULT_NAMESPACE
        self.state = state or env.get(STATE_ENV) or os.path.dirname(self.address)
        self.runc = shutil.which("runc") or ""
        self._checked = False

    def where(self) -> str:
        return f"containerd at {self.address}, namespace {self.namespace}"

    def _check_socket(self) -> None:
        """TargetError unless ctr is installed and containerd answers on the socket (checked once)."""
        if self._checked:
            return
        if not self.binary:
            raise TargetError("containerd: ctr is not installed on this node (no ctr in PATH)")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(5)
        try:
            probe.connect(self.address)
        except FileNotFoundError:
            raise TargetError(f"containerd socket {self.address} does not exist (is containerd running on this node? "
                              "CONTAINERD_ADDRESS names another socket)") from None
        except PermissionError:
            raise TargetError(f"containerd socket {self.address}: permission denied (run as root, or as a user "
                              "allowed to use that socket)") from None
        except OSError as exc:
            raise TargetError(f"containerd socket {self.address}: cannot connect ({exc.strerror or exc}); "
                              "is containerd running?") from None
        finally:
            probe.close()
        self._checked = True

    def _ctr(self, *args: str) -> "subprocess.CompletedProcess[str]":
        self._check_socket()
        return subprocess.run([self.binary, "--address", self.address, "--namespace", self.namespace, *args],
                              capture_output=True, text=True, check=False, timeout=TIMEOUT)

    def _json(self, what: str, *args: str) -> Dict[str, Any]:
        res = self._ctr(*args)
        if res.returncode != 0:
            err = _last_error(res)
            if "not found" in err.lower():
                raise TargetError(f"{what} not found in {self.where()}")
            raise TargetError(f"ctr {' '.join(args[:2])} for {what} failed ({self.where()}): {err}")
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            raise TargetError(f"ctr {' '.join(args[:2])} for {what}: unreadable output") from None
        if not isinstance(doc, dict):
            raise TargetError(f"ctr {' '.join(args[:2])} for {what}: unexpected output")
        return doc

    def inspect(self, container: str) -> ContainerInfo:
        if not VALID_ID.match(container or ""):
            raise TargetError(f"container name {container!r} is not valid for containerd "
                              "(an id of letters, digits, '.', '_' and '-')")
        record = self._json(f"container {container}", "containers", "info", container)
        cid = str(record.get("ID") or container)
        status, pid = self._task(cid)
        bundle = os.path.join(self.state, TASKS, self.namespace, cid)
        rootfs = os.path.join(bundle, "rootfs") if status != "created" else ""
        upper = None
        if rootfs:
            with open("/proc/self/mountinfo", "r", encoding="utf-8", errors="surrogateescape") as handle:
                upper = upper_dir(handle.read(), rootfs)
        return container_info(record, status, pid, rootfs, upper, self._image_id(record),
                              unified_cgroup(pid) if pid else "")

    def _image_id(self, record: Dict[str, Any]) -> str:
        """The chain id of the container's image layers (its snapshot's parent); "" when it has no snapshot."""
        key, snapshotter = record.get("SnapshotKey"), record.get("Snapshotter")
        if not key:
            return ""
        args = ["snapshots"] + (["--snapshotter", str(snapshotter)] if snapshotter else []) + ["info", str(key)]
        return str(self._json(f"snapshot {key} of container {record.get('ID')}", *args).get("Parent") or "")

    def _task(self, cid: str) -> Tuple[str, int]:
        """(status, host PID of the task's init when it runs, else 0) from the task's bundle and runc's state."""
        bundle = os.path.join(self.state, TASKS, self.namespace, cid)
        try:
            with open(os.path.join(bundle, "init.pid"), "r", encoding="utf-8") as handle:
                pid = int(handle.read().strip() or 0)
        except FileNotFoundError:
            return self._no_bundle(cid, bundle), 0
        except (OSError, ValueError) as exc:
            raise TargetError(f"container {cid}: its task's init.pid in {bundle} is not readable ({exc})") from None
        status = self._runc_status(bundle, cid) or ("running" if pid > 0 and alive(pid) else "stopped")
        return status, pid if status in ("running", "paused") and pid > 0 and alive(pid) else 0

    def _no_bundle(self, cid: str, bundle: str) -> str:
        """"created" (no task) - or TargetError when containerd has a task whose bundle is not where we look."""
        res = self._ctr("tasks", "ls", "-q")
        if res.returncode == 0 and cid in res.stdout.split():
            raise TargetError(f"container {cid}: containerd has a task for it, but its bundle {bundle} does not "
                              f"exist: set {STATE_ENV} to containerd's state dir (that of {self.address})")
        return "created"

    def _runc_status(self, bundle: str, cid: str) -> str:
        """``runc state``'s status of the task under the shim's runc root; "" when runc cannot say."""
        root = DEFAULT_RUNC_ROOT
        try:
            with open(os.path.join(bundle, "options.json"), "r", encoding="utf-8") as handle:
                options = json.load(handle)
            root = str(options.get("root") or options.get("Root") or root)
        except (OSError, ValueError, AttributeError):
            pass
        if not self.runc:
            return ""
        res = subprocess.run([self.runc, "--root", os.path.join(root, self.namespace), "state", cid],
                             capture_output=True, text=True, check=False, timeout=TIMEOUT)
        try:
            return str(json.loads(res.stdout).get("status") or "") if res.returncode == 0 else ""
        except (ValueError, AttributeError):
            return ""

    def pod_containers(self, namespace: str, pod: str, container: str) -> List[str]:
        labels = {POD_NAMESPACE: namespace, POD_NAME: pod, POD_CONTAINER: container}
        bad = [f"{key}={value!r}" for key, value in labels.items() if not VALID_LABEL_VALUE.match(value or "")]
        if bad:
            raise TargetError(f"pod {namespace}/{pod} container {container}: not a Kubernetes name ({', '.join(bad)})")
        res = self._ctr("containers", "ls", "-q", label_filter(labels))
        if res.returncode != 0:
            raise TargetError(f"ctr containers ls (pod {namespace}/{pod}, {self.where()}) failed: {_last_error(res)}")
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]
