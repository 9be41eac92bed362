"""NVSHMEM's device library, for peers without a load/store address.

A kernel that reaches a peer this way calls the functions below and is
launched with ``launch_options()``: Triton links NVSHMEM's device bitcode
into it, and every module that holds NVSHMEM's device state is initialised
for NVSHMEM (``nvshmemx_cumodule_init``) as it loads, before its first
launch. Pointers travel as int64 addresses of symmetric memory on this PE;
``pe`` is the NVSHMEM PE (the world rank). Called with scalar arguments, as
here, every thread of the block makes the call: the ``_block`` put is meant
to be called so (it synchronises the block before and after its copy).

Ordering: the puts to a PE, ``fence()``, then the flag's atomic set: the
fence orders the puts before the flag on that PE."""

import functools

import triton
import triton.language as tl
from triton.language import core


@core.extern
def putmem_nbi_block(dest, source, nbytes, pe, _semantic=None):
    """nvshmemx_putmem_nbi_block: ``nbytes`` from ``source`` (here) to the
    symmetric ``dest`` on ``pe``; completes by the next fence / quiet."""
    return core.extern_elementwise(
        "", "", [dest, source, nbytes, pe],
        {(core.int64, core.int64, core.int64, core.int32): ("nvshmemx_putmem_nbi_block", core.int32)},
        is_pure=False, _semantic=_semantic)


@core.extern
def fence(_semantic=None):
    """nvshmem_fence: puts and atomics issued before it reach each PE before
    those issued after it."""
    return core.extern_elementwise("", "", [], {(): ("nvshmem_fence", core.int32)}, is_pure=False,
                                   _semantic=_semantic)


@core.extern
def int32_atomic_set(dest, value, pe, _semantic=None):
    """nvshmem_int32_atomic_set: ``value`` into the symmetric int32 ``dest``
    on ``pe``."""
    return core.extern_elementwise(
        "", "", [dest, value, pe],
        {(core.int64, core.int32, core.int32): ("nvshmem_int32_atomic_set", core.int32)},
        is_pure=False, _semantic=_semantic)


@triton.jit
def put_then_flag(dest, source, nbytes, flag, value, pes_ptr, WORLD: tl.constexpr, PEERS: tl.constexpr):
    """To every rank q in the bitmask PEERS (its PE at ``pes_ptr[q]``):
    ``nbytes`` from ``source`` to the symmetric ``dest``, one fence, then
    ``value`` into the symmetric int32 ``flag`` (int64 addresses on this
    PE). The put synchronises the block around its copy, and each thread
    fences before its atomic, so every thread's share lands first."""
    for q in tl.static_range(WORLD):
        if ((PEERS >> q) & 1) != 0:
            putmem_nbi_block(dest, source, nbytes, tl.load(pes_ptr + q))
    fence()
    for q in tl.static_range(WORLD):
        if ((PEERS >> q) & 1) != 0:
            int32_atomic_set(flag, value, tl.load(pes_ptr + q))


@functools.cache
def launch_options() -> dict:
    """Launch options of a kernel that calls the device library: NVSHMEM's
    device bitcode to link. Also installs, once, the kernel-load hook that
    initialises such modules for NVSHMEM."""
    from nvshmem.core import find_device_bitcode_library

    _install_module_init()
    return {"extern_libs": {"libnvshmem_device": find_device_bitcode_library()}}


_STATE_SYMBOL = b"nvshmemi_device_state_d"


def _init_module(module, function, name, metadata_group, kernel_hash, chained=None) -> None:
    from cuda.bindings import driver
    from nvshmem import bindings

    err, _, _ = driver.cuModuleGetGlobal(driver.CUmodule(module), _STATE_SYMBOL)
    if err == driver.CUresult.CUDA_SUCCESS:  # only modules linked with the device library
        status = bindings.cumodule_init(int(module))
        if status != 0:
            raise RuntimeError(f"nvshmemx_cumodule_init failed ({status}) for kernel {name}")
    if chained is not None:
        chained(module, function, name, metadata_group, kernel_hash)


def _install_module_init() -> None:
    """Initialise every Triton module that links NVSHMEM's device library as
    it loads (Triton's kernel-load hook; a hook already there still runs)."""
    from triton import knobs

    knobs.runtime.kernel_load_end_hook = functools.partial(_init_module, chained=knobs.runtime.kernel_load_end_hook)
