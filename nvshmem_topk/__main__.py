"""Command line: ``python -m nvshmem_topk COMMAND`` (also ``nvshmem-topk``).

demo   synthetic indexer scores merged and checked against an unsharded
       top-K: W virtual ranks in this process; under torchrun one rank per
       process (NVSHMEM on GPUs, shared memory on CPUs); under MPICH's
       mpiexec or nvshmrun one GPU rank per process, NVSHMEM started by the
       launcher (--bootstrap pmi, or mpi over mpi4py)
info   devices, GPU peer access, versions, and what the merge would use
check  every adversarial family at several world sizes against an
       unsharded top-K, on this machine
bench  the simulated merge vs the generic merge over T and S_local, as a
       table, JSON/CSV and (with matplotlib) a PNG plot; on a GPU, for the
       first score family, also each stage alone, the launches a rank and
       the merge with PDL off
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch

from . import format as fmt
from .protocol import resolve_impl
from .api import simulate_dcp_topk_merge
from .baseline import generic_merge_compute
from .testing import SCORE_FAMILIES, families, family_scores, indexer_like_logits, shard
from .timing import GRAPH_CALLS, SimulatedMerge, graph_us, median_us, merge_breakdown


def unsharded_topk(logits: torch.Tensor, row_ends: torch.Tensor, topk: int, interleave: int) -> list[set]:
    """Per row, the set of global ids of an unsharded top-K: the global row
    rebuilt in global-id order, then a stable descending sort of ord16
    (ties go to the lower global id)."""
    world_size, rows, width = logits.shape
    local = torch.arange(width)
    result = []
    for t in range(rows):
        gids, scores = [], []
        for r in range(world_size):
            bits = fmt.score16_bits(logits[r, t].cpu())
            keep = (local < row_ends[r, t].cpu()) & ~fmt.is_nan_bits(bits)
            gids.append(fmt.global_id(local[keep], r, world_size, interleave))
            scores.append(fmt.ord16(bits[keep]))
        gid, score = torch.cat(gids), torch.cat(scores)
        by_gid = gid.argsort()
        order = score[by_gid].sort(descending=True, stable=True).indices
        result.append(set(gid[by_gid][order][:topk].tolist()))
    return result


def _exact(ids: torch.Tensor, want: list[set]) -> bool:
    ids = ids.cpu()
    return all(set(ids[r, t].tolist()) - {-1} == want[t] and torch.equal(ids[r], ids[0])
               for r in range(ids.shape[0]) for t in range(ids.shape[1]))


def _device(name: str | None) -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


# ---------------------------------------------------------------- demo


def _demo_data(world_size: int, rows: int, local_len: int):
    logits = indexer_like_logits((world_size, rows, local_len), torch.Generator().manual_seed(world_size))
    row_ends = torch.full((world_size, rows), local_len, dtype=torch.int32)
    row_ends[:, 0] = local_len // 3  # a shorter request
    return logits, row_ends


def _distributed_group(bootstrap: str):
    """This rank's group: NVSHMEM on GPUs (one per process), started over
    torch.distributed (torchrun) or by the launcher (``bootstrap`` "pmi" or
    "mpi"); CPU shared memory under torchrun without GPUs."""
    import torch.distributed as dist

    from .groups.nvshmem import NvshmemGroup, init_nvshmem, launcher_local_rank
    from .groups.shm import ShmGroup

    if bootstrap == "torch":
        if not torch.cuda.is_available():
            return ShmGroup.from_env()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        torch.cuda.set_device(launcher_local_rank())
        init_nvshmem(bootstrap)
    return NvshmemGroup()


def distributed_demo(args: argparse.Namespace, bootstrap: str) -> int:
    """One rank of the demo under torchrun or a PMI / MPI launcher: the real
    protocol across processes (NVSHMEM on GPUs, shared memory on CPUs), every
    rank checking the unsharded top-K (all ranks' ids under torchrun, its
    own under a launcher, where there is no torch.distributed)."""
    import torch.distributed as dist

    from .api import dcp_topk_merge, init_dcp_topk_merge
    from .groups.nvshmem import finalize_nvshmem

    group = _distributed_group(bootstrap)
    world_size, rank, device = group.world_size, group.rank, group.device
    logits, row_ends = _demo_data(world_size, args.rows, args.local_len)
    mine, mine_ends = logits[rank].to(device), row_ends[rank].to(device)
    want = unsharded_topk(logits, row_ends, args.topk, 1)
    if rank == 0:
        print(f"{'W':>3} {'T':>4} {'S_local':>8} {'K':>5} {'N':>5} {'impl':>9} {'exchange':>10} {'ms':>8}  exact")
    failures = 0
    for exchange in group.exchanges:
        ws = init_dcp_topk_merge(group, max_rows=args.rows, topk=args.topk, max_local_len=args.local_len,
                                 impl=args.impl, exchange=exchange)
        ids = torch.empty(args.rows, args.topk, dtype=torch.int32, device=device)
        dcp_topk_merge(mine, mine_ends, ids, workspace=ws)  # warm-up (compiles the kernels)
        group.barrier()
        start = time.perf_counter()
        dcp_topk_merge(mine, mine_ends, ids, workspace=ws)
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        exact = _exact(group.all_gather(ids, ws.timeout_s) if dist.is_initialized() else ids[None], want)
        failures += not exact
        if rank == 0:
            print(f"{world_size:>3} {args.rows:>4} {args.local_len:>8} {args.topk:>5} {ws.local_topk:>5} "
                  f"{ws.impl:>9} {exchange:>10} {ms:>8.1f}  {'yes' if exact else 'NO'}")
        ws.destroy()
    group.barrier()  # no rank closes its connections while a peer is still in a collective
    group.destroy()
    finalize_nvshmem()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 1 if failures else 0


def demo(args: argparse.Namespace) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return distributed_demo(args, "torch")
    if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        return distributed_demo(args, args.bootstrap)
    print(f"{'W':>3} {'T':>4} {'S_local':>8} {'K':>5} {'N':>5} {'impl':>9} {'ms':>8}  exact")
    failures = 0
    device = _device(None)
    impl = resolve_impl(args.impl, device)
    for world_size in args.world_sizes:
        logits, row_ends = _demo_data(world_size, args.rows, args.local_len)
        logits, row_ends = logits.to(device), row_ends.to(device)
        start = time.perf_counter()
        ids = simulate_dcp_topk_merge(logits, row_ends, topk=args.topk, impl=impl)
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        exact = _exact(ids, unsharded_topk(logits, row_ends, args.topk, 1))
        failures += not exact
        n = fmt.default_local_topk(args.topk, world_size)
        print(f"{world_size:>3} {args.rows:>4} {args.local_len:>8} {args.topk:>5} {n:>5} {impl:>9} "
              f"{ms:>8.1f}  {'yes' if exact else 'NO'}")
    return 1 if failures else 0


# ---------------------------------------------------------------- info


def info(args: argparse.Namespace) -> int:
    import platform

    def version(module: str) -> str:
        if importlib.util.find_spec(module) is None:
            return "not installed"
        return getattr(__import__(module), "__version__", "installed")

    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__}")
    print(f"triton        {version('triton')}")
    print(f"nvshmem4py    {'installed' if importlib.util.find_spec('nvshmem') else 'not installed'}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"GPUs          {gpus}")
    for i in range(gpus):
        peers = [j for j in range(gpus) if j != i and torch.cuda.can_device_access_peer(i, j)]
        print(f"  cuda:{i}      {torch.cuda.get_device_name(i)}; peer access to {peers or 'none'}")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    print(f"impl          {'triton' if gpus else 'reference'} by default"
          f"{'' if gpus else ('; triton available (TRITON_INTERPRET=1)' if interpret else '; triton needs TRITON_INTERPRET=1 here')}")
    print("groups        SimulatedGroup (any device); ShmGroup (CPU processes under torchrun); "
          "NvshmemGroup (GPUs under torchrun, mpiexec or nvshmrun; peers by NVLink address, "
          "else by NVSHMEM's device library)")
    print("exchange      push (default; stores through the peer table), all_gather (the group's collective), "
          "fcollect (NVSHMEM; NvshmemGroup only)")
    return 0


# --------------------------------------------------------------- check


def check(args: argparse.Namespace) -> int:
    device = _device(args.device)
    args.impl = resolve_impl(args.impl, device)
    failures = 0
    for world_size in args.world_sizes:
        for name, logits, row_ends, k, n, inter in families(world_size, seed=args.seed):
            ids = simulate_dcp_topk_merge(logits.to(device), row_ends.to(device), topk=k, local_topk=n,
                                          impl=args.impl, interleave=inter)
            ok = _exact(ids, unsharded_topk(logits, row_ends, k, inter))
            failures += not ok
            if not ok or args.verbose:
                print(f"W={world_size:<3} {name:<26} {'exact' if ok else 'NOT EXACT'}", flush=True)
    total = len(args.world_sizes) * sum(1 for _ in families(1))
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


# --------------------------------------------------------------- bench


def bench(args: argparse.Namespace) -> int:
    device = _device(args.device)
    args.impl = resolve_impl(args.impl, device)
    grid = [(dist, rows, width) for dist in args.dist for rows in args.rows for width in args.widths]
    results = []
    graphs = device.type == "cuda"
    timing = f"CUDA-graph replays of {GRAPH_CALLS} calls over distinct inputs" if graphs else "eager calls"
    print(f"# simulated merge, W={args.world_size}, K={args.topk}, interleave={args.interleave}, impl={args.impl}, "
          f"{device}; medians of {args.reps} {timing} (ms)", file=sys.stderr)
    for i, (dist, rows, width) in enumerate(grid, 1):
        gen = torch.Generator().manual_seed(i)
        copies = [shard(family_scores(dist, rows, args.world_size * width, gen), args.world_size,
                        args.interleave).to(device) for _ in range(GRAPH_CALLS if graphs else 1)]
        logits = copies[0]
        row_ends = torch.full((args.world_size, rows), width, dtype=torch.int32, device=device)
        record = dict(dist=dist, W=args.world_size, T=rows, S=width, K=args.topk, I=args.interleave,
                      impl=args.impl, device=str(device), cuda_graph=graphs)
        if graphs and args.impl == "triton":  # eager GPU timings would measure Python launches
            # The first family's merges also time their stages alone, the merge with PDL off, and count launches.
            stats = merge_breakdown(copies, row_ends, args.topk, args.reps, interleave=args.interleave,
                                    stages=dist == args.dist[0])
            record.update(stats)
            record["merge_ms"] = stats["merge_us"] / 1e3
            record["generic_ms"] = graph_us(lambda: generic_merge_compute(logits, args.topk), args.reps) / 1e3
        elif graphs:
            run = SimulatedMerge(logits, row_ends, args.topk, args.impl, interleave=args.interleave)
            record["merge_ms"] = graph_us(run, args.reps) / 1e3
            run.destroy()
            record["generic_ms"] = graph_us(lambda: generic_merge_compute(logits, args.topk), args.reps) / 1e3
        else:
            record["merge_ms"] = median_us(lambda: simulate_dcp_topk_merge(
                logits, row_ends, topk=args.topk, impl=args.impl, interleave=args.interleave), device, args.reps) / 1e3
            record["generic_ms"] = median_us(lambda: generic_merge_compute(logits, args.topk), device, args.reps) / 1e3
        results.append(record)
        done = 20 * i // len(grid)
        print(f"[{'#' * done}{'.' * (20 - done)}] {i}/{len(grid)} {dist} T={rows} S={width}: merge "
              f"{record['merge_ms']:.3f} ms, generic {record['generic_ms']:.3f} ms", file=sys.stderr, flush=True)
    first = {(r["T"], r["S"]): r["merge_ms"] for r in reversed(results)}  # the first family's time per shape
    print(f"{'dist':<20}{'T':>5}{'S_local':>9}{'merge ms':>11}{'vs first':>10}{'generic ms':>12}")
    for r in results:
        ratio = r["merge_ms"] / first[r["T"], r["S"]]
        print(f"{r['dist']:<20}{r['T']:>5}{r['S']:>9}{r['merge_ms']:>11.3f}{ratio:>9.2f}x{r['generic_ms']:>12.3f}")
    staged = [r for r in results if "pack_us" in r]
    if staged:
        print(f"\n{args.dist[0]}: µs a rank (the merge / W) and rank 0's stages alone")
        print(f"{'T':>5}{'S_local':>9}{'merge':>9}{'PDL off':>9}{'launches':>10}{'pack':>8}{'exchange':>10}"
              f"{'select':>8}{'rescue':>8}")
        for r in staged:
            w = r["W"]
            print(f"{r['T']:>5}{r['S']:>9}{r['merge_us'] / w:>9.1f}{r['merge_no_pdl_us'] / w:>9.1f}"
                  f"{r['launches_per_rank']:>10.1f}{r['pack_us']:>8.1f}{r['exchange_us']:>10.1f}{r['select_us']:>8.1f}"
                  f"{r['rescue_us']:>8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("dist,W,T,S,K,I,impl,device,merge_ms,generic_ms\n")
            f.writelines(f"{r['dist']},{r['W']},{r['T']},{r['S']},{r['K']},{r['I']},{r['impl']},{r['device']},"
                         f"{r['merge_ms']:.4f},{r['generic_ms']:.4f}\n" for r in results)
    if args.plot:
        _plot([r for r in results if r["dist"] == args.dist[0]], args.plot,
              f"simulated merge, W={args.world_size}, K={args.topk}, {args.dist[0]} scores, {args.impl} on {device}")
    return 0


def _plot(results: list[dict], path: str, title: str) -> None:
    """Latency vs T and vs S_local, the merge beside the generic merge
    (records with T, S, merge_ms, generic_ms)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("--plot needs matplotlib (pip install matplotlib)")
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (x_key, line_key, label) in zip(axes, (("T", "S", "T (rows)"), ("S", "T", "S_local (tokens per rank)"))):
        for i, line in enumerate(sorted({r[line_key] for r in results})):
            pts = sorted((r[x_key], r["merge_ms"], r["generic_ms"]) for r in results if r[line_key] == line)
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1] for p in pts], "o-", color=f"C{i}", label=f"nvshmem_topk, {line_key}={line}")
            ax.plot(xs, [p[2] for p in pts], "x--", color=f"C{i}", label=f"generic merge, {line_key}={line}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel(label)
        ax.set_ylabel("ms (median)")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _int_in(low: int, high: int | None = None, multiple: int = 1):
    """An argparse type: an int in [low, high], a multiple of ``multiple``;
    anything else is a usage error that names the range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high) or value % multiple:
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            also = f", a multiple of {multiple}" if multiple > 1 else ""
            raise argparse.ArgumentTypeError(f"expected an integer {bound}{also}, got {value}")
        return value
    return parse


def _needs_triton(args: argparse.Namespace) -> None:
    """--impl triton without Triton installed: say how to install it."""
    if getattr(args, "impl", None) == "triton" and importlib.util.find_spec("triton") is None:
        raise SystemExit("--impl triton needs Triton: pip install \"nvshmem-topk[triton]\" (on a CPU, also set "
                         "TRITON_INTERPRET=1)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvshmem-topk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="merge synthetic indexer scores and check them")
    run.add_argument("--world-sizes", type=_int_in(1, fmt.MAX_WORLD_SIZE), nargs="+", default=[1, 2, 4, 8],
                     help="virtual ranks to merge over without a launcher (default 1 2 4 8)")
    run.add_argument("--rows", type=_int_in(1), default=4, help="rows (decode tokens) a merge")
    run.add_argument("--local-len", type=_int_in(1), default=16384, help="tokens per rank in a row")
    run.add_argument("--topk", type=_int_in(fmt.MIN_TOPK, fmt.MAX_TOPK), default=2048, help="K (in [1, 4096])")
    run.add_argument("--impl", default=None, choices=["reference", "triton"],
                     help="default: triton on GPUs, reference on CPUs")
    run.add_argument("--bootstrap", default="pmi", choices=["pmi", "mpi"],
                     help="how NVSHMEM starts under mpiexec / nvshmrun: its own PMI bootstrap, or over mpi4py")
    run.set_defaults(fn=demo)
    sub.add_parser("info", help="devices, versions, what the merge would use").set_defaults(fn=info)
    chk = sub.add_parser("check", help="the adversarial families against an unsharded top-K")
    chk.add_argument("--world-sizes", type=_int_in(1, fmt.MAX_WORLD_SIZE), nargs="+", default=[1, 2, 3, 8, 16],
                     help="world sizes to run every family at")
    chk.add_argument("--impl", default=None, choices=["reference", "triton"],
                     help="default: triton on GPUs, reference on CPUs")
    chk.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is a GPU)")
    chk.add_argument("--seed", type=int, default=0, help="seed of the families' data")
    chk.add_argument("--verbose", action="store_true", help="a line per family")
    chk.set_defaults(fn=check)
    bch = sub.add_parser("bench", help="simulated merge vs the generic merge")
    bch.add_argument("--world-size", type=_int_in(1, fmt.MAX_WORLD_SIZE), default=8, help="virtual ranks (default 8)")
    bch.add_argument("--rows", type=_int_in(1), nargs="+", default=[1, 8, 64], help="T values")
    bch.add_argument("--widths", type=_int_in(1), nargs="+", default=[4096, 16384], help="S_local values")
    bch.add_argument("--topk", type=_int_in(fmt.MIN_TOPK, fmt.MAX_TOPK), default=2048, help="K (in [1, 4096])")
    bch.add_argument("--impl", default=None, choices=["reference", "triton"],
                     help="default: triton on GPUs, reference on CPUs")
    bch.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is a GPU)")
    bch.add_argument("--reps", type=_int_in(1), default=5, help="timed repetitions (medians)")
    bch.add_argument("--json", default=None, help="write the results as JSON here")
    bch.add_argument("--csv", default=None, help="write the results as CSV here")
    bch.add_argument("--plot", default=None, help="PNG path (needs matplotlib)")
    bch.add_argument("--dist", nargs="+", default=["normal"], choices=SCORE_FAMILIES,
                     help="score families (global rows sharded by --interleave); the first is the one the others "
                          "are compared with, and the one plotted")
    bch.add_argument("--interleave", type=_int_in(1), default=1, help="tokens per rank in a run (default 1)")
    bch.set_defaults(fn=bench)
    args = parser.parse_args(argv)
    _needs_triton(args)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
