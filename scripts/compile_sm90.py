"""Compile every kernel family for Hopper (sm_90) on any machine, GPU or not,
with the ptxas that ships in Triton's wheel, and print compile time,
resource use (registers, stack, local memory) and the static SASS (its
instructions, NOPs aside, and its block barriers: a block-wide reduction
compiles to up to three) from the cubin: a count of a change's work that needs
no device time.

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

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from nvshmem_topk import format as fmt
from nvshmem_topk.kernels import exchange, finish, local, pack, select
from nvshmem_topk.protocol import RowsOutput, TritonBackend

HOPPER = GPUTarget("cuda", 90, 32)
_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
          torch.int64: "*i64"}


def _signature(value):
    """Triton's type of a launch argument (tuples nest; None is a constexpr)."""
    if isinstance(value, tuple):
        return tuple(_signature(v) for v in value)
    if value is None:
        return "constexpr"
    if isinstance(value, torch.Tensor):
        return _TYPES[value.dtype]
    return "i1" if isinstance(value, bool) else "i32" if -2**31 <= value < 2**31 else "i64"


def _nones(value, path=()):
    """Paths of the arguments that are None (compile-time constants)."""
    if isinstance(value, tuple):
        return [p for i, v in enumerate(value) for p in _nones(v, path + (i,))]
    return [path] if value is None else []


def _aligned(value, path=()):
    """Paths of the arguments a launch specialises as divisible by 16:
    pointers (allocations are 256-byte aligned) and integers that are, which
    lets the loads of 8 bf16 be vectorised."""
    if isinstance(value, tuple):
        return [p for i, v in enumerate(value) for p in _aligned(v, path + (i,))]
    divisible = isinstance(value, torch.Tensor) or (value is not None and not isinstance(value, bool)
                                                    and value % 16 == 0)
    return [path] if divisible else []


def variants(world_size: int, topk: int, local_topk: int, dtype: torch.dtype, score_bits: int = 16,
             library_peers: int = 0):
    """The launches of one configuration, built by the launchers themselves
    from small CPU tensors (nothing runs): a merge of one row of 131072
    tokens on a rank of ``world_size``, the pack's pipelines for N (rows
    given no starts) and for K rounded up to 32 (pushed lists; rows given
    starts), so that both forms of the row window compile, the packing of a
    caller's indices, and the select (also building short rows' pushed
    lists), the rescue and a one-rank group's merge in both output forms."""
    rows, max_rows, interleave = 1, 1, 1
    width = 131072
    planes = fmt.num_planes(width)
    i32 = dict(dtype=torch.int32)
    logits = torch.zeros(rows, width, dtype=dtype)
    ends = torch.full((rows,), width, **i32)
    none = torch.zeros(max_rows, dtype=torch.int64)
    epochs, sat, status = torch.zeros(max_rows, **i32), fmt.sat_word(none, none, score_bits), torch.zeros(4, **i32)
    ptrs, pes = torch.zeros(world_size, dtype=torch.int64), torch.zeros(world_size, **i32)
    slots = fmt.rescue_slots(topk, local_topk)
    gid_bits = fmt.global_id_bits(world_size, interleave, width)
    for n, list_slots, starts in ((local_topk, 0, None), (fmt.list_len(topk), slots, torch.zeros_like(ends))):
        out = torch.zeros(rows, fmt.packed_row_words(n, planes, score_bits), **i32)
        scratch, arrivals = pack.scratch_for(rows, n, width, "cpu", score_bits=score_bits)
        publish = pack.Publish(epochs, ptrs, ptrs, pes, max_rows, 0, world_size, sat=sat, list_slots=list_slots,
                               gid_bits=gid_bits if list_slots else 0, library_peers=library_peers if list_slots else 0)
        for call_width in TritonBackend.compiled_widths(width):  # each width class of the pack
            yield from pack.pipeline(out, logits[:, :call_width], starts, ends, n=n, max_local_len=width,
                                     scratch=scratch, arrivals=arrivals, publish=publish, pdl=True,
                                     score_bits=score_bits)
    packed = torch.zeros(rows, fmt.packed_row_words(local_topk, planes, score_bits), **i32)
    yield pack.pack_indices_launch(packed, logits, torch.zeros(rows, local_topk, **i32), None, ends,
                                   max_local_len=width, pdl=True, score_bits=score_bits)
    yield exchange.push_rows_launch(packed, epochs, ptrs, ptrs, pes, max_rows=max_rows, rank=0,
                                    world_size=world_size, library_peers=library_peers, pdl=True)
    table = torch.zeros(4, 8, **i32)
    kv = RowsOutput(torch.zeros(rows, **i32), table, 64, 64, torch.zeros(rows, topk, **i32), torch.zeros(rows, **i32))
    common = dict(num_rows=rows, ids=torch.zeros(rows, topk, **i32), rows=kv, sat=sat, status=status,
                  gather=torch.zeros(1, **i32), flags=torch.zeros(1, **i32), epochs=epochs,
                  ties=torch.zeros(rows, select.TIE_TILE, dtype=torch.int64),
                  selected=torch.zeros(rows, select.rescue_keys(topk), dtype=torch.int64), max_rows=max_rows,
                  rank=0, world_size=world_size, topk=topk, local_topk=local_topk, planes=planes,
                  interleave=interleave, gid_bits=gid_bits, max_spins=1000, pdl=True, score_bits=score_bits)
    recv = torch.zeros(1, **i32)
    short = logits[:, :pack.SHORT_ROWS]  # rows this short build their pushed lists in the select
    lists = select.ShortLists(short, None, ends, recv, publish, width)
    for sorted_ in (False, True):  # sorted: the select and the rescue only store the chosen keys
        yield select.select_launch(**common, sorted=sorted_)
        yield select.select_launch(**common, sorted=sorted_, lists=lists)
        yield select.rescue_launch(**common, sorted=sorted_, recv=recv)
        if world_size == 1 and score_bits == 16:
            yield local.local_merge_launch(logits=short, row_starts=None, row_ends=ends, ids=common["ids"],
                                           rows=kv, sorted=sorted_, selected=common["selected"], topk=topk,
                                           max_local_len=width, gid_bits=gid_bits, pdl=True)
    yield select.order_launch(**common, rescued_only=True)
    odd = torch.zeros(rows, pack.SHORT_ROWS + 1, dtype=dtype)[:, :pack.SHORT_ROWS - 15]
    out = torch.zeros(rows, fmt.packed_row_words(local_topk, planes, score_bits), **i32)
    yield from pack.pipeline(out, odd, None, ends, n=local_topk, max_local_len=width, scratch=scratch,
                             arrivals=arrivals, publish=None, pdl=True, score_bits=score_bits)
    odd_lists = select.ShortLists(odd, None, ends, recv, publish, width)
    yield select.select_launch(**common, sorted=False, lists=odd_lists)
    if world_size == 1 and score_bits == 16:
        yield local.local_merge_launch(logits=odd, row_starts=None, row_ends=ends, ids=common["ids"], rows=kv,
                                       sorted=False, selected=common["selected"], topk=topk, max_local_len=width,
                                       gid_bits=gid_bits, pdl=True)


