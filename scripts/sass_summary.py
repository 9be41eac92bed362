"""Where a kernel's instructions and stalls go, from Nsight Compute's source
page of one kernel (SASS, per instruction), as the `profile` step of
scripts/device_run.sh exports it:

    ncu --import kernels.ncu-rep --page source --print-source sass --csv -k regex:finish -c 1 > finish.csv
    python scripts/sass_summary.py finish.csv

Prints the executed warp instructions and the warp-stall samples by opcode,
and the stall reasons over the whole kernel."""

from __future__ import annotations

import collections
import csv
import sys


def main(path: str) -> None:
    table = list(csv.reader(open(path)))
    if len(table) < 2:  # the report holds no such kernel
        print(f"{path}: no kernel")
        return
    header, rows = table[1], table[2:]  # line 0 names the kernel
    executed, sampled = header.index("Instructions Executed"), header.index("Warp Stall Sampling (All Samples)")
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    by_op, samples_by_op, reasons = collections.Counter(), collections.Counter(), collections.Counter()
    for row in rows:
        words = row[1].split()
        op = (words[1] if words and words[0].startswith("@") else words[0] if words else "").split(".")[0]
        by_op[op] += int(row[executed] or 0)
        samples_by_op[op] += int(row[sampled] or 0)
        for name in stalls:
            reasons[name] += int(row[header.index(name)] or 0)
    total, total_samples = sum(by_op.values()), max(sum(samples_by_op.values()), 1)
    print(f"{table[0][1]}: {total} warp instructions executed, {sum(samples_by_op.values())} stall samples")
    for op, count in by_op.most_common(16):
        print(f"  {op:<10}{count:>12} ({100 * count / total:4.1f}%)  samples {100 * samples_by_op[op] / total_samples:4.1f}%")
    print("  stalls: " + ", ".join(f"{name[6:]} {count}" for name, count in reasons.most_common(8)))


if __name__ == "__main__":
    main(sys.argv[1])
