"""One merge at the 2-GPU target shape, or one pack (``--pack N``), for
Nsight Compute: everything compiles and runs once first, then only the
calls between cudaProfilerStart and cudaProfilerStop are profiled.

    ncu --clock-control none --profile-from-start off --set full -o kernels -f \
        python3 scripts/profile_kernels.py [--world-size 2 --rows 64 --width 65536] [--pack 384]

``--pack`` takes ``--family`` (one of ``testing.SCORE_FAMILIES``) and
``--fp32`` (fp32 scores, ranked in exact fp32 order). The merge runs on a
simulated group of W ranks on this GPU: each rank's pack (three kernels,
the finish pushing), select and rescue, stage by stage, so every kernel is
profiled W times and no select waits for a peer."""

from __future__ import annotations

import argparse

import torch

import nvshmem_topk as nt
from nvshmem_topk.format import default_local_topk
from nvshmem_topk.testing import SCORE_FAMILIES, family_scores
from nvshmem_topk.timing import SimulatedMerge


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=65536)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--pack", type=int, metavar="N",
                        help="profile one pack of N tokens a row over [rows, width] bf16 scores instead")
    parser.add_argument("--family", default="normal", choices=SCORE_FAMILIES, help="the pack's scores")
    parser.add_argument("--fp32", action="store_true", help="the pack's scores fp32, ranked in exact fp32 order")
    args = parser.parse_args()
    dev = torch.device("cuda")
    if args.pack:
        profile_pack(args.rows, args.width, args.pack, dev, args.family, torch.float32 if args.fp32 else None)
        return
    world, rows, width, k = args.world_size, args.rows, args.width, args.topk
    n = default_local_topk(k, world)
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(world, rows, width, device=dev, generator=gen).bfloat16()
    ends = torch.full((world, rows), width, dtype=torch.int32, device=dev)
    merge = SimulatedMerge(logits, ends, k, "triton")
    merge()  # compiles every kernel
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    merge()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    exact = torch.equal(merge.ids, nt.simulate_dcp_topk_merge(logits, ends, topk=k, impl="reference"))
    print(f"W={world} T={rows} S={width} K={k} N={n}: one merge profiled, exact={exact}")
    merge.destroy()


def profile_pack(rows: int, width: int, n: int, dev: torch.device, family: str, score_dtype) -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = family_scores(family, rows, width, gen, dev, score_dtype or torch.bfloat16)
    ends = torch.full((rows,), width, dtype=torch.int32, device=dev)

    def pack(impl: str) -> torch.Tensor:
        return nt.dcp_topk_pack(logits, ends, local_topk=n, max_local_len=width, impl=impl, score_dtype=score_dtype)

    pack("triton")  # compiles every kernel
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    out = pack("triton")
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    exact = torch.equal(out, pack("reference"))
    print(f"T={rows} S={width} N={n} family={family} score_dtype={score_dtype}: one pack profiled, exact={exact}")


if __name__ == "__main__":
    main()
