"""The merge across ranks next to the generic merge, in one run:

    torchrun --nproc-per-node 2 scripts/bench_merge.py --out merge.json     (GPUs: NVSHMEM)
    torchrun --nproc-per-node 2 scripts/bench_merge.py --library-path --rows 64 --widths 65536
    torchrun --nproc-per-node 2 scripts/bench_merge.py --cpu --rows 2 --widths 4096   (CPU smoke run)

Per (T, S_local), K = 2048, N = default_local_topk(K, W):
  merge      dcp_topk_merge on this rank's shard (medians of per-call CUDA-event
             timings; every rank runs the same loop, the flags keep them in
             step): eager with the push exchange, and replayed from a CUDA
             graph of GRAPH_CALLS merges with each exchange (push, NCCL
             all_gather, NVSHMEM fcollect), per merge; with --library-path
             also the push merge of a second group that reaches every peer
             through NVSHMEM's device library ("push_library");
  stages     device time per stage of the push merge from torch.profiler over
             graph replays (pack = estimate + filter + finish kernels, the
             finish pushing the rows itself, so push is only the push kernel
             of a merge with device-library peers; select includes its wait
             for the peer's rows);
  generic    local torch.topk(k=K), 8-byte (fp32 score bits << 32 | global
             id) pairs all-gathered by NCCL (W*K*8 bytes per row), top-K over
             the W*K pairs; eager and graph;
  exchange   the round-1 rows alone (W*(N + P*N/32)*4 bytes per row), in a
             graph: the push kernel, NCCL all_gather_into_tensor, fcollect.
Every merge's ids are checked against the reference merge of the same
global logits (each rank builds them from one seed and keeps its shard)."""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import nvshmem_topk as nt
from nvshmem_topk.format import default_local_topk, num_planes, packed_row_words
from nvshmem_topk.timing import GRAPH_CALLS, graph_us, graphed, kernel_times, median_us, without_pdl

STAGES = {"estimate_kernel": "pack", "filter_kernel": "pack", "finish_kernel": "pack",
          "push_rows_kernel": "exchange", "select_kernel": "select", "rescue_kernel": "rescue"}


def timed(fn, device: torch.device, iters: int) -> float:
    """Median microseconds of one call of ``fn``, every rank together."""
    return median_us(fn, device, iters, before=dist.barrier)


def graph_timed(fn, device: torch.device, iters: int) -> float:
    """Median microseconds of one call of ``fn`` replayed from a CUDA graph of
    GRAPH_CALLS calls, every rank together."""
    return graph_us(fn, iters, flush_l2=False, before=dist.barrier)


