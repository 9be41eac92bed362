"""DCP groups: where symmetric memory comes from and how ranks meet."""

from .base import DcpGroup, SymmetricTensor
from .shm import ShmGroup
from .simulated import SimulatedGroup, SimulatedRank

__all__ = ["DcpGroup", "ShmGroup", "SimulatedGroup", "SimulatedRank", "SymmetricTensor"]