def compile_one(launch, extern_libs=None) -> dict:
    start = time.perf_counter()
    options = {"num_warps": launch.num_warps} | ({"extern_libs": tuple(extern_libs.items())} if extern_libs else {})
    if launch.max_registers:
        options["maxnreg"] = launch.max_registers
    constexprs = launch.constexprs
    names = [name for name in launch.kernel.arg_names if name not in constexprs]
    signature = dict(zip(names, (_signature(v) for v in launch.args))) | {name: "constexpr" for name in constexprs}
    attrs = {(i,) + path: [["tt.divisibility", 16]] for i, v in enumerate(launch.args) for path in _aligned(v)}
    nones = {(i,) + path: None for i, v in enumerate(launch.args) for path in _nones(v)}
    compiled = triton.compile(ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs | nones,
                                        attrs=attrs),
                              target=HOPPER, options=options)
    seconds = time.perf_counter() - start
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", cubin.name], capture_output=True, text=True, check=True).stdout
    reg, stack, local = (int(v) for v in re.search(r"REG:(\d+) STACK:(\d+) .*LOCAL:(\d+)", usage).groups())
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)
    return dict(kernel=launch.kernel.__name__, seconds=seconds, registers=reg, stack=stack, local=local,
                sass=sum(op != "NOP" for op in ops), barriers=sum(op.startswith("BAR.SYNC") for op in ops))


CONFIGS = ((8, 2048, 384, torch.bfloat16), (16, 4096, 384, torch.bfloat16), (1, 2048, 3072, torch.bfloat16),
           (3, 96, 32, torch.float32), (4, 3000, 1152, torch.float16), (8, 2048, 384, torch.float32, 32))


def main(device_library: str | None = None) -> list[dict]:
    rows = []
    print(f"{'kernel':<24}{'W':>3}{'K':>6}{'N':>6}{'bits':>5}{'compile s':>11}{'regs':>6}{'stack':>7}{'local':>7}"
          f"{'sass':>7}{'bars':>6}")
    jobs = [(config, variant, None) for config in CONFIGS for variant in variants(*config)]
    if device_library:  # the two kernels that reach peers, every peer but rank 0 through the library
        config = CONFIGS[0]
        jobs += [(config, variant, {"libnvshmem_device": device_library})
                 for variant in variants(*config, library_peers=(1 << config[0]) - 2)
                 if variant.kernel in (exchange.push_rows_kernel, finish.finish_kernel)]
    for (world_size, topk, local_topk, _, *bits), variant, extern_libs in jobs:
        score_bits = bits[0] if bits else 16
        row = dict(compile_one(variant, extern_libs=extern_libs), W=world_size, K=topk, N=local_topk,
                   score_bits=score_bits, device_library=extern_libs is not None)
        rows.append(row)
        name = row["kernel"] + (" (library)" if extern_libs else "")
        print(f"{name:<24}{world_size:>3}{topk:>6}{local_topk:>6}{score_bits:>5}{row['seconds']:>11.1f}"
              f"{row['registers']:>6}{row['stack']:>7}{row['local']:>7}{row['sass']:>7}{row['barriers']:>6}",
              flush=True)
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--device-library", default=None, help="path of libnvshmem_device.bc")
    main(parser.parse_args().device_library)
