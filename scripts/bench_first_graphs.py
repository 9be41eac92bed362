"""A process's first CUDA graphs replay slower than later ones; why
``timing.graphed`` calls ``timing.settle_graph_launches`` first. One
pack's graph (a graph of CALLS calls over distinct inputs, L2 flushed, as
bench_kernels times it) captured in a fresh process, then another on the
same buffers, both timed; then the ten graphs of settle_graph_launches,
and both timed again, and a third captured on new buffers:

    python3 scripts/bench_first_graphs.py [--shape 64x131072]

The pack is called with its scratch passed in, so that the second graph
reads and writes exactly the first one's buffers."""

from __future__ import annotations

import argparse
import subprocess

import torch

from bench_kernels import CALLS, bench
from nvshmem_topk.format import num_planes, packed_row_words
from nvshmem_topk.kernels import pack
from nvshmem_topk.testing import family_scores
from nvshmem_topk.timing import settle_graph_launches

N = 384


def pack_graph(buffers, width: int) -> torch.cuda.CUDAGraph:
    """A graph of CALLS packs with PDL, captured directly (``timing.graphed``
    would settle the process first)."""
    copies, ends, outs, scratch = buffers

    def call(i):
        pack.pack(outs[i], copies[i], None, ends, local_topk=N, max_local_len=width, scratch=(scratch, scratch),
                  pdl=True)

    call(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            call(i)
    return graph


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="64x131072")
    rows, width = (int(v) for v in parser.parse_args().shape.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)

    def buffers():
        return ([family_scores("normal", rows, width, gen, torch.device("cuda")) for _ in range(CALLS)],
                torch.full((rows,), width, dtype=torch.int32, device="cuda"),
                torch.empty(CALLS, rows, packed_row_words(N, num_planes(width)), dtype=torch.int32, device="cuda"),
                pack.scratch_for(rows, N, width, torch.device("cuda"), publishing=False)[0])

    first = buffers()
    graphs = [pack_graph(first, width), pack_graph(first, width)]
    clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    print(f"pack [{rows}, {width}] N={N}, µs per call (clocks {clocks})")
    print("fresh process:  first graph {:.1f}, second graph (same buffers) {:.1f}".format(
        *(bench(g.replay, CALLS) for g in graphs)))
    settle_graph_launches()
    graphs.append(pack_graph(buffers(), width))
    print("settled:        first graph {:.1f}, second graph {:.1f}, a graph on new buffers {:.1f}".format(
        *(bench(g.replay, CALLS) for g in graphs)))


if __name__ == "__main__":
    main()
