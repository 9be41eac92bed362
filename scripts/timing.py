"""Timing helpers shared by the benchmark scripts (CUDA only)."""

from __future__ import annotations

import torch


def graphed(fn) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph, after one eager call that compiles
    its kernels and allocates outside the capture."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
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
