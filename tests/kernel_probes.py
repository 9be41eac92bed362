"""Tiny Triton kernels that expose one device helper each to the tests
(imported inside the tests, so that collecting them needs no Triton)."""

import triton
import triton.language as tl

from nvshmem_topk.kernels.keys import radix_boundary


@triton.jit
def radix_boundary_kernel(out_ptr, hist_ptr, need_ptr):
    """Per program: radix_boundary of hist_ptr[case] for need_ptr[case],
    as three int32 at out_ptr[case]."""
    case = tl.program_id(0).to(tl.int64)
    hist = tl.load(hist_ptr + case * 256 + tl.arange(0, 256))
    bucket, above, in_bucket = radix_boundary(hist, tl.load(need_ptr + case))
    tl.store(out_ptr + case * 3, bucket)
    tl.store(out_ptr + case * 3 + 1, above)
    tl.store(out_ptr + case * 3 + 2, in_bucket)
