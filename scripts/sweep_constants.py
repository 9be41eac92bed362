"""Sweep of the kernels' launch constants on one GPU, each variant checked
against the reference (pack) and timed from a CUDA graph of 10 calls with L2
warm (so comparable with each other, not with bench_kernels.py's flushed
single-call graphs):

    python scripts/sweep_constants.py [--out sweep.json]

pack: FINISH_WARPS / FILTER_BLOCK / FILTER_WARPS / ESTIMATE_WARPS at N = 384 and 1536;
select: SELECT_WARPS at W = 8 and 2 (flags set ahead, so it never waits)."""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from nvshmem_topk import reference
from nvshmem_topk.format import default_local_topk, packed_row_words
from nvshmem_topk.kernels import pack as P
from nvshmem_topk.kernels import select as S
from nvshmem_topk.timing import SimulatedMerge, graphed

CALLS = 10
PACK_VARIANTS = [(8, 2048, 4, 8), (16, 2048, 4, 8), (4, 2048, 4, 8), (8, 4096, 4, 8), (8, 4096, 8, 8),
                 (8, 2048, 8, 8), (8, 1024, 2, 8), (8, 2048, 4, 4)]


def per_call_us(fn) -> float:
    replay = graphed(fn, CALLS).replay
    return triton.testing.do_bench(replay, warmup=25, rep=200, return_mode="median") * 1e3 / CALLS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sweep.json")
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    results = {"gpu": torch.cuda.get_device_name(), "pack": [], "select": []}
    defaults = P.FINISH_WARPS, P.FILTER_BLOCK, P.FILTER_WARPS, P.ESTIMATE_WARPS
    for n, rows, width in [(384, 64, 131072), (384, 8, 131072), (384, 64, 16384), (1536, 64, 65536)]:
        logits = torch.randn(rows, width, device=dev, generator=gen).bfloat16()
        ends = torch.full((rows,), width, dtype=torch.int32, device=dev)
        out = torch.empty(rows, packed_row_words(n, 1), dtype=torch.int32, device=dev)
        want = reference.pack(logits, ends, n, 131072)
        run = lambda: P.pack(out, logits, ends, local_topk=n, max_local_len=131072)  # noqa: E731
        line = f"pack N={n} T={rows} S={width}"
        for variant in PACK_VARIANTS:
            P.FINISH_WARPS, P.FILTER_BLOCK, P.FILTER_WARPS, P.ESTIMATE_WARPS = variant
            out.zero_()
            run()
            exact = bool(torch.equal(out, want))
            us = per_call_us(run)
            results["pack"].append(dict(N=n, T=rows, S=width, finish_warps=variant[0], filter_block=variant[1],
                                        filter_warps=variant[2], estimate_warps=variant[3], us=us, exact=exact))
            line += f" | fw{variant[0]}/fb{variant[1]}/w{variant[2]}/ew{variant[3]}={us:.1f}{'' if exact else ' WRONG'}"
        P.FINISH_WARPS, P.FILTER_BLOCK, P.FILTER_WARPS, P.ESTIMATE_WARPS = defaults
        print(line, flush=True)
    default_warps = S.SELECT_WARPS
    for world, rows, width in [(8, 64, 16384), (2, 64, 65536), (8, 1, 16384)]:
        k = 2048
        n = default_local_topk(k, world)
        logits = torch.randn(world, rows, width, device=dev, generator=gen).bfloat16()
        ends = torch.full((world, rows), width, dtype=torch.int32, device=dev)
        merge = SimulatedMerge(logits, ends, k, "triton")
        select = merge.select_alone()
        line = f"select W={world} T={rows} N={n}"
        for warps in (4, 8, 16):
            S.SELECT_WARPS = warps
            us = per_call_us(select)
            results["select"].append(dict(W=world, T=rows, N=n, select_warps=warps, us=us))
            line += f" | w{warps}={us:.1f}"
        S.SELECT_WARPS = default_warps
        print(line, flush=True)
        merge.destroy()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
