"""Exact global top-K of sparse-attention indexer scores sharded over a
decode-context-parallel group. See docs/design.md.

``import nvshmem_topk`` needs only torch: the Triton kernels load on first
use, NVSHMEM only when an NVSHMEM group is built."""

from . import ops  # noqa: F401  (registers torch.ops.nvshmem_topk.*)
from .protocol import RowsOutput
from .api import (
    dcp_topk_exchange,
    dcp_topk_merge,
    dcp_topk_merge_rows,
    dcp_topk_pack,
    dcp_topk_pack_indices,
    dcp_topk_rescue,
    dcp_topk_select,
    init_dcp_topk_merge,
    simulate_dcp_topk_merge,
)
from .contract import assert_packed_merge_contract
from .format import default_local_topk, num_planes, packed_row_words, rescue_slots
from .groups import (DcpGroup, NvshmemGroup, ShmGroup, SimulatedGroup, SymmetricTensor, finalize_nvshmem,
                     init_nvshmem)
from .serving import DcpTopkIndexer
from .workspace import DcpTopkTimeoutError, DcpTopkWorkspace

__all__ = [
    "DcpGroup",
    "DcpTopkIndexer",
    "DcpTopkTimeoutError",
    "DcpTopkWorkspace",
    "NvshmemGroup",
    "RowsOutput",
    "ShmGroup",
    "SimulatedGroup",
    "SymmetricTensor",
    "assert_packed_merge_contract",
    "dcp_topk_exchange",
    "dcp_topk_merge",
    "dcp_topk_merge_rows",
    "dcp_topk_pack",
    "dcp_topk_pack_indices",
    "dcp_topk_rescue",
    "dcp_topk_select",
    "default_local_topk",
    "finalize_nvshmem",
    "init_dcp_topk_merge",
    "init_nvshmem",
    "num_planes",
    "packed_row_words",
    "rescue_slots",
    "simulate_dcp_topk_merge",
]
