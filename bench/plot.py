#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Draw bench/lazy.py's results as a PNG: time to first answer and to full memory per start, per server.

    python -m bench.plot RESULTS.json --out docs/benchmarks-lazy.png     (from the checkout root)

Needs matplotlib (a venv of its own: see bench/README.md); reads only the ``summary`` of the results JSON.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any, Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position
from matplotlib import ticker  # noqa: E402  pylint: disable=wrong-import-position

STARTS = ["cold", "eager", "lazy", "eager_verify", "lazy_verify"]
LABELS = {"cold": "cold start", "eager": "eager restore", "lazy": "lazy restore",
          "eager_verify": "eager, full\nSHA256 pass", "lazy_verify": "lazy, full\nSHA256 pass"}
PARTS = {"synthetic": "synthetic server, {mib} MiB of weights", "demo": "demo server (MiniLM embeddings)"}


def _median(stat: Dict[str, Any]) -> float:
    return float(stat["median"]) if stat and stat.get("n") else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.plot", description=__doc__.split("\n", 1)[0])
    ap.add_argument("results")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.results, "r", encoding="utf-8") as handle:
        results = json.load(handle)
    summary = results["summary"]
    parts = [p for p in PARTS if p in summary]
    if not parts:
        raise SystemExit(f"{args.results}: no summary to plot")
    fig, axes = plt.subplots(1, len(parts), figsize=(6.2 * len(parts), 4.6), squeeze=False)
    for ax, part in zip(axes[0], parts):
        s = summary[part]
        starts: List[str] = [k for k in STARTS if k in s]
        first = [_median(s[k]["first_answer_s"]) for k in starts]
        full = [_median(s[k]["full_memory_s"]) for k in starts]
        xs = range(len(starts))
        width = 0.38
        b1 = ax.bar([x - width / 2 for x in xs], first, width, label="time to first answer", color="#2b7bb9")
        b2 = ax.bar([x + width / 2 for x in xs], full, width, label="time to full memory", color="#f0a030")
        for bars in (b1, b2):
            for rect in bars:
                height = rect.get_height()
                if not math.isnan(height):
                    ax.annotate(f"{height:.2f}", (rect.get_x() + rect.get_width() / 2, height), ha="center",
                                va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        ax.set_yscale("log")
        finite = [v for v in first + full if not math.isnan(v) and v > 0]
        if finite:
            ax.set_ylim(min(finite) * 0.6, max(finite) * 4)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xticks(list(xs))
        ax.set_xticklabels([LABELS[k] for k in starts], fontsize=9)
        ax.set_ylabel("seconds (log scale, median)")
        ax.set_title(PARTS[part].format(mib=results["options"]["weights_mib"]) + f", n={s['n']}", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    m = results["machine"]
    fig.suptitle(f"warmstart: cold start vs eager vs lazy restore\n{m['cpus']} vCPUs, kernel {m['kernel']},"
                 f" CRIU {m['criu']}, {results['started_at'][:16]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
