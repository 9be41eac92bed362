"""Markdown tables of a family benchmark's JSON (scripts/bench_kernels.py):
per pack shape and per merge, each family's time, its ratio to i.i.d.
normal and the baseline; the worst family marked.

    python scripts/performance_tables.py docs/results/h200_skip_0e98b2d.json [...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def tables(results: dict) -> str:
    lines = []
    packs = defaultdict(list)
    for r in results.get("pack", []):
        packs[(r["T"], r["S"], r["N"])].append(r)
    for (rows, width, n), runs in packs.items():
        normal = next(r["pack_us"] for r in runs if r["family"] == "normal")
        worst = max(runs, key=lambda r: r["pack_us"])
        lines += [f"Pack [{rows}, {width}], N = {n}, µs", "",
                  "| family | pack | vs normal | torch.topk(k=N) | exact |", "|---|---|---|---|---|"]
        for r in runs:
            mark = " (worst)" if r is worst else ""
            lines.append(f"| {r['family']}{mark} | {r['pack_us']:.1f} | {r['pack_us'] / normal:.2f}× "
                         f"| {r['torch_topk_us']:.1f} | {r['exact']} |")
        lines.append("")
    merges = defaultdict(list)
    for r in results.get("merge", []):
        if r.get("family") != "rank0_best":
            merges[(r["W"], r["T"], r["S"], r["I"])].append(r)
    for (world, rows, width, interleave), runs in merges.items():
        normal = next(r["merge_us"] for r in runs if r["family"] == "normal")
        worst = max(runs, key=lambda r: r["merge_us"])
        lines += [f"Simulated merge W = {world}, T = {rows}, S = {width}, interleave {interleave}, K = 2048, µs", "",
                  "| family | merge | vs normal | generic by rank | speed-up | saturated rows | exact |",
                  "|---|---|---|---|---|---|---|"]
        for r in runs:
            mark = " (worst)" if r is worst else ""
            lines.append(f"| {r['family']}{mark} | {r['merge_us']:.1f} | {r['merge_us'] / normal:.2f}× "
                         f"| {r['generic_by_rank_us']:.1f} | {r['generic_by_rank_us'] / r['merge_us']:.1f}× "
                         f"| {r['saturated_rows']} | {r['exact']} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(tables(json.load(f)))
