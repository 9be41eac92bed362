"""The merge across ranks next to the generic merge, in one run:

    torchrun --nproc-per-node 2 scripts/bench_merge.py --out merge.json     (GPUs: NVSHMEM)
    torchrun --nproc-per-node 2 scripts/bench_merge.py --cpu --rows 2 --widths 4096   (CPU smoke run)

Per (T, S_local), K = 2048, N = default_local_topk(K, W):
  merge      dcp_topk_merge on this rank's shard, eager and replayed from a
             CUDA graph (medians of per-call CUDA-event timings; every rank
             runs the same loop, the flags keep them in step);
  stages     device time per stage from torch.profiler over graph replays
             (pack = estimate + count + write + finish kernels);
  generic    local torch.topk(k=K), 8-byte (fp32 score bits << 32 | global
             id) pairs all-gathered by NCCL (W*K*8 bytes per row), top-K over
             the W*K pairs; eager and graph;
  exchange   NCCL all_gather_into_tensor of this library's round-1 bytes
             (W*(N + P*N/32)*4 per row), in a graph, beside the push kernel.
Every merge's ids are checked against the reference merge of the same
global logits (each rank builds them from one seed and keeps its shard)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import nvshmem_topk as nt
from nvshmem_topk.format import default_local_topk, num_planes, packed_row_words
from timing import graphed, kernel_times

STAGES = {"estimate_kernel": "pack", "count_kernel": "pack", "write_kernel": "pack", "finish_kernel": "pack",
          "push_rows_kernel": "exchange", "select_kernel": "select", "rescue_kernel": "rescue"}


def timed(fn, device: torch.device, iters: int) -> float:
    """Median microseconds of one call, after warm-up, every rank together."""
    for _ in range(5):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    if device.type != "cuda":
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def stage_times(fn) -> dict:
    """Device microseconds per stage of one call."""
    stages: dict[str, float] = {}
    for kernel, us in kernel_times(fn).items():
        stage = STAGES.get(kernel, "other")
        stages[stage] = stages.get(stage, 0.0) + us
    return stages


def generic_merge(x: torch.Tensor, topk: int, rank: int, world: int) -> torch.Tensor:
    """The generic merge of this rank's shard x [T, S]: int64 global ids [T, K]."""
    vals, idx = x.topk(topk, dim=1)
    gid = idx * world + rank
    pairs = (vals.float().view(torch.int32).to(torch.int64) << 32) | gid  # 8 bytes per candidate
    every = torch.empty((world * x.shape[0], topk), dtype=torch.int64, device=x.device)
    dist.all_gather_into_tensor(every, pairs)
    every = every.view(world, x.shape[0], topk).permute(1, 0, 2).reshape(x.shape[0], world * topk)
    scores = (every >> 32).to(torch.int32).view(torch.float32)
    return (every & 0xFFFFFFFF).gather(1, scores.topk(topk, dim=1).indices)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench_merge.json")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--widths", type=int, nargs="+", default=[16384, 65536, 131072])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--cpu", action="store_true", help="ShmGroup + reference stages (checks the script)")
    args = parser.parse_args()

    if args.cpu:
        group = nt.ShmGroup.from_env()
        device, impl, iters = torch.device("cpu"), "reference", 3
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("cpu:gloo,cuda:nccl")
        group = nt.NvshmemGroup()
        device, impl, iters = group.device, "triton", args.iters
    rank, world, k = group.rank, group.world_size, args.topk
    n = default_local_topk(k, world)
    lead = rank == 0
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "world_size": world, "topk": k, "local_topk": n, "merge": []}
    if lead:
        print(f"# {results['device']} x{world}  K={k} N={n}  medians (us) over {iters} calls per rank")
        print(f"{'T':>5}{'S':>8}{'eager':>9}{'graph':>9}{'generic':>9}{'gen graph':>10}{'speedup':>9}"
              f"{'pack':>8}{'push':>8}{'select':>8}{'rescue':>8}{'nccl ag':>9}  exact")
    for rows in args.rows:
        for width in args.widths:
            gen = torch.Generator(device=device).manual_seed(rows * width)  # the same on every rank
            logits = torch.randn(world, rows, width, device=device, generator=gen).bfloat16()
            ends = torch.full((world, rows), width, dtype=torch.int32, device=device)
            x, x_ends = logits[rank].contiguous(), ends[rank].contiguous()
            ws = nt.init_dcp_topk_merge(group, max_rows=rows, topk=k, local_topk=n, max_local_len=width,
                                        impl=impl, timeout_s=30)
            ids = torch.empty(rows, k, dtype=torch.int32, device=device)
            merge = lambda: nt.dcp_topk_merge(x, x_ends, ids, workspace=ws)  # noqa: E731
            generic = lambda: generic_merge(x, k, rank, world)  # noqa: E731
            row = dict(T=rows, S=width, merge_eager_us=timed(merge, device, iters),
                       generic_eager_us=timed(generic, device, iters))
            merge()
            want = nt.simulate_dcp_topk_merge(logits, ends, topk=k, impl="reference")[rank]
            row["exact"] = bool(torch.equal(ids, want))
            if device.type == "cuda":
                row["merge_graph_us"] = timed(graphed(merge).replay, device, iters)
                row["generic_graph_us"] = timed(graphed(generic).replay, device, iters)
                packed = torch.empty(rows, packed_row_words(n, num_planes(width)), dtype=torch.int32,
                                     device=device)
                every = torch.empty((world * rows, packed.shape[1]), dtype=torch.int32, device=device)
                row["nccl_all_gather_graph_us"] = timed(
                    graphed(lambda: dist.all_gather_into_tensor(every, packed)).replay, device, iters)
                row["stages_us"] = stage_times(graphed(merge).replay)
            results["merge"].append(row)
            ws.destroy()
            if lead:
                with open(args.out, "w") as f:  # after every shape: a run cut short keeps what it measured
                    json.dump(results, f, indent=1)
                stage = row.get("stages_us", {})
                fmt = lambda key: f"{row[key]:.1f}" if key in row else "-"  # noqa: E731
                best, base = row.get("merge_graph_us", row["merge_eager_us"]), \
                    row.get("generic_graph_us", row["generic_eager_us"])
                print(f"{rows:>5}{width:>8}{fmt('merge_eager_us'):>9}{fmt('merge_graph_us'):>9}"
                      f"{fmt('generic_eager_us'):>9}{fmt('generic_graph_us'):>10}{base / best:>8.1f}x"
                      + "".join(f"{stage.get(s, 0.0):>8.1f}" for s in ("pack", "exchange", "select", "rescue"))
                      + f"{fmt('nccl_all_gather_graph_us'):>9}  {row['exact']}", flush=True)
    group.destroy()
    if not args.cpu:
        nt.finalize_nvshmem()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
