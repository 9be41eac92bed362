"""The real protocol across CPU processes (ShmGroup over gloo): exactness,
bounded failure, and no shared memory left behind. Every rank runs
tests/mp_worker.py; launch.run_ranks starts them with torchrun's
environment and a hard timeout."""

import os
import re
import subprocess
import sys

import pytest

from launch import TESTS, family_merges, run_ranks

INTERPRET = {"TRITON_INTERPRET": "1"}
BOUND_S = 2.0  # the workers' timeout_s


def _library_segments():
    return [n for n in os.listdir("/dev/shm") if n.startswith("nvshmem_topk-")]


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(_library_segments())
    yield
    assert set(_library_segments()) - before == set(), "a shared-memory segment was left behind"


def _run(mode, impl, exchange, world_size, timeout_s=240):
    results = run_ranks([str(TESTS / "mp_worker.py"), mode, impl, exchange], world_size, timeout_s,
                        env=INTERPRET)
    for r in results:
        assert r.returncode is not None, f"rank {r.rank} hung:\n{r.output}"
    return results


@pytest.mark.parametrize("world_size,impl,exchange", [
    (2, "triton", "push"), pytest.param(4, "triton", "push", marks=pytest.mark.slow), (4, "reference", "push"),
    (3, "reference", "all_gather"),
])
def test_every_family_exact_across_processes(world_size, impl, exchange):
    for r in _run("families", impl, exchange, world_size):
        assert r.returncode == 0 and f"rank {r.rank} ok {family_merges()}" in r.output, r.output


@pytest.mark.parametrize("impl,exchange", [pytest.param("triton", "push", marks=pytest.mark.slow),
                                           ("reference", "all_gather")])
def test_serving_engine_pattern_across_processes(impl, exchange):
    results = _run("serving", impl, exchange, 3)
    epochs = set()
    for r in results:
        assert r.returncode == 0 and f"rank {r.rank} served 18 merges" in r.output, r.output
        epochs.add(r.output.split("epochs ")[1].strip())
    assert len(epochs) == 1, "ranks disagree on the per-row epochs"


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.slow), "reference"])
def test_two_dcp_groups_inside_a_tp_group_through_the_indexer(impl):
    # Four interpreted ranks on two cores: about 2 minutes with triton; the bound leaves room for slower CI machines.
    for r in _run("tp_dcp", impl, "push", 4, timeout_s=420):
        assert r.returncode == 0 and f"dcp group {r.rank // 2}, dcp rank {r.rank % 2}) ok 16" in r.output, r.output


def test_compiled_merge_across_processes():
    for r in _run("compiled", "reference", "push", 2):
        assert r.returncode == 0 and f"rank {r.rank} compiled ok" in r.output, r.output


def _assert_others_raised(results, faulty=1):
    for r in results:
        if r.rank == faulty:
            continue
        found = re.search(r"rank \d+ raised after ([0-9.]+) s", r.output)
        assert r.returncode == 0 and found, f"rank {r.rank}:\n{r.output}"
        assert float(found.group(1)) < 5 * BOUND_S, f"rank {r.rank} took {found.group(1)} s"
        assert "dead, absent or out of step" in r.output


@pytest.mark.parametrize("impl,exchange", [("reference", "push"), ("triton", "push"), ("reference", "all_gather")])
def test_a_rank_that_never_arrives_makes_the_others_raise(impl, exchange):
    results = _run("absent", impl, exchange, 2)
    _assert_others_raised(results)
    assert "rank 1 stayed away" in results[1].output


@pytest.mark.parametrize("impl,world_size", [("triton", 2), ("reference", 3)])
def test_a_rank_killed_mid_merge_makes_the_others_raise(impl, world_size):
    results = _run("killed", impl, "push", world_size)
    assert results[1].returncode == 9
    _assert_others_raised(results)


def test_bad_input_on_one_rank_is_a_clear_error_there_and_a_timeout_elsewhere():
    results = _run("bad_input", "reference", "push", 3)
    assert "rank 1 refused: row_ends must be torch.int32 or torch.int64, got torch.float32" in results[1].output
    _assert_others_raised(results)


def test_ranks_that_disagree_on_settings_all_raise_naming_them():
    results = _run("mismatch", "reference", "push", 3)
    for r in results:
        assert r.returncode == 0 and f"rank {r.rank} refused:" in r.output, r.output
        assert "topk (rank 0: 64, rank 1: 128, rank 2: 64)" in r.output, r.output
        assert "interleave (rank 0: 1, rank 1: 1, rank 2: 2)" in r.output, r.output
        assert "max_rows" not in r.output, r.output


def test_torchrun_demo_on_cpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                          "nvshmem_topk", "demo", "--rows", "2", "--local-len", "4096", "--topk", "512"],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.strip().startswith("2 ")]
    assert len(rows) == 2 and all(line.endswith("yes") for line in rows), out.stdout


def test_serving_indexer_example_on_cpu():
    """examples/serving_indexer.py as its docstring runs it (CPU form):
    a compiled indexer layer, two micro-batches, every merge checked."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          str(TESTS.parent / "examples" / "serving_indexer.py")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    steps = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 12 and all(line.endswith("exact=True") for line in steps), out.stdout


def test_merge_benchmark_script_runs_and_checks_exactness_on_cpu():
    """scripts/bench_merge.py on CPU processes (ShmGroup, reference stages):
    the script's orchestration, baseline and exactness column."""
    script = TESTS.parent / "scripts" / "bench_merge.py"
    results = run_ranks([str(script), "--cpu", "--rows", "2", "--widths", "3000", "--topk", "256", "--out",
                         os.devnull], 2, 240)
    for r in results:
        assert r.returncode == 0, r.output
    rows = [line.split() for line in results[0].output.splitlines() if line.strip().startswith("2 ")]
    assert len(rows) == 1 and rows[0][-1] == "True", results[0].output
