"""The interface every DCP group implements (simulated, CPU shared memory,
NVSHMEM). The coordinator and the workspace use nothing else of a group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SymmetricTensor:
    """One symmetric allocation as seen from one rank.

    local: this rank's tensor; peers[q]: a view of rank q's tensor usable
    from this rank (peers[rank] is ``local``); peer_ptrs: int64 [W] on the
    group's device, the address of peers[q] for kernels that store through
    the peer address table."""

    local: torch.Tensor
    peers: tuple[torch.Tensor, ...]
    peer_ptrs: torch.Tensor


@runtime_checkable
class DcpGroup(Protocol):
    """One rank's handle on a DCP group of ``world_size`` ranks."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def pes(self) -> tuple[int, ...]:
        """The NVSHMEM PE of each rank (the rank itself where there is no
        NVSHMEM)."""
        ...

    @property
    def library_peers(self) -> int:
        """Bitmask of the ranks this rank reaches through NVSHMEM's device
        library instead of a load/store address (0 but for NvshmemGroup)."""
        ...

    @property
    def shares_process(self) -> bool:
        """True when all ranks live in this process (stages are then driven
        rank by rank, in protocol order, by the caller)."""
        ...

    @property
    def exchanges(self) -> tuple[str, ...]:
        """The round-1 exchanges this group can run (``EXCHANGES`` of
        ``init_dcp_topk_merge``)."""
        ...

    def alloc_symmetric(self, shape: tuple[int, ...], dtype: torch.dtype) -> SymmetricTensor:
        """Collective: every rank allocates the same shape, zero-filled."""
        ...

    def free_symmetric(self, tensors: list[SymmetricTensor]) -> None:
        """Collective: every rank frees the same allocations of this group
        (a workspace's, when it is destroyed), after the work queued on
        them; the group's other allocations stay."""
        ...

    def all_gather(self, tensor: torch.Tensor, timeout_s: float) -> torch.Tensor:
        """Collective: ``[W, *tensor.shape]``, every rank's ``tensor``;
        ``TimeoutError`` when the ranks have not all joined in time."""
        ...

    def barrier(self) -> None: ...

    def gather_settings(self, settings: tuple) -> list[tuple] | None:
        """Collective, before any allocation: every rank's ``settings`` (a
        tuple of ints and strings), by rank, as far as the group can gather
        them (the ranks before this one where they run in turn in one
        process); None where it has no host collective (NVSHMEM launched
        without torch.distributed)."""
        ...

    def destroy(self) -> None:
        """Free every symmetric allocation of this group still held."""
        ...
