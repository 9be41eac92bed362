"""Single-GPU benchmark over the score families (nvshmem_topk.testing):
the pack beside torch.topk(k=N), and the simulated 8-rank merge beside the
generic merge run rank by rank, all in one process on the same inputs. Each
is timed as a CUDA-graph replay, as serving engines run it: a graph of CALLS
calls, each on its own copy of the inputs, L2 flushed before each replay;
per call, the median of REPS replays (nvshmem_topk.timing.median_us). Every
timed output is checked against the reference. Prints, per shape, each family's time, its ratio to i.i.d.
normal and the baseline; writes JSON. Each kernel's own time (torch.profiler,
without PDL) is taken after every timing, so that no timing follows a
profile (one graph has timed 2 µs faster after a profile than before it).

    python scripts/bench_kernels.py --out results.json [--families normal smooth] [--skip-merge] [--fp32]
    python scripts/bench_kernels.py --rows 1 4 16 64 --out decode.json [--families ...] [--skip-pack | --widths ...]

``--rows`` measures decode batch sizes instead: per T, the pack at
[T, 16384] and [T, 131072] and the simulated merge W = 8, S = 16384 over the
families, and on normal scores the merge's stages alone, its kernel
launches per rank, the merge with PDL off, the merge W = 1
(``timing.merge_breakdown``), the generic merge, and two floors of a pack
of one program a row timed the same way (``floor_kernel``).

``--fp32`` measures exact fp32 order (score_dtype=torch.float32) instead,
beside bf16 order of the same scores rounded: the pack at the same shapes
and the merge W = 8, T = 64, S = 16384, with the generic merge on the fp32
scores.

Bytes: one pass over bf16 logits reads 2*T*S bytes; the pack reads them once
(the filter) and, for rows settled exactly (ties), once more from L2.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import nvshmem_topk as nt
from nvshmem_topk.kernels.keys import power_of_2
from nvshmem_topk.kernels.pack import ROW_WARPS
from nvshmem_topk.kernels.sync import after_prior_kernel
from nvshmem_topk import format as fmt
from nvshmem_topk import reference
from nvshmem_topk.baseline import generic_merge_compute
from nvshmem_topk.format import num_planes, packed_row_words
from nvshmem_topk.testing import SCORE_FAMILIES, family_scores, shard
from nvshmem_topk.timing import (SimulatedMerge, graphed, graphed_over, kernel_times, median_us, merge_breakdown,
                                 without_pdl)

CALLS = 10
REPS = 200
PROFILES = []  # (result, its key, fn): each kernel's own time, taken after every timing
PACK_SHAPES = ((64, 131072), (8, 131072), (64, 16384), (256, 65536))


def bench(fn, calls: int = 1) -> float:
    """Median microseconds of one of the ``calls`` calls that ``fn`` makes
    (L2 flushed before each run)."""
    return median_us(fn, torch.device("cuda"), REPS, calls=calls, flush_l2=True)


def bench_pack(rows, width, family, gen, n=384, per_kernel=False, copies=None, max_local_len=131072,
               score_dtype=None):
    """The pack of ``copies`` (CALLS [rows, width] inputs; default: the
    family's bf16 scores) beside torch.topk."""
    dev = torch.device("cuda")
    copies = copies or [family_scores(family, rows, width, gen, dev) for _ in range(CALLS)]
    ends = torch.full((rows,), width, dtype=torch.int32, device=dev)
    score_bits = fmt.score_bits_of(score_dtype)
    words = packed_row_words(n, num_planes(max_local_len), score_bits)
    outs = torch.empty(CALLS, rows, words, dtype=torch.int32, device=dev)
    def pack(i, pdl=None):
        nt.dcp_topk_pack(copies[i], ends, local_topk=n, max_local_len=max_local_len, out=outs[i], impl="triton",
                         pdl=pdl, score_dtype=score_dtype)

    t_pack = bench(graphed_over(pack, range(CALLS)).replay, CALLS)
    t_topk = bench(graphed_over(lambda i: copies[i].topk(n, dim=1), range(CALLS)).replay, CALLS)
    exact = all(torch.equal(outs[i], reference.pack(copies[i], ends, n, max_local_len, score_bits=score_bits))
                for i in range(CALLS))
    result = dict(T=rows, S=width, N=n, family=family, pack_us=t_pack, torch_topk_us=t_topk, exact=exact,
                  kernels_us={})
    if per_kernel:  # without PDL a kernel's profile does not cover its prior's
        PROFILES.append((result, "kernels_us", lambda: {
            name.split("_kernel")[0]: us / CALLS
            for name, us in kernel_times(graphed_over(lambda i: pack(i, pdl=False), range(CALLS)).replay).items()}))
    return result


def merge_inputs(family, world, rows, width, interleave, gen, boost_rank=None, dtype=torch.bfloat16):
    global_rows = family_scores(family, rows, world * width, gen, torch.device("cuda"), dtype)
    logits = shard(global_rows, world, interleave)
    if boost_rank is not None:
        logits[boost_rank] = (logits[boost_rank].float() + 6).to(dtype)
    return logits


def bench_merge(logits, interleave, k=2048, per_kernel=False, score_dtype=None):
    world, rows, width = logits.shape
    ends = torch.full((world, rows), width, dtype=torch.int32, device=logits.device)
    run = SimulatedMerge(logits, ends, k, "triton", interleave=interleave, score_dtype=score_dtype)
    try:
        t_graph = bench(graphed(run).replay)
        t_by_rank = bench(graphed(lambda: generic_merge_compute(logits, k, rank_by_rank=True)).replay)
        expected = nt.simulate_dcp_topk_merge(logits, ends, topk=k, impl="reference", interleave=interleave,
                                              score_dtype=score_dtype)
        run()
        exact = bool(torch.equal(run.ids, expected))
        saturated = sum(int(fmt.sat_mask(ws.sat[:rows], ws.score_bits).ne(0).sum()) for ws in run.workspaces)
    except BaseException:
        run.destroy()
        raise
    result = dict(W=world, T=rows, S=width, I=interleave, merge_us=t_graph, generic_by_rank_us=t_by_rank,
                  exact=exact, saturated_rows=saturated, kernels_per_rank_us={})
    if per_kernel:
        def profile():
            try:
                with without_pdl(run.workspaces):
                    return {name.split("_kernel")[0]: us / world
                            for name, us in kernel_times(graphed(run).replay).items()}
            finally:
                run.destroy()
        PROFILES.append((result, "kernels_per_rank_us", profile))
    else:
        run.destroy()
    return result


def profile_kernels(save) -> None:
    """Each kernel's own time of every result that asked for it, after
    every timing; printed by result."""
    if PROFILES:
        print("own kernel times (µs; no PDL, torch.profiler), after every timing:")
    for result, key, fn in PROFILES:
        result[key] = fn()
        save()
        name = " ".join(f"{k}={result[k]}" for k in ("T", "S", "W", "I", "family", "score_dtype") if k in result)
        print(f"  {name}: " + " ".join(f"{k} {v:.1f}" for k, v in result[key].items()), flush=True)
    PROFILES.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench_kernels.json")
    parser.add_argument("--families", nargs="+", default=list(SCORE_FAMILIES), choices=SCORE_FAMILIES)
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--skip-pack", action="store_true")
    parser.add_argument("--per-kernel", action="store_true",
                        help="each kernel's own time for every family (default: normal and all_equal for the pack, "
                             "normal for the merge)")
    parser.add_argument("--shapes", nargs="+", default=[f"{t}x{s}" for t, s in PACK_SHAPES],
                        help="pack shapes as TxS (default: the four of the acceptance)")
    parser.add_argument("--interleaves", nargs="+", type=int, default=[1, 64], help="the merge's interleaves")
    parser.add_argument("--skip-rank0-best", action="store_true",
                        help="leave out the merges whose best scores all sit on rank 0")
    parser.add_argument("--fp32", action="store_true", help="exact fp32 order beside bf16 order, instead")
    parser.add_argument("--rows", nargs="+", type=int, help="decode batch sizes T, instead (see the docstring)")
    parser.add_argument("--widths", nargs="+", type=int, default=DECODE_WIDTHS,
                        help="with --rows: the pack's widths (default: 16384 and 131072)")
    args = parser.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "pack": [], "merge": []}
    save = lambda: json.dump(results, open(args.out, "w"), indent=1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    families = ["normal"] + [f for f in args.families if f != "normal"]
    print(f"# {results['gpu']}: microseconds per call (graphs of {CALLS} calls over distinct inputs, medians)")
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes]
    if args.rows:
        results["decode"] = []
        bench_decode(families, args.rows, () if args.skip_pack else args.widths, gen, results, save)
    elif args.fp32:
        bench_fp32(families, () if args.skip_pack else shapes, () if args.skip_merge else args.interleaves, gen,
                   results, save)
    else:
        bench_bf16(families, args, () if args.skip_pack else shapes, gen, results, save)
    profile_kernels(save)


