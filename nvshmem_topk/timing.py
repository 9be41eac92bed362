"""CUDA timing helpers shared by the CLI's bench and the benchmark scripts."""

from __future__ import annotations

import torch


def graphed(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """``calls`` back-to-back calls of ``fn`` captured in one CUDA graph,
    after one eager call that compiles its kernels and allocates outside the
    capture. Several calls per graph keep the GPU busy while the host
    launches the next replay, as a serving engine's decode-step graph does:
    timing one replay of a few-microsecond graph times the host's launch."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def kernel_times(fn, iters: int = 20) -> dict[str, float]:
    """Device microseconds per kernel name for one call of ``fn`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / iters for e in prof.key_averages() if e.self_device_time_total > 0}
