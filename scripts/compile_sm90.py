"""Compile every kernel family for Hopper (sm_90) on any machine, GPU or not,
with the ptxas that ships in Triton's wheel, and print compile time and
resource use (registers, stack, local memory) from the cubin.

    python scripts/compile_sm90.py [--device-library libnvshmem_device.bc]

With NVSHMEM's device bitcode (from the nvidia-nvshmem wheel), the push and
the select are also compiled with every peer but rank 0 reached through the
device library, linked against it.

The interpreter does not catch compiler-only errors (module globals that are
not constexpr, loop-carried values that change type) or compile-time
blow-ups; this does, before any device time is spent."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from nvshmem_topk.kernels import exchange, pack, select

HOPPER = GPUTarget("cuda", 90, 32)
P32, P64, I32 = "*i32", "*i64", "i32"
_OUTPUTS = {"ids_ptr": P32, "rows_ptr": P32, "valid_ptr": P32, "sat_ptr": P64, "status_ptr": P32}
_ROWS = {"req_ptr": P32, "table_ptr": P32, "table_stride": I32, "num_reqs": I32, "num_blocks": I32,
         "block_size": I32, "stride_rows": I32, "rows_stride": I32}


def _p2(n: int) -> int:
    return triton.next_power_of_2(n)


def variants(world_size: int, topk: int, local_topk: int, logits: str, planes: int = 1, gid_bits: int = 21,
             library_peers: int = 0):
    """(kernel, signature, constexprs, num_warps) of one configuration, as
    the launchers build them."""
    def sig(kernel, **types):
        return {name: types.get(name, "constexpr") for name in kernel.arg_names}

    outs = dict(EMIT_IDS=True, EMIT_ROWS=True, SORTED=False, INTERLEAVE=1, GID_BITS=gid_bits)
    row = dict(logits_ptr=logits, row_ends_ptr=P32, sat_ptr=P64, logits_stride=I32, width_limit=I32,
               scratch_stride=I32, rank=I32)
    peer_args = dict(arrivals_ptr=P32, epochs_ptr=P32, peer_ptrs=P64, flag_ptrs=P64, pes_ptr=P32, max_rows=I32)
    for n, listing in ((local_topk, False), (topk, True)):
        plan = pack.plan(n, 131072)
        words = n + planes * (n // 32)
        target = dict(N=n, PLANES=planes, SLOTS=max(topk // local_topk, 1), LIST=listing)
        peers = dict(WORLD=world_size, LIBRARY_PEERS=library_peers if listing else 0)
        yield (pack.estimate_kernel, sig(pack.estimate_kernel, out_ptr=P32, scratch_ptr=P32, **row),
               dict(N=n, WORDS=words, SLOTS=target["SLOTS"], LIST=listing, GROUPS=plan.groups, ROOM=plan.room),
               pack.ESTIMATE_WARPS)
        yield (pack.filter_kernel, sig(pack.filter_kernel, scratch_ptr=P32, **row),
               dict(REGION=plan.region, REGIONS_AT=plan.regions_at, LIST=listing, PAIRS=logits == "*bf16"),
               pack.FILTER_WARPS)
        yield (pack.finish_kernel, sig(pack.finish_kernel, out_ptr=P32, scratch_ptr=P32, **row, **peer_args),
               dict(target, REGION=plan.region, BLOCKS_P2=plan.blocks_p2, HISTOGRAMS_AT=plan.histograms_at,
                    REGIONS_AT=plan.regions_at, TILE=plan.tile, SPAN=plan.span, **peers),
               max(pack.SPAN_WARPS, plan.tile // 256))
        yield (pack.radix_low_kernel, sig(pack.radix_low_kernel, scratch_ptr=P32, **row),
               dict(N=n, LIST=listing, HISTOGRAMS_AT=plan.histograms_at, SPAN=plan.span), pack.SPAN_WARPS)
        yield (pack.radix_write_kernel, sig(pack.radix_write_kernel, out_ptr=P32, scratch_ptr=P32, **row, **peer_args),
               dict(target, HISTOGRAMS_AT=plan.histograms_at, SPAN=plan.span, **peers), pack.SPAN_WARPS)
    words = local_topk + planes * (local_topk // 32)
    yield (exchange.push_rows_kernel, sig(exchange.push_rows_kernel, packed_ptr=P32, epochs_ptr=P32,
                                          gather_ptrs=P64, flag_ptrs=P64, pes_ptr=P32, max_rows=I32, rank=I32),
           dict(WORDS=words, WORLD=world_size, LIBRARY_PEERS=library_peers, BLOCK=512), 4)
    common = dict(TOPK=topk, N=local_topk, PLANES=planes, WORLD=world_size)
    yield (select.select_kernel,
           sig(select.select_kernel, **_OUTPUTS, **_ROWS, ties_ptr=P64, gather_ptr=P32, flags_ptr=P32, epochs_ptr=P32,
               max_rows=I32, rank=I32, max_spins=I32),
           dict(common, WORLD_P2=_p2(world_size), N_P2=_p2(local_topk), **outs), select.SELECT_WARPS)
    yield (select.rescue_kernel,
           sig(select.rescue_kernel, **_OUTPUTS, **_ROWS, selected_ptr=P64, ties_ptr=P64, gather_ptr=P32,
               flags_ptr=P32, epochs_ptr=P32, recv_ptr=P32, max_rows=I32, rank=I32, max_spins=I32),
           dict(common, SLOTS=max(topk // local_topk, 1), WORLD_P2=_p2(world_size), KEYS=select.rescue_keys(topk),
                TILE=select.RESCUE_TILE, **outs), min(16, select.rescue_keys(topk) // 256))


def compile_one(kernel, signature, constexprs, num_warps, extern_libs=None) -> dict:
    start = time.perf_counter()
    options = {"num_warps": num_warps} | ({"extern_libs": tuple(extern_libs.items())} if extern_libs else {})
    constexprs = dict(constexprs, PDL=True)  # as launched on a GPU (kernels/sync.py: dependent_launch)
    # As a launch specialises them for torch's tensors of serving widths:
    # pointers (allocations are 256-byte aligned) and the logits' and
    # scratch's row strides divisible by 16, which lets the loads of 8 bf16
    # be vectorised.
    aligned = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
               if kind.startswith("*") or name in ("logits_stride", "scratch_stride")}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned),
                              target=HOPPER, options=options)
    seconds = time.perf_counter() - start
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
    reg, stack, local = (int(v) for v in re.search(r"REG:(\d+) STACK:(\d+) .*LOCAL:(\d+)", usage).groups())
    return dict(kernel=kernel.__name__, seconds=seconds, registers=reg, stack=stack, local=local)


CONFIGS = ((8, 2048, 384, "*bf16"), (16, 4096, 384, "*bf16"), (1, 2048, 3072, "*bf16"), (3, 96, 32, "*fp32"))


def main(device_library: str | None = None) -> list[dict]:
    rows = []
    print(f"{'kernel':<24}{'W':>3}{'K':>6}{'N':>6}{'compile s':>11}{'regs':>6}{'stack':>7}{'local':>7}")
    jobs = [(config, variant, None) for config in CONFIGS for variant in variants(*config)]
    if device_library:  # the two kernels that reach peers, every peer but rank 0 through the library
        config = CONFIGS[0]
        jobs += [(config, variant, {"libnvshmem_device": device_library})
                 for variant in variants(*config, library_peers=(1 << config[0]) - 2)
                 if variant[0] in (exchange.push_rows_kernel, pack.finish_kernel, pack.radix_write_kernel)]
    for (world_size, topk, local_topk, _), variant, extern_libs in jobs:
        row = dict(compile_one(*variant, extern_libs=extern_libs), W=world_size, K=topk, N=local_topk,
                   device_library=extern_libs is not None)
        rows.append(row)
        name = row["kernel"] + (" (library)" if extern_libs else "")
        print(f"{name:<24}{world_size:>3}{topk:>6}{local_topk:>6}{row['seconds']:>11.1f}"
              f"{row['registers']:>6}{row['stack']:>7}{row['local']:>7}", flush=True)
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--device-library", default=None, help="path of libnvshmem_device.bc")
    main(parser.parse_args().device_library)
