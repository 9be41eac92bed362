"""Single-GPU benchmark: pack vs torch.topk(k=N), select, and the whole
simulated merge vs the generic merge, all in one process (CUDA, medians of
triton.testing.do_bench, which empties L2 before every run). Each is timed
as a CUDA-graph replay, as serving engines run it: a graph of CALLS calls,
each on its own copy of the inputs, per call, so that the host's launch of
the graph is spread over the calls and every call reads its logits from
HBM; the pack also eagerly, one call at a time (its Python launch cost
included). Prints a table and writes JSON.

    python scripts/bench_kernels.py --out results.json [--rows 64 --widths 131072]

Bytes (for reading the pack numbers): one pass over bf16 logits reads
2*T*S bytes; the pack makes one such pass (the filter), plus the estimate's
256 to 2048 groups of 8 tokens per row (a 32-byte sector each) and the
candidates (about 2N to 4N per row).
Per-kernel times come from a graph launched without PDL (each kernel's
own time); the timed graphs use it, as the library does by default.

The generic merge's compute is timed twice: its local top-Ks as one call
over all W ranks' rows ("generic"), and a call per rank ("by rank"), as W
GPUs run them and as the simulated group runs this library's pack."""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton.testing

import nvshmem_topk as nt
from nvshmem_topk import reference
from nvshmem_topk.baseline import generic_merge_compute
from nvshmem_topk.format import default_local_topk, packed_row_words
from nvshmem_topk.timing import SimulatedMerge, graphed, kernel_times, without_pdl

CALLS = 10


def bench(fn, calls: int = 1) -> float:
    """Median microseconds of one of the ``calls`` calls that ``fn`` makes."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3 / calls


def graphed_calls(fn, inputs) -> torch.cuda.CUDAGraph:
    """One graph of ``fn(x)`` for each x of ``inputs`` (``graphed`` calls
    once more before the capture, hence the cycle)."""
    calls = itertools.cycle(inputs)
    return graphed(lambda: fn(next(calls)), len(inputs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench_kernels.json")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--widths", type=int, nargs="+", default=[16384, 65536, 131072])
    args = parser.parse_args()

    def save() -> None:  # after every measurement: a run cut short keeps what it measured
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)

    dev = torch.device("cuda")
    k = args.topk
    results = {"gpu": torch.cuda.get_device_name(), "topk": k, "pack": [], "select": [], "merge": []}
    gen = torch.Generator(device=dev).manual_seed(0)

    n = 384
    print(f"# {results['gpu']}  K={k}  medians of do_bench (us)")
    print(f"{'pack N=384':<14}{'T':>5}{'S':>8}{'graph':>9}{'eager':>9}{'topk(N)':>9}{'speedup':>9}")
    for rows in args.rows:
        for width in args.widths:
            copies = [torch.randn(rows, width, device=dev, generator=gen).bfloat16() for _ in range(CALLS)]
            ends = torch.full((rows,), width, dtype=torch.int32, device=dev)
            outs = torch.empty(CALLS, rows, packed_row_words(n, 1), dtype=torch.int32, device=dev)
            pack = lambda i: nt.dcp_topk_pack(copies[i], ends, local_topk=n, max_local_len=131072,
                                              out=outs[i], impl="triton")
            t_eager = bench(lambda: pack(0))
            pack_graph = graphed_calls(pack, range(CALLS))
            t_pack = bench(pack_graph.replay, CALLS)
            t_topk = bench(graphed_calls(lambda i: copies[i].topk(n, dim=1), range(CALLS)).replay, CALLS)
            exact = all(torch.equal(outs[i], reference.pack(copies[i], ends, n, 131072)) for i in range(CALLS))
            with without_pdl():  # each kernel's own time
                own = kernel_times(graphed_calls(pack, range(CALLS)).replay)
            kernels = {name: us / CALLS for name, us in own.items()}
            results["pack"].append(dict(T=rows, S=width, N=n, pack_graph_us=t_pack, pack_eager_us=t_eager,
                                        torch_topk_graph_us=t_topk, exact=exact, kernels_us=kernels))
            save()
            print(f"{'':<14}{rows:>5}{width:>8}{t_pack:>9.1f}{t_eager:>9.1f}{t_topk:>9.1f}{t_topk / t_pack:>8.1f}x"
                  f"  exact={exact}  " + " ".join(f"{name.split('_')[0]} {us:.1f}" for name, us in kernels.items()))

    print(f"{'merge W=8':<14}{'T':>5}{'S':>8}{'eager':>9}{'graph':>9}{'generic':>9}{'vs graph':>9}"
          f"{'by rank':>9}{'vs graph':>9}{'select':>9}")
    world = 8
    n = default_local_topk(k, world)
    for rows in args.rows:
        for width in args.widths:
            logits = torch.randn(world, rows, width, device=dev, generator=gen).bfloat16()
            ends = torch.full((world, rows), width, dtype=torch.int32, device=dev)
            run = SimulatedMerge(logits, ends, k, "triton")
            t_merge = bench(run)
            t_graph = bench(graphed(run).replay)
            t_generic = bench(graphed(lambda: generic_merge_compute(logits, k)).replay)
            t_by_rank = bench(graphed(lambda: generic_merge_compute(logits, k, rank_by_rank=True)).replay)
            expected = nt.simulate_dcp_topk_merge(logits, ends, topk=k, impl="reference")
            run()
            exact = bool(torch.equal(run.ids, expected))
            with without_pdl():  # each kernel's own time, per rank
                kernels = {name: us / world for name, us in kernel_times(graphed(run).replay).items()}
            t_select = bench(graphed(run.select_alone(), CALLS).replay, CALLS)
            results["merge"].append(dict(W=world, T=rows, S=width, N=n, merge_eager_us=t_merge,
                                         merge_graph_us=t_graph, generic_us=t_generic,
                                         generic_rank_by_rank_us=t_by_rank, select_us=t_select, exact=exact,
                                         kernels_per_rank_us=kernels))
            save()
            print(f"{'':<14}{rows:>5}{width:>8}{t_merge:>9.1f}{t_graph:>9.1f}{t_generic:>9.1f}"
                  f"{t_generic / t_graph:>8.1f}x{t_by_rank:>9.1f}{t_by_rank / t_graph:>8.1f}x{t_select:>9.1f}"
                  f"  exact={exact}  per rank: " + " ".join(f"{name.split('_')[0]} {us:.1f}"
                                                          for name, us in kernels.items()))
            run.destroy()


if __name__ == "__main__":
    main()
