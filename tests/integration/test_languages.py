"""Workloads that are not Python: a Node.js server, a Java server (JIT, GC and a dozen JVM threads) and a C
server with a pthread, each holding random memory and a listening socket, checkpointed and restored eagerly and
lazily with real CRIU; after the restore each answers with the memory digest it computed at start, recomputed
over its memory now, and a counter that went on. A Node.js cluster (a primary handing connections to two
workers over its IPC channels) comes back as the same tree.

A JVM maps a performance-data file of its own (``/tmp/hsperfdata_<user>/<pid>``) that exists only where it
started: on a node without it the restore is refused before anything runs, naming the file and the JVM flag
that avoids it; with that flag the JVM restores on such a node.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from .process_lab import Lab, free_port, json_line, pids_running

pytestmark = pytest.mark.integration

NODE = r"""
const net = require('net'), crypto = require('crypto');
const mem = crypto.randomBytes(48 << 20);
const sha = () => crypto.createHash('sha256').update(mem).digest('hex');
const atStart = sha();
let counter = 0, ticks = 0;
setInterval(() => { ticks++; }, 10);
net.createServer((sock) => {
  sock.once('data', () => {
    counter++;
    sock.end(JSON.stringify({lang: 'node', pid: process.pid, counter, ticks, digest_at_start: atStart,
                             digest: sha()}) + '\n');
  });
}).listen(parseInt(process.argv[2]), '127.0.0.1');
"""

CLUSTER = r"""
const cluster = require('cluster'), net = require('net'), crypto = require('crypto');
cluster.schedulingPolicy = cluster.SCHED_RR;  // the primary accepts and hands each connection to the next worker
if (cluster.isPrimary) {
  for (let i = 0; i < 2; i++) cluster.fork();
} else {
  const mem = crypto.randomBytes(16 << 20);
  const sha = () => crypto.createHash('sha256').update(mem).digest('hex');
  const atStart = sha();
  let counter = 0;
  net.createServer((sock) => {
    sock.once('data', () => {
      counter++;
      sock.end(JSON.stringify({lang: 'node-cluster', pid: process.pid, ppid: process.ppid, counter, ticks: 0,
                               digest_at_start: atStart, digest: sha()}) + '\n');
    });
  }).listen(parseInt(process.argv[2]), '127.0.0.1');
}
"""

JAVA = r"""
import java.io.*; import java.net.*; import java.security.*; import java.util.*;
public class Server {
  static final byte[] mem = new byte[48 << 20];
  static volatile long ticks = 0;
  static String sha() throws Exception {
    StringBuilder s = new StringBuilder();
    for (byte b : MessageDigest.getInstance("SHA-256").digest(mem)) s.append(String.format("%02x", b));
    return s.toString();
  }
  public static void main(String[] args) throws Exception {
    new SecureRandom().nextBytes(mem);
    String atStart = sha();
    Thread t = new Thread(() -> { while (true) { ticks++; try { Thread.sleep(10); } catch (InterruptedException e) { return; } } });
    t.setDaemon(true); t.start();
    int counter = 0;
    try (ServerSocket srv = new ServerSocket(Integer.parseInt(args[0]), 16, InetAddress.getByName("127.0.0.1"))) {
      while (true) {
        try (Socket c = srv.accept()) {
          new BufferedReader(new InputStreamReader(c.getInputStream())).readLine();
          counter++;
          String out = "{\"lang\": \"java\", \"counter\": " + counter + ", \"ticks\": " + ticks
              + ", \"digest_at_start\": \"" + atStart + "\", \"digest\": \"" + sha() + "\"}\n";
          c.getOutputStream().write(out.getBytes("UTF-8"));
        }
      }
    }
  }
}
"""

C = r"""
#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define SIZE (48u << 20)
static unsigned char *mem;
static volatile unsigned long ticks;
static uint64_t fnv(void) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < SIZE; i++) { h ^= mem[i]; h *= 1099511628211ULL; }
    return h;
}
static void *tick(void *arg) { (void)arg; for (;;) { ticks++; usleep(10000); } return NULL; }
int main(int argc, char **argv) {
    FILE *rnd = fopen("/dev/urandom", "rb");
    mem = malloc(SIZE);
    if (!rnd || !mem || fread(mem, 1, SIZE, rnd) != SIZE) return 1;
    fclose(rnd);
    uint64_t at_start = fnv();
    pthread_t t;
    pthread_create(&t, NULL, tick, NULL);
    int srv = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(srv, (struct sockaddr *)&addr, sizeof(addr)) || listen(srv, 16)) return 2;
    for (unsigned long counter = 1;; counter++) {
        int c = accept(srv, NULL, NULL);
        char buf[64], out[256];
        if (c < 0) continue;
        if (read(c, buf, sizeof(buf)) >= 0) {
            int n = snprintf(out, sizeof(out), "{\"lang\": \"c\", \"counter\": %lu, \"ticks\": %lu, "
                             "\"digest_at_start\": \"%016llx\", \"digest\": \"%016llx\"}\n", counter, ticks,
                             (unsigned long long)at_start, (unsigned long long)fnv());
            if (write(c, out, n) != n) perror("write");
        }
        close(c);
    }
}
"""


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed on this node: run tests/support/install-system-deps.sh")
    return path


def command(lang: str, tmp: Path, *jvm: str) -> List[str]:
    """The server's command line; its source written (and, for C, compiled) under ``tmp``."""
    if lang == "node":
        (tmp / "server.js").write_text(NODE)
        return [need("node"), str(tmp / "server.js")]
    if lang == "java":
        need("javac")  # the source launcher compiles with the JDK's compiler
        (tmp / "Server.java").write_text(JAVA)
        return [need("java"), "-Xmx256m", *jvm, str(tmp / "Server.java")]
    (tmp / "server.c").write_text(C)
    subprocess.run([need("gcc"), "-O2", "-pthread", "-o", str(tmp / "server-c"), str(tmp / "server.c")],
                   check=True, capture_output=True, timeout=120)
    return [str(tmp / "server-c")]