def bench_bf16(families, args, shapes, gen, results, save) -> None:
    """Every family of the pack at ``shapes``, then (unless skipped) the
    simulated merges."""
    for rows, width in shapes:
        print(f"pack [{rows}, {width}] N=384   family  pack  vs-normal  torch.topk  exact")
        normal = None
        for family in families:
            r = bench_pack(rows, width, family, gen, per_kernel=args.per_kernel or family in ("normal", "all_equal"))
            results["pack"].append(r)
            save()
            normal = normal or r["pack_us"]
            print(f"  {family:<18}{r['pack_us']:8.1f}{r['pack_us'] / normal:8.2f}x{r['torch_topk_us']:10.1f}"
                  f"  {r['exact']}", flush=True)
    if args.skip_merge:
        return
    world, k = 8, 2048
    for rows, width, interleave in ((64, 16384, i) for i in args.interleaves):
        print(f"merge W={world} T={rows} S={width} I={interleave}   family  merge  vs-normal  generic-by-rank  speedup")
        normal = None
        for family in families:
            r = bench_merge(merge_inputs(family, world, rows, width, interleave, gen), interleave, k,
                            per_kernel=args.per_kernel or family == "normal")
            r["family"] = family
            results["merge"].append(r)
            save()
            normal = normal or r["merge_us"]
            print(f"  {family:<18}{r['merge_us']:8.1f}{r['merge_us'] / normal:8.2f}x{r['generic_by_rank_us']:10.1f}"
                  f"{r['generic_by_rank_us'] / r['merge_us']:8.1f}x  exact={r['exact']} saturated={r['saturated_rows']}",
                  flush=True)
    for rows, width in () if args.skip_rank0_best else ((8, 131072), (64, 16384)):
        base = bench_merge(merge_inputs("normal", world, rows, width, 1, gen), 1, k)
        best = bench_merge(merge_inputs("normal", world, rows, width, 1, gen, boost_rank=0), 1, k, per_kernel=True)
        best["family"], base["family"] = "rank0_best", "normal"
        results["merge"] += [base, best]
        save()
        print(f"merge W={world} T={rows} S={width}: unsaturated {base['merge_us']:.1f}, rank 0 holds the best "
              f"{best['merge_us']:.1f} ({best['merge_us'] / base['merge_us']:.2f}x; saturated rows "
              f"{best['saturated_rows']}, exact {base['exact']} {best['exact']}); generic by rank "
              f"{best['generic_by_rank_us']:.1f}", flush=True)


