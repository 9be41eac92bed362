"""W virtual ranks in one process, on any device (CPU included).

Each virtual rank has its own symmetric tensors, as on a real group; the
peer address table holds the other ranks' real addresses, so the Triton
kernels store into peers exactly as they do over NVLink."""

from __future__ import annotations

import torch

from .base import SymmetricTensor


class SimulatedGroup:
    """Owner of the virtual ranks' memory. ``group.ranks[r]`` is rank r's
    handle (a ``DcpGroup``)."""

    def __init__(self, world_size: int, device: torch.device | str = "cpu") -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.world_size = world_size
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._allocations: list[list[torch.Tensor] | None] = []  # None once every rank freed it
        self._frees: list[int] = []
        self._settings: list[list[tuple]] = []  # per workspace built, each rank's settings so far
        self.ranks = tuple(SimulatedRank(self, r) for r in range(world_size))

    def _allocation(self, index: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
        if index == len(self._allocations):
            self._allocations.append(
                [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(self.world_size)]
            )
            self._frees.append(0)
        tensors = self._allocations[index]
        if tensors[0].shape != torch.Size(shape) or tensors[0].dtype != dtype:
            raise ValueError(
                f"symmetric allocation {index} differs between ranks: "
                f"{tuple(tensors[0].shape)} {tensors[0].dtype} vs {tuple(shape)} {dtype}"
            )
        return tensors

    def _gather_settings(self, index: int, settings: tuple) -> list[tuple]:
        if index == len(self._settings):
            self._settings.append([])
        self._settings[index].append(settings)
        return list(self._settings[index])

    def _free(self, tensor: torch.Tensor, rank: int) -> None:
        index = next((i for i, ts in enumerate(self._allocations) if ts is not None and ts[rank] is tensor), None)
        if index is None:
            raise ValueError("free_symmetric: an allocation this group does not hold")
        self._frees[index] += 1
        if self._frees[index] == self.world_size:  # the last rank to free it
            self._allocations[index] = None

    def destroy(self) -> None:
        self._allocations.clear()
        self._frees.clear()


class SimulatedRank:
    """Rank ``rank`` of a ``SimulatedGroup``."""

    shares_process = True
    exchanges = ("push",)

    def __init__(self, owner: SimulatedGroup, rank: int) -> None:
        self._owner = owner
        self._rank = rank
        self._next_allocation = 0
        self._next_settings = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._owner.world_size

    pes = property(lambda self: tuple(range(self._owner.world_size)))
    library_peers = 0

    @property
    def device(self) -> torch.device:
        return self._owner.device

    @property
    def owner(self) -> SimulatedGroup:
        return self._owner

    def alloc_symmetric(self, shape: tuple[int, ...], dtype: torch.dtype) -> SymmetricTensor:
        tensors = self._owner._allocation(self._next_allocation, tuple(shape), dtype)
        self._next_allocation += 1
        ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=self.device)
        return SymmetricTensor(tensors[self._rank], tuple(tensors), ptrs)

    def free_symmetric(self, tensors: list[SymmetricTensor]) -> None:
        """Each allocation goes once every virtual rank has freed it."""
        for tensor in tensors:
            self._owner._free(tensor.local, self._rank)

    def all_gather(self, tensor: torch.Tensor, timeout_s: float) -> torch.Tensor:
        raise ValueError(
            "a simulated group's ranks run one after another in one process and cannot meet "
            "in a collective; use exchange='push'"
        )

    def barrier(self) -> None:
        """Virtual ranks run in program order: nothing to wait for."""

    def gather_settings(self, settings: tuple) -> list[tuple]:
        """The settings of this rank and of the ranks built before it."""
        self._next_settings += 1
        return self._owner._gather_settings(self._next_settings - 1, settings)

    def destroy(self) -> None:
        self._owner.destroy()
