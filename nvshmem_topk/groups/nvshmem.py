"""GPU group: symmetric memory on the NVSHMEM heap, peers by load/store.

NVSHMEM is started once per process (``init_nvshmem``): over
torch.distributed under torchrun (rank 0 of the world draws a unique id,
``broadcast_object_list`` hands it to every rank), by NVSHMEM's own PMI
bootstrap under a PMI launcher (nvshmrun, MPICH's Hydra ``mpiexec``), or over
an mpi4py communicator; or it is joined when the process already runs in an
NVSHMEM job. One NVSHMEM PE is one process. A DCP group is a team of the
NVSHMEM world: the world itself or, when the DCP groups are smaller (TP = 8
with DCP = 4 gives two), one strided split per DCP group.

Allocations (``nvshmem_malloc``) are collective over the whole NVSHMEM job,
not only the team: every rank builds its workspaces at the same points, in
the same order, as serving engines do at model construction. Peer address
tables come from ``nvshmem_ptr``. A peer without an address (another node)
is reached through NVSHMEM's device library instead (``device_library=
"auto"``); ``"always"`` uses the library for every peer, so that its path
can be tested on one node; ``"never"`` makes a peer without an address an
error.

Lifetimes are explicit: ``destroy()`` frees this group's allocations and
its team (collective); ``finalize_nvshmem()`` ends NVSHMEM for the process
when this library started it. Nothing is freed from ``__del__``."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .base import SymmetricTensor

_STARTED_HERE = False
DEVICE_LIBRARY_MODES = ("auto", "always", "never")


def _nvshmem():
    try:
        import nvshmem.core
    except ImportError as err:
        raise ImportError(
            "NvshmemGroup needs nvshmem4py: pip install 'nvshmem-topk[nvshmem]' "
            "(nvshmem4py-cu13 and nvidia-nvshmem-cu13)"
        ) from err
    return nvshmem.core


def _initialised(core) -> bool:
    from cuda.pathfinder import load_nvidia_dynamic_lib

    load_nvidia_dynamic_lib("nvshmem_host")  # the status query needs the host library loaded
    return core.init_status() >= core.InitStatus.STATUS_IS_INITIALIZED


BOOTSTRAPS = ("torch", "pmi", "mpi")


def init_nvshmem(bootstrap: str = "torch") -> None:
    """Start NVSHMEM in this process, unless it already runs (an NVSHMEM job
    started elsewhere is joined). Select the CUDA device first
    (``torch.cuda.set_device(local_rank)``). Collective over the job.

    bootstrap: "torch": over torch.distributed's world (torchrun, after
    ``init_process_group``); "pmi": NVSHMEM's own PMI bootstrap, under a PMI
    launcher (nvshmrun, or MPICH's Hydra ``mpiexec``; NVSHMEM_BOOTSTRAP and
    NVSHMEM_BOOTSTRAP_PMI choose the wire protocol, PMI-1 by default);
    "mpi": over mpi4py's ``COMM_WORLD`` (rank 0's unique id by ``MPI_Bcast``,
    so any MPI that mpi4py runs on will do: NVSHMEM's own MPI bootstrap
    plugin is built for Open MPI only)."""
    global _STARTED_HERE
    if bootstrap not in BOOTSTRAPS:
        raise ValueError(f"bootstrap must be one of {BOOTSTRAPS}, got {bootstrap!r}")
    core = _nvshmem()
    if _initialised(core):
        return
    if bootstrap == "torch" and not dist.is_initialized():
        raise RuntimeError("init_nvshmem('torch') needs torch.distributed initialised (torchrun + "
                           "init_process_group); under nvshmrun / mpiexec use bootstrap='pmi' or 'mpi'")
    if not torch.cuda.is_available():
        raise RuntimeError("NVSHMEM needs a CUDA device; none is visible")
    from cuda.core import Device

    device = Device(torch.cuda.current_device())
    device.set_current()
    if bootstrap == "torch":
        rank, world = dist.get_rank(), dist.get_world_size()
        uid = [core.get_unique_id(empty=rank != 0)]
        dist.broadcast_object_list(uid, src=0)
        core.init(device=device, uid=uid[0], rank=rank, nranks=world, initializer_method="uid")
    elif bootstrap == "mpi":
        core.init(device=device, initializer_method="emulated_mpi")
    else:
        _init_from_environment(core, device)
    _STARTED_HERE = True


LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def launcher_local_rank() -> int | None:
    """This process's rank on its node as a PMI / MPI launcher tells it
    (MPICH's Hydra, Open MPI, Slurm), or None when none started it: the GPU
    to select before ``init_nvshmem("pmi")`` / ``("mpi")``."""
    for name in LOCAL_RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return None


def _init_from_environment(core, device) -> None:
    """NVSHMEM's bootstrap from its environment (NVSHMEM_BOOTSTRAP, PMI by
    default): ``nvshmemx_hostlib_init_attr`` with no flags. nvshmem4py 0.4
    has no such entry, so its own init state is set as its ``init`` sets it."""
    from cuda.pathfinder import load_nvidia_dynamic_lib
    from nvshmem import bindings
    from nvshmem.core import _internal_tracking as tracking

    load_nvidia_dynamic_lib("nvshmem_host")
    tracking._cached_device["device"] = device
    attr = bindings.InitAttr()
    attr.version = (1 << 16) + attr._data.itemsize  # NVSHMEMX_INIT_ATTR_INITIALIZER's version
    attr.mpi_comm = 0
    try:
        bindings.hostlib_init_attr(0, attr.ptr)
    except Exception as err:  # nvshmem4py raises its own error on a non-zero status
        raise RuntimeError("NVSHMEM's PMI bootstrap failed: start the processes with a PMI launcher "
                           "(nvshmrun, or MPICH's mpiexec)") from err
    tracking._is_initialized["status"] = tracking.InternalInitStatus.INITIALIZED


def finalize_nvshmem() -> None:
    """End NVSHMEM in this process if ``init_nvshmem`` started it (after
    every NvshmemGroup is destroyed). Collective over the world."""
    global _STARTED_HERE
    if _STARTED_HERE:
        _nvshmem().finalize()
        _STARTED_HERE = False


def _stream():
    return torch.cuda.current_stream()


class NvshmemGroup:
    """This process's rank of a DCP group of GPUs in one NVSHMEM job.

    Under torchrun: process_group: the DCP group's torch.distributed group
    (default: the world). Its members, as world ranks, must be evenly
    strided (consecutive ranks, or every TP-th one); each is the NVSHMEM PE
    of the same number. Started by a PMI or MPI launcher
    (``init_nvshmem("pmi")`` / ``("mpi")`` first, no torch.distributed):
    dcp_size: the DCP groups are the consecutive blocks of ``dcp_size`` PEs
    (default: the whole job). Every rank builds its own DCP group's
    NvshmemGroup at the same point (the team split is collective over the
    job). ``exchange="all_gather"`` needs the torch.distributed group to be an
    NCCL group; ``exchange="fcollect"`` uses the team. device_library:
    "auto", "always" or "never" (see the module's docstring)."""

    shares_process = False

    def __init__(self, process_group: dist.ProcessGroup | None = None, device_library: str = "auto", *,
                 dcp_size: int | None = None) -> None:
        if device_library not in DEVICE_LIBRARY_MODES:
            raise ValueError(f"device_library must be one of {DEVICE_LIBRARY_MODES}, got {device_library!r}")
        if process_group is not None and dcp_size is not None:
            raise ValueError("give the DCP group as process_group (torchrun) or as dcp_size (PMI / MPI), not both")
        core = _nvshmem()
        if not _initialised(core):
            init_nvshmem("torch")
        self._core = core
        self._pg = process_group
        self._torch = dcp_size is None and dist.is_initialized()
        if self._torch:
            pes = dist.get_world_size()
            members = dist.get_process_group_ranks(process_group) if process_group is not None \
                else list(range(pes))
        else:
            pes = core.n_pes()
            size = pes if dcp_size is None else dcp_size
            if not (isinstance(size, int) and size >= 1 and pes % size == 0):
                raise ValueError(f"dcp_size must divide the job's {pes} PEs, got {dcp_size!r}")
            first = core.my_pe() // size * size
            members = list(range(first, first + size))
        self._members = members
        self._rank = members.index(core.my_pe())
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._team = core.Teams.TEAM_WORLD if len(members) == pes else self._split_team(members, pes)
        self._tensors: list[tuple[torch.Tensor, torch.Tensor]] = []  # (this rank's view, its allocation)
        self._library_peers = self._find_library_peers(device_library)

    def _split_team(self, members: list[int], pes: int):
        """The NVSHMEM team of this DCP group: every PE calls the split of
        every DCP group, in one order, and keeps its own."""
        core = self._core
        if self._torch:
            every = [None] * pes
            dist.all_gather_object(every, members)
        else:
            every = [list(range(first, first + len(members))) for first in range(0, pes, len(members))]
        mine = None
        for group in sorted({tuple(g) for g in every}):
            stride = group[1] - group[0] if len(group) > 1 else 1
            if list(group) != list(range(group[0], group[0] + stride * len(group), stride)):
                raise ValueError(f"a DCP group's world ranks must be evenly strided, got {list(group)}")
            team = core.team_split_strided(core.Teams.TEAM_WORLD, group[0], stride, len(group),
                                           core.TeamConfig(), 0)
            if list(group) == members:
                mine = team
        return mine

    def _find_library_peers(self, mode: str) -> int:
        """Bitmask of the ranks reached through the device library: those
        without an address (by a probe allocation), or all others."""
        # Collective over the job like every allocation, so made in every mode.
        probe = self._core.tensor((1,), dtype=torch.int32)
        self._tensors.append((probe, probe))
        others = [q for q in range(self.world_size) if q != self._rank]
        if mode == "always":
            return sum(1 << q for q in others)
        mask = 0
        for q in others:
            try:
                self._core.get_peer_tensor(probe, self._members[q])
            except Exception as err:  # nvshmem_ptr gave no address
                if mode == "never":
                    raise RuntimeError(
                        f"rank {self._rank}: DCP peer {q} (PE {self._members[q]}) has no load/store address "
                        "(another node, or P2P is off) and device_library='never'"
                    ) from err
                mask |= 1 << q
        return mask

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def pes(self) -> tuple[int, ...]:
        return tuple(self._members)

    @property
    def library_peers(self) -> int:
        return self._library_peers

    @property
    def world_size(self) -> int:
        return len(self._members)

    @property
    def device(self) -> torch.device:
        return self._device

    def alloc_symmetric(self, shape: tuple[int, ...], dtype: torch.dtype) -> SymmetricTensor:
        """Collective over the NVSHMEM job: zero-filled on every rank before
        any peer can write it (a world barrier on the stream follows the fill)."""
        core = self._core
        count = 1
        for size in shape:
            count *= size
        heap = core.tensor((max(1, count),), dtype=dtype)  # NVSHMEM refuses 0 bytes (W = 1 has no rescue slots)
        local = heap[:count].view(shape)
        self._tensors.append((local, heap))
        local.zero_()
        core.barrier_all(stream=_stream())
        peers, addresses = [], []
        for q, pe in enumerate(self._members):
            if q == self._rank or (self._library_peers >> q) & 1:
                # A library peer has no view; address 0 makes any store through it fault, never land.
                peers.append(local)
                addresses.append(local.data_ptr() if q == self._rank else 0)
            else:
                peers.append(core.get_peer_tensor(heap, pe)[:count].view(shape))
                addresses.append(peers[-1].data_ptr())
        ptrs = torch.tensor(addresses, dtype=torch.int64, device=self._device)
        return SymmetricTensor(local, tuple(peers), ptrs)

    def _quiesce(self) -> None:
        """Every rank's queued work done, so that no peer still reads or
        writes what is about to be freed."""
        torch.cuda.synchronize()
        self._core.barrier_all(stream=_stream())
        torch.cuda.synchronize()

    def _free(self, locals_: list[torch.Tensor]) -> None:
        """NVSHMEM frees, newest first: collective, so in one order on every rank."""
        for local, heap in reversed(self._tensors):
            if any(local is t for t in locals_):
                self._core.free_tensor(heap)
        self._tensors = [(local, heap) for local, heap in self._tensors if not any(local is t for t in locals_)]

    def free_symmetric(self, tensors: list[SymmetricTensor]) -> None:
        held = [local for local, _ in self._tensors]
        if not all(any(t.local is local for local in held) for t in tensors):
            raise ValueError("free_symmetric: an allocation this group does not hold")
        self._quiesce()
        self._free([t.local for t in tensors])

    @property
    def exchanges(self) -> tuple[str, ...]:
        return ("push", "all_gather", "fcollect") if self._torch else ("push", "fcollect")

    def all_gather(self, tensor: torch.Tensor, timeout_s: float) -> torch.Tensor:
        """[W, *tensor.shape] by NCCL ``all_gather_into_tensor`` on the
        current stream (no host wait; NCCL's own timeout bounds it)."""
        out = torch.empty((self.world_size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(out, tensor.contiguous(), group=self._pg)
        return out

    def fcollect(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """NVSHMEM ``fcollect`` over this group's team on the current stream:
        ``dst`` [W, *src.shape] gets every rank's ``src``, by rank. Both int32,
        contiguous, and at the same offsets of symmetric allocations on every
        rank. Its wait is NVSHMEM's own: unbounded (a dead peer stalls the
        stream)."""
        from nvshmem import bindings

        if src.dtype != torch.int32 or dst.dtype != torch.int32:
            raise TypeError(f"fcollect moves int32, got {src.dtype} -> {dst.dtype}")
        if dst.numel() != self.world_size * src.numel() or not (src.is_contiguous() and dst.is_contiguous()):
            raise ValueError(f"fcollect needs contiguous dst of {self.world_size} x src, "
                             f"got {tuple(dst.shape)} and {tuple(src.shape)}")
        bindings.int32_fcollect_on_stream(self._team, dst.data_ptr(), src.data_ptr(), src.numel(),
                                          _stream().cuda_stream)

    def barrier(self) -> None:
        self._core.barrier(self._team, stream=_stream())
        torch.cuda.current_stream().synchronize()

    def gather_settings(self, settings: tuple) -> list[tuple] | None:
        """Over torch.distributed when the group has it; None otherwise."""
        if not self._torch:
            return None
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, settings, group=self._pg)
        return gathered

    def destroy(self) -> None:
        """Free this group's symmetric memory (newest first) and its team.
        Collective; call after the last merge and before finalize_nvshmem."""
        self._quiesce()
        self._free([local for local, _ in self._tensors])
        if self._team is not None and self._team != self._core.Teams.TEAM_WORLD:
            self._core.team_destroy(self._team)
        self._team = None
