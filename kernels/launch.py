"""One kernel launch, as its launcher builds it: run on the stream by the
launcher, and compiled for sm_90 by scripts/compile_sm90.py from the same
description (the signature read off its arguments), so that no signature
is written twice."""

from __future__ import annotations

from dataclasses import dataclass


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
        self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps, **options)