def stage_times(fn, ws) -> dict:
    """Device microseconds per stage of one call of ``fn``, profiled over
    replays of a graph of GRAPH_CALLS calls: within a replay the ranks
    run in step, so the select's wait measures the peer's lag, not how far
    apart the two hosts launched."""
    stages: dict[str, float] = {}
    with without_pdl([ws]):  # each kernel's own time
        times = kernel_times(graphed(fn, GRAPH_CALLS).replay)
    for kernel, us in times.items():
        stage = STAGES.get(kernel, "other")
        stages[stage] = stages.get(stage, 0.0) + us / GRAPH_CALLS
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
    parser.add_argument("--library-path", action="store_true",
                        help="also time the push merge with every peer reached through NVSHMEM's device library "
                             "(a second group, device_library='always')")
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
    merges = [(exchange, group, exchange) for exchange in (("push",) if args.cpu else group.exchanges)]
    library = nt.NvshmemGroup(device_library="always") if args.library_path else None
    if library is not None:
        merges.append(("push_library", library, "push"))
    if lead:
        print(f"# {results['device']} x{world}  K={k} N={n}  medians (us) over {iters} calls per rank;"
              " graph = CUDA-graph replay; stages of the push merge from torch.profiler")
        print(f"{'T':>5}{'S':>8}{'eager':>8}{'graph':>8}{'ag':>7}{'fcol':>7}{'generic':>9}{'gen gr':>8}"
              f"{'speedup':>9}{'pack':>7}{'push':>7}{'select':>8}{'rescue':>8}"
              f"{'x push':>8}{'x nccl':>8}{'x fcol':>8}{'lib':>8}  exact")
    for rows in args.rows:
        for width in args.widths:
            gen = torch.Generator(device=device).manual_seed(rows * width)  # the same on every rank
            logits = torch.randn(world, rows, width, device=device, generator=gen).bfloat16()
            ends = torch.full((world, rows), width, dtype=torch.int32, device=device)
            x, x_ends = logits[rank].contiguous(), ends[rank].contiguous()
            want = nt.simulate_dcp_topk_merge(logits, ends, topk=k, impl="reference")[rank]
            ids = torch.empty(rows, k, dtype=torch.int32, device=device)
            generic = lambda: generic_merge(x, k, rank, world)  # noqa: E731
            row = dict(T=rows, S=width, generic_eager_us=timed(generic, device, iters), merge_graph_us={},
                       exact={}, exchange_graph_us={})
            for name, merge_group, exchange in merges:
                ws = nt.init_dcp_topk_merge(merge_group, max_rows=rows, topk=k, local_topk=n, max_local_len=width,
                                            impl=impl, exchange=exchange, timeout_s=30)
                merge = lambda: nt.dcp_topk_merge(x, x_ends, ids, workspace=ws)  # noqa: E731
                if name == "push":
                    row["merge_eager_us"] = timed(merge, device, iters)
                ids.fill_(-2)
                merge()
                row["exact"][name] = bool(torch.equal(ids, want))
                if device.type == "cuda":
                    row["merge_graph_us"][name] = graph_timed(merge, device, iters)
                    if name == "push":
                        row["stages_us"] = stage_times(merge, ws)
                        # The push alone, last: its flags run ahead of the merges this workspace no longer runs.
                        packed = nt.dcp_topk_pack(x, x_ends, local_topk=n, max_local_len=width)
                        row["exchange_graph_us"]["push"] = graph_timed(
                            lambda: nt.dcp_topk_exchange(packed, workspace=ws), device, iters)
                    if name == "fcollect":  # the same bytes, fcollect alone
                        src = ws.staging.local[:rows]
                        dst = ws.collect_dst.local[: world * src.numel()]
                        row["exchange_graph_us"]["fcollect"] = graph_timed(
                            lambda: group.fcollect(dst, src), device, iters)
                ws.destroy()
            if device.type == "cuda":
                row["generic_graph_us"] = graph_timed(generic, device, iters)
                packed = torch.empty(rows, packed_row_words(n, num_planes(width)), dtype=torch.int32,
                                     device=device)
                every = torch.empty((world * rows, packed.shape[1]), dtype=torch.int32, device=device)
                row["exchange_graph_us"]["nccl_all_gather"] = graph_timed(
                    lambda: dist.all_gather_into_tensor(every, packed), device, iters)
            results["merge"].append(row)
            if lead:
                with open(args.out, "w") as f:  # after every shape: a run cut short keeps what it measured
                    json.dump(results, f, indent=1)
                stage, graph, xch = row.get("stages_us", {}), row["merge_graph_us"], row["exchange_graph_us"]
                fmt = lambda table, key, w: f"{table[key]:>{w}.1f}" if key in table else f"{'-':>{w}}"  # noqa: E731
                best = graph.get("push", row["merge_eager_us"])
                base = row.get("generic_graph_us", row["generic_eager_us"])
                print(f"{rows:>5}{width:>8}{row['merge_eager_us']:>8.1f}{fmt(graph, 'push', 8)}"
                      f"{fmt(graph, 'all_gather', 7)}{fmt(graph, 'fcollect', 7)}{row['generic_eager_us']:>9.1f}"
                      f"{fmt(row, 'generic_graph_us', 8)}{base / best:>8.1f}x"
                      + "".join(fmt(stage, s, w) for s, w in (("pack", 7), ("exchange", 7), ("select", 8),
                                                              ("rescue", 8)))
                      + fmt(xch, "push", 8) + fmt(xch, "nccl_all_gather", 8) + fmt(xch, "fcollect", 8)
                      + fmt(graph, "push_library", 8)
                      + f"  {all(row['exact'].values())}", flush=True)
    if library is not None:
        library.destroy()
    group.destroy()
    if not args.cpu:
        nt.finalize_nvshmem()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
