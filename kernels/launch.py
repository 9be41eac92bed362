"""One kernel launch, as its launcher builds it: run on the stream by the
launcher, and compiled for sm_90 by scripts/compile_sm90.py from the same
description (the signature read off its arguments), so that no signature
is written twice. ``compile_only`` turns launches into parallel compiles."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import time
import warnings
from concurrent.futures import Executor, Future
from dataclasses import dataclass

_COMPILE_ONLY = contextvars.ContextVar("nvshmem_topk_compile_only", default=False)


@dataclass(frozen=True)
class Launch:
    """``kernel[grid](*args, **constexprs)`` with ``num_warps`` warps, and
    at most ``max_registers`` registers a thread when set. ``args`` may nest
    tuples (kernels take related pointers and scalars as
    one tuple); constexprs include PDL, and LIBRARY_PEERS where the kernel
    can reach peers through NVSHMEM's device library (linked when set)."""

    kernel: object
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    num_warps: int
    max_registers: int | None = None

    def __call__(self) -> None:
        options = dict(launch_pdl=self.constexprs["PDL"])
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        if self.constexprs.get("LIBRARY_PEERS"):
            from . import nvshmem_device

            options |= nvshmem_device.launch_options()
        if _COMPILE_ONLY.get():  # the same arguments, so the variant the launch will look up
            self.kernel.warmup(*self.args, grid=self.grid, **self.constexprs, num_warps=self.num_warps, **options)
        else:
            self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps, **options)


class _ForkedCompiles(Executor):
    """The executor of Triton's AsyncCompileMode inside ``compile_only``:
    it holds every compile until ``run()``, which forks processes that
    compile them into Triton's file cache, then compiles each again here,
    where it finds its files. (Triton's code generation and MLIR passes hold
    the GIL, so the threads of one process compile mostly one at a time.)
    Children still running after ``bound_s`` are killed; what they did not
    compile is then compiled here."""

    def __init__(self, processes: int | None, bound_s: float = 300.0):
        self.processes = len(os.sched_getaffinity(0)) if processes is None else processes  # the CPUs we may use
        self.bound_s = bound_s
        self.jobs: list[tuple[Future, functools.partial]] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        self.jobs.append((future, functools.partial(fn, *args, **kwargs)))
        return future

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []
        read_end, write_end = os.pipe()  # job numbers, 4 bytes each, taken one at a time by whichever child is free
        os.write(write_end, b"".join(i.to_bytes(4, "little") for i in range(len(jobs))))
        os.close(write_end)
        children = []
        with warnings.catch_warnings():  # forking a threaded process: the children only compile, then _exit
            warnings.simplefilter("ignore", DeprecationWarning)
            for _ in range(min(self.processes, len(jobs))):
                pid = os.fork()
                if pid == 0:
                    try:
                        while number := os.read(read_end, 4):
                            with contextlib.suppress(BaseException):  # the compile below raises it again
                                jobs[int.from_bytes(number, "little")][1]()
                    finally:
                        os._exit(0)
                children.append(pid)
        os.close(read_end)
        deadline = time.monotonic() + self.bound_s
        for pid in children:
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.01)
        for future, job in jobs:
            try:
                future.set_result(job())
            except Exception as error:
                future.set_exception(error)


@contextlib.contextmanager
def compile_only(processes: int | None = None):
    """Within it, launches run nothing: they record their kernel variants
    (Triton's AsyncCompileMode), which are compiled on exit by ``processes``
    forked processes (default one per CPU this process may run on; 0: none,
    all compiled here) and then found in Triton's cache. On exit every
    variant is in Triton's in-process cache; a compile error is raised
    again by the launch that needs the variant."""
    import triton

    compiles = _ForkedCompiles(processes)
    with triton.AsyncCompileMode(compiles, ignore_errors=True):
        token = _COMPILE_ONLY.set(True)
        try:
            yield
        finally:
            _COMPILE_ONLY.reset(token)
            compiles.run()
