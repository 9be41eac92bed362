"""Whether where a process's allocator places a graph's buffers moves the
pack's time: one shape's pack timed as bench_kernels times it (a CUDA
graph of CALLS calls over distinct inputs, L2 flushed), with PDL and
without, with the GPU's clocks; then again after each step named:

    python3 scripts/bench_placement.py [--shape 64x131072] [STEP ...]

busy: 10 s of the pack; idle: 10 s asleep; other: a graph of [8, 131072]
packs built and timed; regraph: both graphs built again (their inputs,
outputs and scratch allocated now). The clocks and the first graphs'
times before and after say whether the GPU's state moved; the rebuilt
graphs' say whether their placement did."""

from __future__ import annotations

import argparse
import subprocess
import time

import torch

import nvshmem_topk as nt
from bench_kernels import CALLS, bench, graphed_calls
from nvshmem_topk.format import num_planes, packed_row_words
from nvshmem_topk.testing import family_scores

N, MAX_LOCAL_LEN = 384, 131072


def pack_graph(rows: int, width: int, gen: torch.Generator, pdl: bool | None = None):
    """(graph of CALLS packs of normal rows, the buffers it reads and
    writes: they must outlive it)."""
    dev = torch.device("cuda")
    copies = [family_scores("normal", rows, width, gen, dev) for _ in range(CALLS)]
    ends = torch.full((rows,), width, dtype=torch.int32, device=dev)
    outs = torch.empty(CALLS, rows, packed_row_words(N, num_planes(MAX_LOCAL_LEN)), dtype=torch.int32, device=dev)

    def pack(i):
        nt.dcp_topk_pack(copies[i], ends, local_topk=N, max_local_len=MAX_LOCAL_LEN, out=outs[i], impl="triton",
                         pdl=pdl)

    return graphed_calls(pack, range(CALLS)), (copies, ends, outs)


def clocks() -> str:
    query = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="64x131072")
    parser.add_argument("steps", nargs="*", default=["busy", "idle", "other", "regraph", "busy"],
                        choices=["busy", "idle", "other", "regraph"])
    args = parser.parse_args()
    rows, width = (int(v) for v in args.shape.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    held = []

    def build():
        with_pdl, buffers = pack_graph(rows, width, gen)
        without, buffers_2 = pack_graph(rows, width, gen, pdl=False)
        held.extend([buffers, buffers_2])
        return with_pdl, without

    graphs = build()

    def report(name):
        print(f"{name:<16} PDL {bench(graphs[0].replay, CALLS):6.1f}  no PDL {bench(graphs[1].replay, CALLS):6.1f}"
              f"   sm, memory clock, power, °C, clock events: {clocks()}", flush=True)

    print(f"pack [{rows}, {width}] N={N}: µs per call")
    report("first")
    for step in args.steps:
        if step == "busy":
            end = time.time() + 10
            while time.time() < end:
                for _ in range(100):
                    graphs[0].replay()
                torch.cuda.synchronize()
        elif step == "idle":
            time.sleep(10)
        elif step == "other":
            other, buffers = pack_graph(8, 131072, gen)
            held.append(buffers)
            print(f"  [8, 131072] {bench(other.replay, CALLS):6.1f}")
        elif step == "regraph":
            graphs = build()
        report("after " + step)


if __name__ == "__main__":
    main()
