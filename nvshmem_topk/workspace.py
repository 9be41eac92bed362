"""The per-rank state of the exact merge, built once per DCP group."""

from __future__ import annotations

import itertools

import torch

from . import format as fmt
from .groups.base import DcpGroup


_LIVE: dict[int, "DcpTopkWorkspace"] = {}
_HANDLES = itertools.count(1)


def workspace_by_handle(handle: int) -> "DcpTopkWorkspace":
    """The live workspace with this handle (the custom ops' way to name one)."""
    try:
        return _LIVE[handle]
    except KeyError:
        raise RuntimeError(f"no live DCP top-k workspace has handle {handle}; it was destroyed "
                           "or never built (init_dcp_topk_merge)") from None


def _check_same_settings(group: DcpGroup, **settings) -> None:
    """Every rank of ``group`` passed the same settings (collective, before
    any allocation); else one ValueError naming each setting that differs
    and every rank's value of it."""
    gathered = group.gather_settings(tuple(settings.values()))
    if gathered is None:
        return
    differ = [f"{name} ({', '.join(f'rank {r}: {values[i]!r}' for r, values in enumerate(gathered))})"
              for i, name in enumerate(settings) if len({values[i] for values in gathered}) > 1]
    if differ:
        raise ValueError(f"rank {group.rank}: the ranks of the DCP group built their workspaces with different "
                         f"settings: {'; '.join(differ)}; every rank must pass the same ones")


class DcpTopkTimeoutError(RuntimeError):
    """A bounded wait for a peer's flag expired (a dead, absent or desynced
    peer). The workspace refuses further merges until it is rebuilt."""


