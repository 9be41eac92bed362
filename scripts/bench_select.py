"""The select alone on one GPU, at several group sizes: rank 0's select of a
simulated group of W ranks (SimulatedMerge.select_alone: no wait holds) is
timed from a CUDA graph of GRAPH_CALLS calls (nvshmem_topk.timing.graph_us:
the median of its replays, L2 flushed before each; the best of three
medians). Each timed select's own ids are checked against the
reference merge.

    python scripts/bench_select.py [--configs 8x64 2x64 16x64] [--topk 2048] [--width 16384] [--sorted]

A config is WxT: W ranks, T rows; N = default_local_topk(K, W)."""

from __future__ import annotations

import argparse

import torch

import nvshmem_topk as nt
from nvshmem_topk.format import default_local_topk
from nvshmem_topk.timing import GRAPH_CALLS, SimulatedMerge, graph_us


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", nargs="+", default=["8x64", "8x8", "2x64", "4x64", "16x64"])
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--width", type=int, default=16384)
    parser.add_argument("--sorted", action="store_true", help="ids by descending key")
    args = parser.parse_args()
    dev, k, width = torch.device("cuda"), args.topk, args.width
    print(f"# {torch.cuda.get_device_name()}  select alone, K={k} S={width}{' sorted' * args.sorted}, us per call "
          f"(graphs of {GRAPH_CALLS})")
    for config in args.configs:
        world, rows = (int(v) for v in config.split("x"))
        gen = torch.Generator(device=dev).manual_seed(0)
        logits = torch.randn(world, rows, width, device=dev, generator=gen).bfloat16()
        ends = torch.full((world, rows), width, dtype=torch.int32, device=dev)
        merge = SimulatedMerge(logits, ends, k, "triton", sorted=args.sorted)
        select = merge.select_alone()
        expected = nt.simulate_dcp_topk_merge(logits, ends, topk=k, impl="reference", sorted=args.sorted)
        merge.ids.fill_(-2)
        us = min(graph_us(select, 200) for _ in range(3))
        exact = bool(torch.equal(merge.ids[0], expected[0]))
        print(f"W={world:<3} T={rows:<4} N={default_local_topk(k, world):<5} select {us:6.2f}  exact={exact}",
              flush=True)
        merge.destroy()


if __name__ == "__main__":
    main()
