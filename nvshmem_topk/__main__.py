"""Command line: ``python -m nvshmem_topk demo`` (also ``nvshmem-topk demo``).

The demo merges synthetic indexer-like scores and checks every row against
an unsharded top-K of the same scores. Under torchrun each process is one
rank of a CPU shared-memory group running the real protocol; without it, W
virtual ranks of a simulated group run in this process."""

from __future__ import annotations

import argparse
import os
import time

import torch

from . import format as fmt
from .api import simulate_dcp_topk_merge
from .format import default_local_topk


def indexer_like_logits(world_size: int, rows: int, local_len: int, seed: int) -> torch.Tensor:
    """[W, T, S] bf16: a heavy-tailed bulk, a few strong tokens, and a recent
    window that scores high (as indexer scores near the decode position do)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(world_size, rows, local_len, generator=gen) * 0.6
    x += 3.0 * (torch.rand(x.shape, generator=gen) < 0.003)
    x[:, :, -64:] += 2.0
    return x.bfloat16()


def unsharded_topk(logits: torch.Tensor, row_ends: torch.Tensor, topk: int, interleave: int):
    """The global row rebuilt in global-id order; a stable descending sort of
    its ord16 scores breaks ties toward the lower global id."""
    world_size, rows, width = logits.shape
    local = torch.arange(width)
    result = []
    for t in range(rows):
        gids, scores = [], []
        for r in range(world_size):
            bits = fmt.bf16_bits(logits[r, t])
            keep = (local < row_ends[r, t]) & ~fmt.is_nan_bits(bits)
            gids.append(fmt.global_id(local[keep], r, world_size, interleave))
            scores.append(fmt.ord16(bits[keep]))
        gid, score = torch.cat(gids), torch.cat(scores)
        by_gid = gid.argsort()
        order = score[by_gid].sort(descending=True, stable=True).indices
        result.append(set(gid[by_gid][order][:topk].tolist()))
    return result


def distributed_demo(args: argparse.Namespace) -> int:
    """One rank of the demo under torchrun: the real protocol across
    processes (CPU shared memory), every rank checking the unsharded top-K."""
    import torch.distributed as dist

    from .api import dcp_topk_merge, init_dcp_topk_merge
    from .groups.shm import ShmGroup

    if torch.cuda.is_available():
        raise SystemExit("the NVSHMEM group for GPUs is not implemented yet; run the demo on CPUs "
                         "(CUDA_VISIBLE_DEVICES=) or without torchrun (simulated group)")
    group = ShmGroup.from_env()
    world_size, rank = group.world_size, group.rank
    logits = indexer_like_logits(world_size, args.rows, args.local_len, seed=world_size)
    row_ends = torch.full((world_size, args.rows), args.local_len, dtype=torch.int32)
    row_ends[:, 0] = args.local_len // 3
    want = unsharded_topk(logits, row_ends, args.topk, 1)
    if rank == 0:
        print(f"{'W':>3} {'T':>4} {'S_local':>8} {'K':>5} {'N':>5} {'impl':>9} {'exchange':>10} {'ms':>8}  exact")
    failures = 0
    for exchange in ("push", "all_gather"):
        ws = init_dcp_topk_merge(group, max_rows=args.rows, topk=args.topk, max_local_len=args.local_len,
                                 impl=args.impl, exchange=exchange)
        ids = torch.empty(args.rows, args.topk, dtype=torch.int32)
        dcp_topk_merge(logits[rank], row_ends[rank], ids, workspace=ws)  # warm-up
        group.barrier()
        start = time.perf_counter()
        dcp_topk_merge(logits[rank], row_ends[rank], ids, workspace=ws)
        ms = (time.perf_counter() - start) * 1e3
        everyone = group.all_gather(ids, ws.timeout_s)
        exact = all(set(everyone[r, t].tolist()) - {-1} == want[t]
                    for r in range(world_size) for t in range(args.rows))
        failures += not exact
        if rank == 0:
            print(f"{world_size:>3} {args.rows:>4} {args.local_len:>8} {args.topk:>5} {ws.local_topk:>5} "
                  f"{args.impl:>9} {exchange:>10} {ms:>8.1f}  {'yes' if exact else 'NO'}")
        ws.destroy()
    group.destroy()
    dist.destroy_process_group()
    return 1 if failures else 0


def demo(args: argparse.Namespace) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return distributed_demo(args)
    print(f"{'W':>3} {'T':>4} {'S_local':>8} {'K':>5} {'N':>5} {'impl':>9} {'ms':>8}  exact")
    failures = 0
    for world_size in args.world_sizes:
        logits = indexer_like_logits(world_size, args.rows, args.local_len, seed=world_size)
        row_ends = torch.full((world_size, args.rows), args.local_len, dtype=torch.int32)
        row_ends[:, 0] = args.local_len // 3  # a shorter request
        start = time.perf_counter()
        ids = simulate_dcp_topk_merge(logits, row_ends, topk=args.topk, impl=args.impl)
        ms = (time.perf_counter() - start) * 1e3
        want = unsharded_topk(logits, row_ends, args.topk, 1)
        exact = all(
            set(ids[r, t].tolist()) - {-1} == want[t] and torch.equal(ids[r], ids[0])
            for r in range(world_size) for t in range(args.rows)
        )
        failures += not exact
        n = default_local_topk(args.topk, world_size)
        print(f"{world_size:>3} {args.rows:>4} {args.local_len:>8} {args.topk:>5} {n:>5} {args.impl:>9} "
              f"{ms:>8.1f}  {'yes' if exact else 'NO'}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvshmem-topk")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="simulated DCP merge checked against an unsharded top-K")
    run.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    run.add_argument("--rows", type=int, default=4)
    run.add_argument("--local-len", type=int, default=16384)
    run.add_argument("--topk", type=int, default=2048)
    run.add_argument("--impl", default="reference", choices=["reference", "triton"])
    args = parser.parse_args(argv)
    return demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