@triton.jit
def floor_kernel(out_ptr, x_ptr, stride, READ: tl.constexpr, WIDTH: tl.constexpr, N: tl.constexpr, PDL: tl.constexpr):
    """What any pack of one program a row does at least, as the row kernel
    launches (with PDL, ROW_WARPS warps): wait for the prior kernel and write
    the row's N words; with READ, read the row whole (16 bytes a thread a
    load) and take one block-wide maximum first, and write it."""
    row = tl.program_id(0).to(tl.int64)
    after_prior_kernel(PDL)
    value = tl.zeros((), dtype=tl.int32)
    if READ:
        value = tl.max(tl.load(x_ptr + row * stride + tl.arange(0, WIDTH)).to(tl.int16, bitcast=True), axis=0)
    slot = tl.arange(0, power_of_2(N))
    tl.store(out_ptr + row * N + slot, value + slot, mask=slot < N)


def bench_floors(copies, n=384) -> dict:
    """Per call, the two floors of ``floor_kernel`` over ``copies`` (CALLS
    [T, width] bf16 inputs, L2 flushed): it waits and writes; it also reads
    the row and takes its maximum. Any pack of one program a row costs more
    than the second."""
    rows, width = copies[0].shape
    out = torch.empty(CALLS, rows, n, dtype=torch.int32, device=copies[0].device)
    def floor(i, read):
        floor_kernel[(rows,)](out[i], copies[i], copies[i].stride(0), READ=read, WIDTH=width, N=n, PDL=True,
                              num_warps=ROW_WARPS, launch_pdl=True)
    return {f"{name}_us": bench(graphed_over(lambda i: floor(i, read), range(CALLS)).replay, CALLS)
            for name, read in (("wait_write", False), ("read_max_write", True))}


DECODE_WIDTHS = (16384, 131072)  # the pack's; the merge's shard is 16384 tokens (a 128K context over 8 ranks)


