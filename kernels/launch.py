"""One kernel launch, as its launcher builds it: run on the stream by the
launcher, and compiled for sm_90 by scripts/compile_sm90.py from the same
description (the signature read off its arguments), so that no signature
is written twice. ``compile_only`` turns launches into parallel compiles."""

from __future__ import annotations

import contextlib
import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

_COMPILE_ONLY = contextvars.ContextVar("nvshmem_topk_compile_only", default=False)


@dataclass(frozen=True)
class Launch:
    """``kernel[grid](*args, **constexprs)`` with ``num_warps`` warps.
    ``args`` may nest tuples (kernels take related pointers and scalars as
    one tuple); constexprs include PDL, and LIBRARY_PEERS where the kernel
    can reach peers through NVSHMEM's device library (linked when set)."""

    kernel: object
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    num_warps: int

    def __call__(self) -> None:
        options = dict(launch_pdl=self.constexprs["PDL"])
        if self.constexprs.get("LIBRARY_PEERS"):
            from . import nvshmem_device

            options |= nvshmem_device.launch_options()
        if _COMPILE_ONLY.get():  # the same arguments, so the variant the launch will look up
            self.kernel.warmup(*self.args, grid=self.grid, **self.constexprs, num_warps=self.num_warps, **options)
        else:
            self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps, **options)


@contextlib.contextmanager
def compile_only(threads: int | None = None):
    """Within it, launches run nothing: they compile their kernel variants
    on ``threads`` threads (default one per CPU; Triton's AsyncCompileMode).
    On exit every variant is compiled and in Triton's in-process cache.
    (Triton's code generation and some of its MLIR passes hold the GIL, so
    this is about 2.5x faster than compiling one after another, not Nx.)"""
    import triton

    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool, triton.AsyncCompileMode(pool):
        token = _COMPILE_ONLY.set(True)
        try:
            yield
        finally:
            _COMPILE_ONLY.reset(token)
