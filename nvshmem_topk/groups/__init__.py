"""DCP groups: where symmetric memory comes from and how ranks meet."""

from .base import DcpGroup, SymmetricTensor
from .nvshmem import NvshmemGroup, finalize_nvshmem, init_nvshmem
from .shm import ShmGroup
from .simulated import SimulatedGroup, SimulatedRank

__all__ = ["DcpGroup", "NvshmemGroup", "ShmGroup", "SimulatedGroup", "SimulatedRank", "SymmetricTensor",
           "finalize_nvshmem", "init_nvshmem"]
