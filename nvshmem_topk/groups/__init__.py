"""DCP groups: where symmetric memory comes from and how ranks meet."""

from .base import DcpGroup, SymmetricTensor
from .simulated import SimulatedGroup, SimulatedRank

__all__ = ["DcpGroup", "SimulatedGroup", "SimulatedRank", "SymmetricTensor"]
