"""What one ``tl.histogram`` costs on this GPU, by bins and elements: 64
programs of 8 warps each load SIZE int32 and histogram them REPS times
(a masked sum stands for one bin). The cost of one histogram is
(t(REPS=4) - t(REPS=1)) / 3; graphs of 20 launches, medians of do_bench.

    python scripts/probe_histogram.py
"""

import torch
import triton
import triton.language as tl
import triton.testing

from nvshmem_topk.timing import graphed

CALLS = 20


@triton.jit
def histogram_kernel(out_ptr, x_ptr, SIZE: tl.constexpr, BINS: tl.constexpr, REPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x = tl.load(x_ptr + row * SIZE + tl.arange(0, SIZE))
    counts = tl.zeros((BINS,), dtype=tl.int32)
    for r in tl.static_range(REPS):  # each repetition sees other digits and another mask
        if BINS > 1:
            counts += tl.histogram((x >> r) & (BINS - 1), BINS, mask=x > r)
        else:
            counts += tl.sum((x > r).to(tl.int32), axis=0)
    tl.store(out_ptr + row * BINS + tl.arange(0, BINS), counts)


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}: one histogram's microseconds, 64 programs of 8 warps")
    print(f"{'elements':>9}" + "".join(f"{bins:>8}" for bins in (1, 32, 64, 128, 256)))
    for size in (1024, 2048, 4096):
        x = torch.randint(0, 1 << 20, (64, size), dtype=torch.int32, device="cuda")
        line = f"{size:>9}"
        for bins in (1, 32, 64, 128, 256):
            times = []
            for reps in (1, 4):
                out = torch.empty(64, bins, dtype=torch.int32, device="cuda")
                launch = lambda: histogram_kernel[(64,)](out, x, SIZE=size, BINS=bins, REPS=reps, num_warps=8)
                graph = graphed(launch, CALLS)
                times.append(triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
                             * 1e3 / CALLS)
            line += f"{(times[1] - times[0]) / 3:>8.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
