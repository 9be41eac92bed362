"""CPU multi-process group: a symmetric heap of POSIX shared memory.

Each rank creates one segment per symmetric allocation; every process maps
every rank's segment, so the peer address table holds this process's
mapping of each rank's memory (what nvshmem_ptr gives on GPUs). Ranks meet
over torch.distributed (gloo, e.g. under torchrun).

No segment outlives the group's setup: once every rank has mapped an
allocation, its names are unlinked from /dev/shm and only the mappings keep
the memory, which the kernel frees when the last process unmaps or dies. A
failure during setup unlinks every name of that allocation.

Stores become visible to the other processes in program order on x86 (TSO),
which the reference's flag protocol relies on; the Triton interpreter's
atomics do the same."""

from __future__ import annotations

import datetime
import mmap
import os
import secrets

import torch
import torch.distributed as dist

from .base import SymmetricTensor

_SHM_DIR = "/dev/shm"
_PREFIX = "nvshmem_topk-"


def _segment_path(job: str, rank: int, index: int) -> str:
    return os.path.join(_SHM_DIR, f"{_PREFIX}{job}-{index}-r{rank}")


def _map(path: str, size: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class ShmGroup:
    """This process's rank of a DCP group of CPU processes.

    process_group: a gloo process group (default: the default group, which
    torchrun's environment initialises via ``ShmGroup.from_env()``)."""

    shares_process = False
    exchanges = ("push", "all_gather")

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShmGroup needs torch.distributed initialised (see ShmGroup.from_env)")
        self._pg = process_group
        self._rank = dist.get_rank(process_group)
        self._world_size = dist.get_world_size(process_group)
        token = [secrets.token_hex(6) if self._rank == 0 else None]
        dist.broadcast_object_list(token, src=dist.get_global_rank(process_group, 0)
                                   if process_group is not None else 0, group=process_group)
        self._job = token[0]
        self._mappings: list[list[mmap.mmap]] = []
        self._tensors: list[SymmetricTensor] = []
        self._allocated = 0

    @classmethod
    def from_env(cls, timeout_s: float = 60.0) -> "ShmGroup":
        """Initialise gloo from torchrun's environment (RANK, WORLD_SIZE,
        MASTER_ADDR, MASTER_PORT) when needed, and return the world group."""
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
        return cls()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    pes = property(lambda self: tuple(range(self._world_size)))
    library_peers = 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def alloc_symmetric(self, shape: tuple[int, ...], dtype: torch.dtype) -> SymmetricTensor:
        index = self._allocated  # never reused: a rank may still be unlinking an earlier name
        self._allocated += 1
        count = 1
        for s in shape:
            count *= s
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        size = max(1, nbytes)
        paths = [_segment_path(self._job, r, index) for r in range(self._world_size)]
        maps: list[mmap.mmap] = []
        try:
            own = _map(paths[self._rank], size, create=True)
            self.barrier()
            maps = [own if r == self._rank else _map(paths[r], size, create=False)
                    for r in range(self._world_size)]
            self.barrier()
        finally:
            for path in paths:
                _unlink(path)
        views = tuple(torch.frombuffer(m, dtype=torch.uint8)[:nbytes].view(dtype).view(shape) for m in maps)
        ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64)
        self._mappings.append(maps)
        tensor = SymmetricTensor(views[self._rank], views, ptrs)
        self._tensors.append(tensor)
        return tensor

    def free_symmetric(self, tensors: list[SymmetricTensor]) -> None:
        """Drops this process's mappings of them: each segment is unmapped
        once the last view of it is gone, here and on every rank (the names
        are long gone), so no barrier is needed."""
        keep = [i for i, t in enumerate(self._tensors) if not any(t is f for f in tensors)]
        if len(self._tensors) - len(keep) != len(tensors):
            raise ValueError("free_symmetric: an allocation this group does not hold")
        self._tensors = [self._tensors[i] for i in keep]
        self._mappings = [self._mappings[i] for i in keep]

    def all_gather(self, tensor: torch.Tensor, timeout_s: float) -> torch.Tensor:
        """[W, *tensor.shape]: every rank's ``tensor`` (gloo); raises
        ``TimeoutError`` when a rank has not joined within ``timeout_s``."""
        parts = [torch.empty_like(tensor) for _ in range(self._world_size)]
        work = dist.all_gather(parts, tensor.contiguous(), group=self._pg, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            raise TimeoutError(f"all-gather incomplete after {timeout_s} s: {err}") from err
        return torch.stack(parts)

    def barrier(self) -> None:
        dist.barrier(group=self._pg)

    def gather_settings(self, settings: tuple) -> list[tuple]:
        gathered = [None] * self._world_size
        dist.all_gather_object(gathered, settings, group=self._pg)
        return gathered

    def destroy(self) -> None:
        """Drop this process's mappings (the names are long gone)."""
        self._tensors.clear()
        self._mappings.clear()