def bench_decode(families, row_counts, widths, gen, results, save) -> None:
    """Per T: the pack beside torch.topk at ``widths`` and the simulated
    merge W = 8, K = 2048, S = 16384 over ``families``; on normal scores the
    merge's stages, launches and PDL off, the merge W = 1, and the generic
    merge run rank by rank on the same inputs."""
    world, width, k, dev = 8, 16384, 2048, torch.device("cuda")
    for rows in row_counts:
        print(f"T = {rows}   family  " + "  ".join(f"pack[{rows},{w}]" for w in widths)
              + f"  merge W={world} S={width}  (torch.topk at each width)")
        for family in families:
            packs = [bench_pack(rows, w, family, gen) for w in widths]
            copies = [merge_inputs(family, world, rows, width, 1, gen) for _ in range(CALLS)]
            ends = torch.full((world, rows), width, dtype=torch.int32, device=dev)
            merge = merge_breakdown(copies, ends, k, REPS, stages=family == "normal")
            entry = dict(T=rows, family=family, W=world, S=width, K=k, merge=merge,
                         pack={str(p["S"]): p for p in packs})
            if family == "normal":
                single = [family_scores(family, rows, width, gen, dev)[None] for _ in range(CALLS)]
                entry["merge_w1"] = merge_breakdown(single, ends[:1], k, REPS)
                entry["generic_by_rank_us"] = bench(graphed_over(
                    lambda x: generic_merge_compute(x, k, rank_by_rank=True), copies).replay, CALLS)
                entry["floors"] = bench_floors([c[0].contiguous() for c in copies])
            results["decode"].append(entry)
            save()
            print(f"  {family:<18}" + "".join(f"{p['pack_us']:10.1f}" for p in packs)
                  + f"{merge['merge_us']:12.1f} ({merge['merge_us'] / world:.1f} a rank)  "
                  + " ".join(f"{p['torch_topk_us']:.1f}" for p in packs)
                  + f"  exact={all(p['exact'] for p in packs) and merge['exact']}", flush=True)
        normal = next(e for e in results["decode"] if (e["T"], e["family"]) == (rows, "normal"))
        print(f"  normal: the generic merge W={world}, run rank by rank, {normal['generic_by_rank_us']:.1f}")
        floors = normal["floors"]
        print(f"  floors of a pack of one program a row, [{rows},{width}]: wait and write {floors['wait_write_us']:.1f}, "
              f"read, one maximum and write {floors['read_max_write_us']:.1f}")
        for name, m in (("W=8", normal["merge"]), ("W=1", normal["merge_w1"])):
            print(f"  normal, {name}: merge {m['merge_us']:.1f}, PDL off {m['merge_no_pdl_us']:.1f}, "
                  f"launches a rank {m['launches_per_rank']:.1f}; rank 0 alone: pack {m['pack_us']:.1f}, "
                  f"exchange {m['exchange_us']:.1f}, select {m['select_us']:.1f}, rescue {m['rescue_us']:.1f}"
                  f"  exact={m['exact']}", flush=True)


def bench_fp32(families, shapes, interleaves, gen, results, save) -> None:
    """Exact fp32 order beside bf16 order of the same scores rounded: the
    pack at ``shapes`` (each compiled for rows of 131072 tokens, as the bf16
    packs are), and the merge W = 8, T = 64, S = 16384 at ``interleaves``
    beside the generic merge on the fp32 scores."""
    dev, fp32 = torch.device("cuda"), torch.float32
    for rows, width in shapes:
        print(f"fp32 pack [{rows}, {width}] N=384   family  fp32  bf16  ratio  torch.topk(fp32)  exact")
        for family in families:
            copies = [family_scores(family, rows, width, gen, dev, fp32) for _ in range(CALLS)]
            exact32 = bench_pack(rows, width, family, gen, copies=copies, score_dtype=fp32,
                                 per_kernel=family == "normal")
            rounded = bench_pack(rows, width, family, gen, copies=[c.bfloat16() for c in copies],
                                 per_kernel=family == "normal")
            exact32["score_dtype"] = "float32"  # in place: a profile fills these dicts after every timing
            results["pack"] += [exact32, rounded]
            save()
            print(f"  {family:<18}{exact32['pack_us']:8.1f}{rounded['pack_us']:8.1f}"
                  f"{exact32['pack_us'] / rounded['pack_us']:8.2f}x{exact32['torch_topk_us']:10.1f}"
                  f"  {exact32['exact']} {rounded['exact']}", flush=True)
    world, rows, width, k = 8, 64, 16384, 2048
    for interleave in interleaves:
        print(f"fp32 merge W={world} T={rows} S={width} I={interleave}   family  fp32  bf16  ratio  "
              "generic-by-rank(fp32)  speedup  exact")
        for family in families:
            logits = merge_inputs(family, world, rows, width, interleave, gen, dtype=fp32)
            exact32 = bench_merge(logits, interleave, k, per_kernel=family == "normal", score_dtype=fp32)
            rounded = bench_merge(logits.bfloat16(), interleave, k, per_kernel=family == "normal")
            exact32.update(family=family, score_dtype="float32")
            rounded["family"] = family
            results["merge"] += [exact32, rounded]
            save()
            print(f"  {family:<18}{exact32['merge_us']:8.1f}{rounded['merge_us']:8.1f}"
                  f"{exact32['merge_us'] / rounded['merge_us']:8.2f}x{exact32['generic_by_rank_us']:10.1f}"
                  f"{exact32['generic_by_rank_us'] / exact32['merge_us']:8.1f}x  {exact32['exact']} {rounded['exact']}"
                  f" saturated={exact32['saturated_rows']}", flush=True)


if __name__ == "__main__":
    main()
