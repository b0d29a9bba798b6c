"""Drive one lazy restore through the engine, for test_lazy.py (run by the modules' Python, which has pycriu).

    lazy_driver.py STORE RESTORE_ROOT SNAPSHOT_ID [--stop-daemon] [--lazy-timeout S] [--criu PATH]
                   [--into PLACEHOLDER [--runtime podman] [--lazy-wait]]

Prints one JSON line: the restore result, or {"error": ..., "reasons": [...]}. With --stop-daemon it SIGSTOPs
the lazy-pages daemon the moment CRIU's restore returned (before the engine hands the tree to the daemon's
supervisor; memory still loading), so the test can fault it. ``--into``: a container snapshot restored lazily
into that placeholder container (``_restoreinto``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".collections"))

from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restore as rs  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.snapshot import _restoreinto as rinto  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _store as st  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("restore_root")
    ap.add_argument("snapshot")
    ap.add_argument("--stop-daemon", action="store_true")
    ap.add_argument("--lazy-timeout", type=float, default=600)
    ap.add_argument("--criu")
    ap.add_argument("--page-server")
    ap.add_argument("--workloads-root", default=rs.wl.DEFAULT_ROOT)
    ap.add_argument("--into")
    ap.add_argument("--runtime", default="podman")
    ap.add_argument("--lazy-wait", action="store_true")
    args = ap.parse_args()
    if args.stop_daemon:
        attach = rs.lz.Session.attach

        def stopped_then_attach(session: "rs.lz.Session", pid: int, placeholder: "int | None" = None) -> None:
            os.kill(session.daemon_pid, signal.SIGSTOP)
            attach(session, pid, placeholder)
        rs.lz.Session.attach = stopped_then_attach  # type: ignore[method-assign]
    try:
        if args.into:
            print(json.dumps(rinto.restore_into(st.FsStore(args.store), args.into, snapshot_id=args.snapshot, lazy=True,
                                                criu_path=args.criu, restore_root=args.restore_root,
                                                lazy_timeout=args.lazy_timeout, runtime_name=args.runtime,
                                                lazy_wait=args.lazy_wait)))
            return
        result = rs.restore(st.FsStore(args.store), snapshot_id=args.snapshot, lazy=True, criu_path=args.criu,
                            restore_root=args.restore_root, lazy_timeout=args.lazy_timeout,
                            page_server=args.page_server, workloads_root=args.workloads_root)
    except Exception as exc:  # pylint: disable=broad-except  # reported to the test
        print(json.dumps({"error": str(exc), "reasons": getattr(exc, "reasons", [])}))
        return
    print(json.dumps(result))


if __name__ == "__main__":
    main()
