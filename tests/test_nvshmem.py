"""The merge across GPUs through NVSHMEM (one process per GPU, started by
launch.run_ranks, or by a PMI launcher, with a hard timeout). Needs CUDA and
nvshmem4py; W is the number of visible GPUs (CUDA_VISIBLE_DEVICES narrows
it). The launcher tests need MPICH's Hydra ``mpiexec`` (the ``mpich``
wheel) on PATH or in NVSHMEM_TOPK_MPIEXEC, and mpi4py for bootstrap="mpi"."""

import importlib.util
import os
import shutil
import subprocess

import pytest
import torch

from launch import TESTS, family_merges, run_launched, run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nvshmem") is None, reason="needs nvshmem4py"),
]
WORLD = torch.cuda.device_count() if torch.cuda.is_available() else 0
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def _run(mode, exchange, timeout_s=400, world=WORLD, device_library="auto", env=None):
    results = run_ranks([str(TESTS / "gpu_worker.py"), mode, exchange, device_library], world, timeout_s,
                        env=SAFE_ENV | (env or {}))
    for r in results:
        assert r.returncode is not None, f"rank {r.rank} hung:\n{r.output}"
    return results


@pytest.mark.parametrize("exchange", ["push", "all_gather", "fcollect"])
def test_every_family_exact_on_gpus(exchange):
    for r in _run("families", exchange):
        assert r.returncode == 0 and f"rank {r.rank} ok {family_merges()}" in r.output, r.output


@pytest.mark.skipif(WORLD < 2, reason="the device library reaches peers; one GPU has none")
@pytest.mark.parametrize("mode,marker", [("families", f"ok {family_merges()}"),
                                         ("graph", "replays ok 1000")])
def test_device_library_forced_for_every_peer_exact(mode, marker):
    """device_library='always': every peer through NVSHMEM's device library
    (puts, fence, atomic flags), no peer addresses at all."""
    for r in _run(mode, "push", device_library="always"):
        assert r.returncode == 0 and f"rank {r.rank} {marker}" in r.output, r.output


@pytest.mark.parametrize("exchange", ["push", "fcollect"])
def test_graph_replays_exact_with_changing_inputs(exchange):
    for r in _run("graph", exchange):
        assert r.returncode == 0 and f"rank {r.rank} replays ok 1000" in r.output, r.output


@pytest.mark.parametrize("exchange", ["push", "fcollect"])
def test_graphs_per_batch_size_replay_exact_on_two_micro_batches(exchange):
    for r in _run("batch_graphs", exchange):
        assert r.returncode == 0 and f"rank {r.rank} batch graphs ok 60" in r.output, r.output


@pytest.mark.parametrize("device_library", ["auto", pytest.param("always", marks=pytest.mark.skipif(
    WORLD < 2, reason="the device library reaches peers; one GPU has none"))])
def test_soak_ten_thousand_merges(device_library):
    for r in _run("soak", "push", device_library=device_library):
        assert r.returncode == 0 and f"rank {r.rank} soak ok 10000" in r.output, r.output


def test_destroyed_workspaces_return_their_heap():
    """100 build/merge/destroy cycles of a workspace that holds over a third
    of a 512 MiB heap."""
    for r in _run("heap", "push", env={"NVSHMEM_SYMMETRIC_SIZE": str(512 << 20)}):
        assert r.returncode == 0 and f"rank {r.rank} heap ok 100" in r.output, r.output


def test_compiled_merge_exact_on_gpus():
    for r in _run("compiled", "push"):
        assert r.returncode == 0 and f"rank {r.rank} compiled ok" in r.output, r.output


@pytest.mark.skipif(WORLD < 2, reason="a timeout needs a second GPU")
def test_a_skipped_merge_raises_on_the_peer():
    results = _run("timeout", "push", timeout_s=120)
    assert "rank 1 skipped a merge" in results[1].output, results[1].output
    for r in results[:1] + results[2:]:
        assert r.returncode == 0 and f"rank {r.rank} raised after" in r.output, r.output


def _hydra_mpiexec():
    """MPICH's Hydra ``mpiexec`` (NVSHMEM_TOPK_MPIEXEC, or the one on PATH), or
    None: another MPI's ``mpiexec`` (Open MPI's) has neither Hydra's options
    nor its PMI-1 server, so it is no launcher for these tests."""
    path = os.environ.get("NVSHMEM_TOPK_MPIEXEC") or shutil.which("mpiexec")
    if path is None:
        return None
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return path if "HYDRA" in version.stdout else None


MPIEXEC = _hydra_mpiexec()


@pytest.mark.skipif(MPIEXEC is None, reason="needs MPICH's Hydra mpiexec (a PMI-1 launcher)")
@pytest.mark.parametrize("bootstrap,mode,marker", [
    ("pmi", "families", f"ok {family_merges()}"), ("pmi", "graph", "replays ok 1000"),
    ("mpi", "families", f"ok {family_merges()}"),
])
def test_launched_by_mpiexec_exact(bootstrap, mode, marker):
    """No torchrun, no torch.distributed: NVSHMEM's own PMI bootstrap, or the
    unique id over mpi4py; each rank checks its own ids against the oracle."""
    if bootstrap == "mpi" and importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpi4py")
    results = run_launched(MPIEXEC, [str(TESTS / "gpu_worker.py"), mode, "push", "auto", bootstrap], WORLD, 400,
                           env=SAFE_ENV)
    for r in results:
        assert r.returncode == 0 and f"rank {r.rank} {marker}" in r.output, r.output
