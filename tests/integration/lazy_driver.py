"""Drive one lazy restore through the engine, for test_lazy.py (run by the modules' Python, which has pycriu).

    lazy_driver.py STORE RESTORE_ROOT SNAPSHOT_ID [--stop-daemon] [--lazy-timeout S] [--criu PATH]

Prints one JSON line: the restore result, or {"error": ..., "reasons": [...]}. With --stop-daemon it SIGSTOPs
the lazy-pages daemon the moment the restore returns (memory still loading), so the test can fault it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".collections"))

from ansible_collections.warmstart.snapshot.plugins.module_utils import _snapshot as snap  # noqa: E402
from ansible_collections.warmstart.snapshot.plugins.module_utils import _store as st  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("restore_root")
    ap.add_argument("snapshot")
    ap.add_argument("--stop-daemon", action="store_true")
    ap.add_argument("--lazy-timeout", type=float, default=600)
    ap.add_argument("--criu")
    ap.add_argument("--page-server")
    args = ap.parse_args()
    try:
        result = snap.restore(st.FsStore(args.store), snapshot_id=args.snapshot, lazy=True, criu_path=args.criu,
                              restore_root=args.restore_root, lazy_timeout=args.lazy_timeout,
                              page_server=args.page_server)
    except Exception as exc:  # pylint: disable=broad-except  # reported to the test
        print(json.dumps({"error": str(exc), "reasons": getattr(exc, "reasons", [])}))
        return
    if args.stop_daemon and result["lazy"].get("daemon_pid"):
        os.kill(result["lazy"]["daemon_pid"], signal.SIGSTOP)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
