"""The one multi-process launch helper: W ranks of a script with
torchrun's environment contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), each rank's exit code and output collected, everything killed
at the timeout. Faults (a rank that dies or never arrives) stay visible per
rank, which torchrun's agent would hide by stopping the others.
``run_launched`` starts the W ranks through a PMI launcher instead (MPICH's
Hydra ``mpiexec``, nvshmrun), with the same timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent


@dataclass
class RankResult:
    rank: int
    returncode: int | None
    output: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def family_merges() -> int:
    """How many merges a worker's families mode checks: every adversarial
    family of ``nvshmem_topk.testing``, twice (epochs advance, parities
    alternate)."""
    from nvshmem_topk.testing import families

    return 2 * sum(1 for _ in families(1))


def run_ranks(args: list[str], world_size: int, timeout_s: float, env: dict | None = None) -> list[RankResult]:
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
                        **(env or {}))
        procs.append(subprocess.Popen([sys.executable, *args], env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout_s
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append(RankResult(rank, proc.returncode, out))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
            results.append(RankResult(rank, None, out + f"\n[killed after {timeout_s} s]"))
    return results


def run_launched(launcher: str, args: list[str], world_size: int, timeout_s: float,
                 env: dict | None = None) -> list[RankResult]:
    """``launcher -n W python args`` (Hydra's options: MPICH's mpiexec,
    nvshmrun), each rank's output to its own file (Hydra forwards the ranks'
    output in chunks, which can split a line); the launcher's process group
    is killed at the timeout. Every rank's result is the job's exit code."""
    job_env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **(env or {}))
    with tempfile.TemporaryDirectory() as logs:
        command = [launcher, "-n", str(world_size), "-outfile-pattern", f"{logs}/out.%r",
                   "-errfile-pattern", f"{logs}/err.%r", sys.executable, *args]
        proc = subprocess.Popen(command, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            launcher_out, _ = proc.communicate(timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            launcher_out, _ = proc.communicate()
            code, launcher_out = None, launcher_out + f"\n[killed after {timeout_s} s]"
        results = []
        for rank in range(world_size):
            output = "".join(Path(logs, f"{kind}.{rank}").read_text() for kind in ("out", "err")
                             if Path(logs, f"{kind}.{rank}").exists())
            results.append(RankResult(rank, code, output + launcher_out))
        return results
