#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fan-out restore across nodes, from a shared filesystem and from S3 (nodes sharing chunks or not), and S3 vs
shared filesystem, through the fleet playbooks.

  eval "$(tests/support/podman-env.sh)"
  sudo -E /usr/bin/python3 -m bench.fleet [--mib 512] [--reps 3] [--markdown docs/benchmarks.md]

Five privileged podman "nodes" (the local node image) on their own network,
a shared store directory mounted at /store in each and moto's S3 server on
the network gateway - the molecule ``fleet`` set-up, with a test CA's TLS
certificate per node (its address) in /etc/warmstart/keys/tls. prepare_nodes
runs on them; a workload holding MIB MiB (bench/mem_workload.py) is
snapshotted on node1 into both stores; then, timed:

- fan-out: ``ansible-playbook warmstart.snapshot.restore`` from the shared
  filesystem store onto 1, 3 and 5 nodes at once (wall time of the playbook,
  and the slowest node's own restore time from the summary JSON);
- fan-out from S3 with empty node caches onto 1, 3 and 5 nodes, each node
  reading the whole snapshot from the bucket, and with
  ``warmstart_restore_share`` (nodes share chunks over mutual TLS): the bytes
  the bucket sent (the structural figure) next to the times;
- S3 vs filesystem onto one node (node2): S3 with an empty node cache (the
  download is part of it), S3 again with the cache warm, and the filesystem.

Each restore's summary row must say ``restored``. Results go to
``--dir/results/fleet-<ts>.json``; ``--markdown`` replaces the section between
the ``fleet`` markers of that file. Everything it starts is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from . import HERE, REPO
from . import containers as cbench
from .run import log, write_section

BEGIN, END = "<!-- fleet:begin -->", "<!-- fleet:end -->"
NET, SUBNET, GW, S3PORT = "wsbench-fleet", "10.89.148.0/24", "10.89.148.1", 18748
NODES = ["node1", "node2", "node3", "node4", "node5"]
ADDRESS = {node: f"10.89.148.{11 + n}" for n, node in enumerate(NODES)}
PREFIX = "wsbench-fleet-"
FANOUT = (1, 3, 5)


def sh(*argv: str, check: bool = True, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=3600, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res


class Fleet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = args.dir
        self.store = os.path.join(self.dir, "store")
        self.inventory = os.path.join(self.dir, "inventory.ini")
        self.moto: Optional[subprocess.Popen] = None
        self.env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                        PATH=f"{os.path.join(REPO, '.venv', 'bin')}:{os.environ.get('PATH', '')}")

    def up(self) -> None:
        image = cbench.image()
        self.down()
        os.makedirs(self.store, mode=0o700, exist_ok=True)
        cbench.podman("network", "create", "--subnet", SUBNET, "--gateway", GW, NET)
        pki = self.pki()
        for node in NODES:
            cbench.podman("run", "-d", "--name", PREFIX + node, "--hostname", node, "--privileged", "--init",
                          "--network", NET, "--ip", ADDRESS[node], "-v", f"{self.store}:/store", image, "sleep", "infinity")
            sh("podman", "exec", PREFIX + node, "mkdir", "-p", "-m", "0700", "/etc/warmstart/keys/tls")
            for name in ("ca.pem", "cert.pem", "key.pem"):
                src = os.path.join(pki, node if name != "ca.pem" else "", name)
                sh("podman", "cp", src, f"{PREFIX}{node}:/etc/warmstart/keys/tls/{name}")
            sh("podman", "exec", PREFIX + node, "chmod", "0600", "/etc/warmstart/keys/tls/key.pem")
            sh("podman", "exec", PREFIX + node, "mkdir", "-p", "/opt/bench", "/root/.aws")
            sh("podman", "cp", os.path.join(HERE, "mem_workload.py"), f"{PREFIX}{node}:/opt/bench/mem_workload.py")
            sh("podman", "exec", PREFIX + node, "sh", "-c",
               "printf '[fleet]\\naws_access_key_id = fleet\\naws_secret_access_key = fleet-secret\\n' "
               "> /root/.aws/credentials && chmod 600 /root/.aws/credentials")
        self.moto = subprocess.Popen([os.path.join(REPO, ".venv", "bin", "moto_server"), "-H", GW, "-p", str(S3PORT)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        sh(os.path.join(REPO, ".venv", "bin", "python"), "-c",
           "import boto3; boto3.client('s3', endpoint_url='http://%s:%d', aws_access_key_id='fleet', "
           "aws_secret_access_key='fleet-secret', region_name='us-east-1').create_bucket(Bucket='bench')" % (GW, S3PORT))
        with open(self.inventory, "w", encoding="ascii") as handle:
            handle.write("[nodes]\n")
            for node in NODES:
                handle.write(f"{node} ansible_connection=containers.podman.podman ansible_host={PREFIX}{node} "
                             f"warmstart_restore_share_address={ADDRESS[node]}\n")
            handle.write("[nodes:vars]\nprepare_nodes_become=false\nwarmstart_become=false\n")

    def pki(self) -> str:
        """A CA and a certificate per node naming its address (server and client: nodes are both), as files."""
        import importlib.util  # pylint: disable=import-outside-toplevel
        spec = importlib.util.spec_from_file_location("tls_certs", os.path.join(REPO, "tests", "support", "tls_certs.py"))
        assert spec is not None and spec.loader is not None
        certs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(certs)  # the tests' PKI helper (cryptography), loaded from its file
        Pki = certs.Pki  # noqa: N806 - a class
        root = os.path.join(self.dir, "pki")
        shutil.rmtree(root, ignore_errors=True)
        pki = Pki(__import__("pathlib").Path(root))
        shutil.copy(pki.ca("fleet"), os.path.join(root, "ca.pem"))
        for node in NODES:
            cert, key = pki.issue(node, "fleet", ips=[ADDRESS[node]], both=True)
            os.makedirs(os.path.join(root, node), exist_ok=True)
            shutil.copy(cert, os.path.join(root, node, "cert.pem"))
            shutil.copy(key, os.path.join(root, node, "key.pem"))
        return root

    def down(self) -> None:
        for node in NODES:
            cbench.podman("rm", "-f", "-t", "0", PREFIX + node, check=False)
        cbench.podman("network", "rm", "-f", NET, check=False)
        if self.moto is not None:
            self.moto.kill()
            self.moto.wait()
            self.moto = None
        shutil.rmtree(self.store, ignore_errors=True)

    def play(self, name: str, extra: Dict[str, Any], tag: str) -> Dict[str, Any]:
        summary = os.path.join(self.dir, f"{tag}.json")
        extra = dict(extra, warmstart_summary_file=summary)
        t0 = time.monotonic()
        sh("ansible-playbook", name, "-i", self.inventory, "-e", json.dumps(extra), env=self.env)
        wall = time.monotonic() - t0
        with open(summary, "r", encoding="utf-8") as handle:
            rows = json.load(handle)["rows"]
        return {"wall": wall, "rows": rows}

    def adhoc(self, hosts: str, module: str, args: Dict[str, Any]) -> None:
        sh("ansible", hosts, "-i", self.inventory, "-m", module, "-a", json.dumps(args), env=self.env)

    def s3(self) -> Dict[str, Any]:
        return {"warmstart_store": "s3://bench/fleet",
                "warmstart_store_options": {"endpoint_url": f"http://{GW}:{S3PORT}", "profile": "fleet",
                                            "region": "us-east-1"}}

    def restore(self, hosts: List[str], extra: Dict[str, Any], tag: str) -> Dict[str, Any]:
        res = self.play("warmstart.snapshot.restore",
                        dict(extra, warmstart_restore_hosts=":".join(hosts), warmstart_restore_name="bench"), tag)
        bad = [r for r in res["rows"] if r["result"] != "restored"]
        if bad:
            raise RuntimeError(f"restore {tag}: {bad}")
        res["slowest_node"] = max(float(r["total_s"]) for r in res["rows"])
        res["downloaded"] = sum(int(r.get("downloaded") or 0) for r in res["rows"])
        res["from_peers"] = sum(int(r.get("from_peers") or 0) for r in res["rows"])
        self.adhoc(":".join(hosts), "warmstart.snapshot.workload", {"name": "bench", "state": "stopped"})
        return res


def run(args: argparse.Namespace) -> Dict[str, Any]:
    fleet = Fleet(args)
    results: Dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mib": args.mib,
                               "reps": args.reps, "cpus": os.cpu_count(), "kernel": os.uname().release,
                               "fanout": {}, "s3_fanout": {}, "stores": {"s3_cold": [], "s3_warm": [], "fs": []}}
    try:
        log("nodes up")
        fleet.up()
        log("prepare_nodes")
        fleet.play("warmstart.snapshot.prepare_nodes", {}, "prepare")
        log(f"workload of {args.mib} MiB on node1, snapshots into both stores")
        fleet.adhoc("node1", "warmstart.snapshot.workload",
                    {"name": "bench", "command": ["/usr/bin/python3", "/opt/bench/mem_workload.py", str(args.mib)],
                     "wait_ready": True, "ready_timeout": 600})
        target = {"workload": "bench", "name": "bench"}
        fleet.play("warmstart.snapshot.snapshot", {"warmstart_snapshot_hosts": "node1", "warmstart_store": "/store",
                                                   "warmstart_snapshot_target": dict(target, leave_running=True)},
                   "snap-fs")
        snap = fleet.play("warmstart.snapshot.snapshot", dict(fleet.s3(), warmstart_snapshot_hosts="node1",
                                                              warmstart_snapshot_target=dict(target, leave_running=False)),
                          "snap-s3")
        results["bytes"] = int(snap["rows"][0]["bytes"])
        for rep in range(args.reps):
            for k in FANOUT if rep % 2 == 0 else FANOUT[::-1]:
                log(f"fan-out rep {rep + 1}: {k} node(s)")
                res = fleet.restore(NODES[:k], {"warmstart_store": "/store"}, f"fan{k}-{rep}")
                results["fanout"].setdefault(str(k), []).append({"wall": res["wall"], "slowest_node": res["slowest_node"]})
                for share in (False, True) if k > 1 else (False,):
                    log(f"fan-out from S3 rep {rep + 1}: {k} node(s), sharing {'on' if share else 'off'}")
                    for node in NODES[:k]:
                        sh("podman", "exec", PREFIX + node, "rm", "-rf", "/var/lib/warmstart/cache")
                    res = fleet.restore(NODES[:k], dict(fleet.s3(), warmstart_restore_share=share),
                                        f"s3fan{k}{'s' if share else ''}-{rep}")
                    results["s3_fanout"].setdefault(f"{k}{'s' if share else ''}", []).append(
                        {key: res[key] for key in ("wall", "slowest_node", "downloaded", "from_peers")})
            log(f"stores rep {rep + 1}")
            sh("podman", "exec", PREFIX + "node2", "rm", "-rf", "/var/lib/warmstart/cache")
            for key, extra in (("s3_cold", fleet.s3()), ("s3_warm", fleet.s3()), ("fs", {"warmstart_store": "/store"})):
                res = fleet.restore(["node2"], extra, f"{key}-{rep}")
                results["stores"][key].append({"wall": res["wall"], "slowest_node": res["slowest_node"],
                                               "downloaded": res["downloaded"]})
    finally:
        fleet.down()
    return results


def med(values: List[Dict[str, Any]], key: str) -> float:
    return statistics.median(v[key] for v in values)


def markdown(r: Dict[str, Any]) -> str:
    one = med(r["fanout"]["1"], "wall")
    one_node = med(r["fanout"]["1"], "slowest_node")
    ks = sorted(r["fanout"], key=int)
    lines = [BEGIN, "## Fleet: fan-out restore, and S3 vs shared filesystem", "",
             f"Run {r['started']} on {r['cpus']} vCPUs (all {ks[-1]} nodes share them), kernel {r['kernel']}; "
             f"`python3 -m bench.fleet --mib {r['mib']} --reps {r['reps']}`. Podman nodes (the molecule `fleet` set-up), "
             f"one snapshot of a workload holding {r['mib']} MiB ({r['bytes'] / 2**20:.0f} MiB of images), restored "
             "with `ansible-playbook warmstart.snapshot.restore` (its check-mode preflight on every node included). "
             "Wall = the whole playbook run; node = the slowest node's own restore (`total_s` of its summary row).",
             "", "From the shared filesystem store:", "",
             "| nodes | wall | ratio to 1 node | node | ratio to 1 node |", "|---|---|---|---|---|"]
    for k in ks:
        w, n = med(r["fanout"][k], "wall"), med(r["fanout"][k], "slowest_node")
        lines.append(f"| {k} | {w:.2f} s | {w / one:.2f}x | {n:.2f} s | {n / one_node:.2f}x |")
    lines += s3_fanout_lines(r)
    fs = med(r["stores"]["fs"], "wall")
    lines += ["", "Same snapshot onto node2 from each store:", "",
              "| store | wall | ratio to filesystem | node | downloaded |", "|---|---|---|---|---|"]
    for key, label in (("fs", "shared filesystem"), ("s3_cold", "S3, empty node cache"), ("s3_warm", "S3, cache warm")):
        w = med(r["stores"][key], "wall")
        lines.append(f"| {label} | {w:.2f} s | {w / fs:.2f}x | {med(r['stores'][key], 'slowest_node'):.2f} s | "
                     f"{med(r['stores'][key], 'downloaded') / 2**20:.0f} MiB |")
    lines += ["", "Most of the wall time is Ansible itself (two module runs per node - the check-mode preflight and "
              "the restore - over the podman connection, plus the summary play); the node column is the restore "
              "proper. The S3 download from an empty cache is the price of not sharing a filesystem; once a "
              "node has the snapshot in its cache, S3 restores as fast as the shared filesystem.",
              "", "Medians of the repetitions (all in the JSON results). On 2 vCPUs the nodes restore side by side on "
              "the same two cores and the same disk, so fan-out here measures contention, not the parallelism a "
              "real fleet of separate machines gets; the S3 server is moto on loopback-class networking.", END]
    return "\n".join(lines) + "\n"


def s3_fanout_lines(r: Dict[str, Any]) -> List[str]:
    """The S3 fan-out table: per node count, sharing off and on; bytes the bucket sent against the snapshot."""
    runs = r.get("s3_fanout") or {}
    if "1" not in runs:
        return []
    one, one_node, size = med(runs["1"], "wall"), med(runs["1"], "slowest_node"), float(r["bytes"])
    lines = ["", "From S3, every node's cache empty; sharing = `warmstart_restore_share` (each node downloads its "
             "share of the chunks and gets the rest from the others over mutual TLS, each chunk checked against "
             "the manifest). Read from the bucket = bytes all nodes downloaded from it, as a multiple of the "
             "snapshot (target with sharing: at most 1.2x):", "",
             "| nodes | sharing | wall | ratio to 1 node | node | ratio to 1 node | read from the bucket | from peers |",
             "|---|---|---|---|---|---|---|---|"]
    for key in sorted(runs, key=lambda k: (int(k.rstrip("s")), k)):
        w, n = med(runs[key], "wall"), med(runs[key], "slowest_node")
        got, peers = med(runs[key], "downloaded"), med(runs[key], "from_peers")
        lines.append(f"| {key.rstrip('s')} | {'on' if key.endswith('s') else 'off'} | {w:.2f} s | {w / one:.2f}x | "
                     f"{n:.2f} s | {n / one_node:.2f}x | {got / 2**20:.0f} MiB ({got / size:.2f}x) | "
                     f"{peers / 2**20:.0f} MiB |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.fleet", description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/warmstart-bench-fleet")
    ap.add_argument("--markdown")
    ap.add_argument("--from-json")
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json, "r", encoding="utf-8") as handle:
            results = json.load(handle)
    else:
        if os.geteuid() != 0 or not os.environ.get("CONTAINERS_CONF"):
            print("needs root and the tests' podman settings: eval \"$(tests/support/podman-env.sh)\"", file=sys.stderr)
            return 2
        os.makedirs(os.path.join(args.dir, "results"), mode=0o700, exist_ok=True)
        results = run(args)
        out = os.path.join(args.dir, "results", f"fleet-{results['started'].replace(':', '')}.json")
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
        log(f"results: {out}")
    text = markdown(results)
    print(text)
    if args.markdown:
        write_section(args.markdown, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
