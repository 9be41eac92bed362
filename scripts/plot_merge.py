"""README's plot from the merge benchmark's JSON (scripts/bench_merge.py):
latency vs T and vs S_local of the merge (CUDA graph, push exchange) beside
the generic merge (CUDA graph), with the CLI's plotting.

    python scripts/plot_merge.py docs/results/h200x2_bench_merge.json docs/results/h200x2_merge.png
"""

from __future__ import annotations

import json
import sys

from nvshmem_topk.__main__ import _plot


def main() -> None:
    source, target = sys.argv[1:3]
    with open(source) as f:
        data = json.load(f)
    records = [dict(T=r["T"], S=r["S"], merge_ms=r["merge_graph_us"]["push"] / 1e3,
                    generic_ms=r["generic_graph_us"] / 1e3) for r in data["merge"]]
    _plot(records, target, f"merge over {data['world_size']} x {data['device']}, K={data['topk']}, "
                           f"N={data['local_topk']}: CUDA-graph medians")


if __name__ == "__main__":
    main()