def ask(port: int, timeout: float = 60.0) -> Dict[str, Any]:
    got = json_line(("127.0.0.1", port), b"state\n", timeout)
    assert got["digest"] == got["digest_at_start"], f"{got['lang']}: its memory changed: {got}"
    return got


@pytest.fixture
def world(lab: Lab, tmp_path: Path) -> Iterator[Lab]:
    """The lab; afterwards every process started from this test's directory is killed."""
    try:
        yield lab
    finally:
        for pid in pids_running(str(tmp_path)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start(lab: Lab, name: str, argv: List[str], port: int) -> Dict[str, Any]:
    return {"name": f"start {name}", "warmstart.snapshot.workload": {
        "name": name, "root": str(lab.workloads), "command": [*argv, str(port)]}}


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("lang", ["node", "java", "c"])
def test_a_server_in_another_language_comes_back_with_its_memory(world: Lab, tmp_path: Path, lang: str,
                                                                 lazy: bool) -> None:
    port = free_port()
    world.play([start(world, lang, command(lang, tmp_path), port)])
    before = ask(port)
    res = world.play([world.checkpoint("checkpoint", workload=lang, leave_running=False),
                      world.restore("restore", name=lang, lazy=lazy, lazy_wait=lazy)])
    assert res["checkpoint"]["snapshot"]["source_running"] is False
    out = res["restore"]["restore"]
    assert out["outcome"] == "succeeded" and out["lazy"]["used"] is lazy, out["lazy"]
    after = ask(port, 30)
    assert after["digest_at_start"] == before["digest_at_start"], "another process answers"
    assert after["counter"] == before["counter"] + 1, (before, after)
    assert after["ticks"] >= before["ticks"], "its threads' state went back"
    assert world.pidfile_pid(lang) == out["pid"]


def test_a_node_cluster_comes_back_as_a_tree_whose_workers_keep_their_memory(world: Lab, tmp_path: Path) -> None:
    """A process tree in another language: a Node.js cluster primary that accepts connections and hands each one,
    over its IPC channel, to the next of its two workers (each with memory of its own)."""
    port = free_port()
    (tmp_path / "cluster.js").write_text(CLUSTER)
    world.play([start(world, "cluster", [need("node"), str(tmp_path / "cluster.js")], port)])
    before: Dict[int, Dict[str, Any]] = {}
    end = time.monotonic() + 60
    while len(before) < 2 and time.monotonic() < end:  # a worker gets connections once it listens
        got = ask(port)
        before[got["pid"]] = got
    assert len(before) == 2, f"the two workers did not both answer: {before}"
    res = world.play([world.checkpoint("checkpoint", workload="cluster", leave_running=False),
                      world.restore("restore", name="cluster", lazy=True, lazy_wait=True)])
    assert len(res["restore"]["restore"]["pids"]) == 3, res["restore"]["restore"]["pids"]
    after = {got["pid"]: got for got in [ask(port, 30) for _n in range(4)]}
    assert set(after) == set(before), (before, after)
    for pid, got in after.items():
        assert got["digest_at_start"] == before[pid]["digest_at_start"] and got["ppid"] == before[pid]["ppid"]
        assert got["counter"] > before[pid]["counter"], (before[pid], got)


def test_a_jvm_is_refused_where_its_perf_data_file_is_missing_and_restores_without_one(world: Lab,
                                                                                       tmp_path: Path) -> None:
    """As on a node that never ran this JVM: its /tmp/hsperfdata file removed after the checkpoint."""
    port, plain = free_port(), free_port()
    world.play([start(world, "jvm", command("java", tmp_path), port),
                start(world, "jvm-noperf", command("java", tmp_path, "-XX:-UsePerfData"), plain)])
    before = {p: ask(p) for p in (port, plain)}
    res = world.play([world.checkpoint("checkpoint", workload="jvm", leave_running=False),
                      world.checkpoint("checkpoint noperf", workload="jvm-noperf", leave_running=False)])
    manifest = json.loads((world.store / "snapshots" / res["checkpoint"]["snapshot"]["id"] / "manifest.json").read_text())
    mapped = [f for f in manifest["targets"][0]["files_in_use"] if "/hsperfdata_" in f]
    assert mapped, "the JVM mapped no perf-data file"
    for path in mapped:
        Path(path).unlink(missing_ok=True)
    res = world.play([world.restore("restore", name="jvm", expect_fail=True),
                      world.restore("restore noperf", name="jvm-noperf")])
    refused = res["restore"]
    assert refused["failed"] and refused.get("outcome") == "incompatible", refused
    reason = next(r for r in refused["reasons"] if "/hsperfdata_" in r)
    assert "missing on this node; a JVM's performance-data file" in reason and "-XX:-UsePerfData" in reason, reason
    assert world.pidfile_pid("jvm") is None or not Path(f"/proc/{world.pidfile_pid('jvm')}").exists()
    after = ask(plain, 30)
    assert after["digest_at_start"] == before[plain]["digest_at_start"] and after["counter"] == 2