class DcpTopkWorkspace:
    """Symmetric and local buffers of one in-flight merge on one rank.

    Symmetric (allocated through the group, same shape on every rank):
      gather  int32 [2, W, max_rows, packed_row_words(N, P, score_bits)]: round-1 rows,
              by epoch parity, then by sender.
      recv    int32 [max_rows, K // N, packed_row_words(L, P, score_bits)]: pushed lists
              of saturated ranks (L = format.list_len(K), K rounded up to
              32), slot = popcount(mask & ((1 << q) - 1)).
      flags   int32 [2, W, max_rows]: [0, q, t] = epoch of q's round-1 row t,
              [1, q, t] = epoch of q's pushed list for row t.
      staging int32 [max_rows, words]: this rank's round-1 rows (the merge
              packs into it), in symmetric memory, where fcollect and
              NVSHMEM's device-library puts read them. Allocated whatever
              the exchange and the peers, because allocations are collective
              over the whole NVSHMEM job: another DCP group's ranks may have
              library peers where this group's have none.
      collect_dst int32 [W * max_rows * words]: fcollect's result (that
              exchange only).
    Local:
      epochs  int32 [max_rows]: last finished epoch of each row.
      sat     int64 [max_rows] ([max_rows, 2] with 32-bit scores): saturation
              state of each row's last select (``format.sat_word``).
      status  int32 [4]: (failed, row, rank, epoch) of an expired wait.
      scratch, arrivals, ties, selected (impl "triton"): the kernels'
              scratch (``kernels.pack.scratch_words``, ``kernels.select``).

    Use one workspace per merge that can be in flight at a time; free it with
    ``destroy()`` (collective) before the group goes away.
    """

    def __init__(
        self, group: DcpGroup, *, max_rows: int, topk: int, local_topk: int, max_local_len: int,
        interleave: int, impl: str, exchange: str, timeout_s: float, pdl: bool, score_bits: int = 16,
    ) -> None:
        _check_same_settings(group, max_rows=max_rows, topk=topk, local_topk=local_topk,
                             max_local_len=max_local_len, interleave=interleave, impl=impl, exchange=exchange,
                             score_bits=score_bits)
        self.group = group
        self.rank = group.rank
        self.world_size = group.world_size
        self.device = group.device
        self.max_rows = max_rows
        self.topk = topk
        self.local_topk = local_topk
        self.max_local_len = max_local_len
        self.planes = fmt.num_planes(max_local_len)
        self.interleave = interleave
        self.gid_bits = fmt.global_id_bits(self.world_size, interleave, max_local_len)
        self.impl = impl
        self.exchange = exchange
        self.timeout_s = timeout_s
        self.pdl = pdl  # kernels launched as programmatic dependents of the one before (GPUs)
        self.score_bits = score_bits  # 16: bf16 or fp16 order (fp32 rounded to bf16); 32: fp32 order
        self.row_words = fmt.packed_row_words(local_topk, self.planes, score_bits)
        self.list_len = fmt.list_len(topk)
        self.push_words = fmt.packed_row_words(self.list_len, self.planes, score_bits)
        self.slots = fmt.rescue_slots(topk, local_topk)
        w = self.world_size
        self.gather = group.alloc_symmetric((2, w, max_rows, self.row_words), torch.int32)
        self.recv = group.alloc_symmetric((max_rows, self.slots, self.push_words), torch.int32)
        self.flags = group.alloc_symmetric((2, w, max_rows), torch.int32)
        self.library_peers = group.library_peers
        self.pes = torch.tensor(group.pes, dtype=torch.int32, device=self.device)
        self.staging = group.alloc_symmetric((max_rows, self.row_words), torch.int32)
        self.collect_dst = None
        if exchange == "fcollect":
            self.collect_dst = group.alloc_symmetric((w * max_rows * self.row_words,), torch.int32)
        if impl == "triton":  # the kernels' scratch, so that no merge allocates
            from .kernels import keys, pack, select

            words = max(pack.scratch_words(n, max_local_len, score_bits) for n in (local_topk, self.list_len))
            self.scratch = torch.empty((max_rows, words), dtype=torch.int32, device=self.device)
            self.arrivals = torch.zeros(max_rows, dtype=torch.int32, device=self.device)  # left as found
            self.ties = torch.empty((max_rows, keys.TIE_TILE), dtype=torch.int64, device=self.device)
            self.selected = torch.empty((max_rows, select.rescue_keys(topk)), dtype=torch.int64, device=self.device)
        self.epochs = torch.zeros(max_rows, dtype=torch.int32, device=self.device)
        none = torch.zeros(max_rows, dtype=torch.int64, device=self.device)
        self.sat = fmt.sat_word(none, none, score_bits)
        # Host memory the kernels can write (mapped pinned memory on CUDA), so
        # the coordinator can look at it without a device synchronisation.
        self.status = torch.zeros(4, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        self.destroyed = False
        self.handle = next(_HANDLES)
        _LIVE[self.handle] = self

    def record_timeout(self, row: int, rank: int, epoch: int) -> None:
        self.status.copy_(torch.tensor([1, row, rank, epoch], dtype=torch.int32))

    def check(self) -> None:
        """Raise if this workspace cannot run a merge (destroyed, or a wait
        of an earlier merge expired)."""
        if self.destroyed:
            raise RuntimeError("this DCP top-k workspace was destroyed; call init_dcp_topk_merge")
        failed, row, rank, epoch = self.status.tolist()  # one host read, no device sync
        if failed and rank < 0:
            raise DcpTopkTimeoutError(
                f"rank {self.rank}: the round-1 all-gather failed or did not complete within "
                f"{self.timeout_s} s; a peer is dead, absent or out of step. Rebuild the "
                "workspace (and the process group) with init_dcp_topk_merge on every rank."
            )
        if failed:
            raise DcpTopkTimeoutError(
                f"rank {self.rank}: waited more than {self.timeout_s} s for rank {rank}'s "
                f"flag of row {row}, epoch {epoch}; the peer is dead, absent or out of step. "
                "This workspace's epochs can no longer be trusted: rebuild it with "
                "init_dcp_topk_merge on every rank."
            )

    def destroy(self) -> None:
        """Release this workspace: its symmetric memory back to the group
        (collective: every rank destroys its workspaces in one order), its
        other buffers to torch. After an expired wait the ranks are out of
        step and a collective could wait for a dead peer: the symmetric
        memory then stays with the group (freed by ``group.destroy()``). A
        second call does nothing."""
        if self.destroyed:
            return
        self.destroyed = True
        held = [t for t in (self.gather, self.recv, self.flags, self.staging, self.collect_dst) if t is not None]
        self.gather = self.recv = self.flags = self.staging = self.collect_dst = None
        _LIVE.pop(self.handle, None)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a wait still running may yet expire
        if not self.status[0]:
            self.group.free_symmetric(held)
