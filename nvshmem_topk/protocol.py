"""The merge's protocol, written once (docs/design.md, "Protocol"): the
epoch and buffer-parity rule, the stages of each implementation, the
round-1 exchanges and the stage sequence.

Epochs: a workspace keeps each row's last finished epoch; a call merges the
row at the next one. Round-1 rows land in the gather buffer half of that
epoch's parity, so that a fast peer's next merge never overwrites rows a
slow rank still reads, and a flag counts as raised once it is >= the epoch
(a peer may already be one ahead). The kernels' side of the rule is
``kernels/exchange.py`` (``call_epoch``, ``gather_slot``).

The reference stages drive ``reference`` through peer tensor views; the
Triton stages drive ``nvshmem_topk.kernels`` through peer address tables."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from . import format as fmt
from . import reference
from .workspace import DcpTopkWorkspace


@dataclass(frozen=True)
class RowsOutput:
    """Where the merge writes this rank's physical KV rows.

    req_id: int32 [>= T], the request of each row; block_table: int32
    [R, M] (stride(1) == 1); token l maps to
    ``block_table[req_id[t], l // block_size] * stride_rows + l % block_size``.
    rows_out: int32 [T, >= K], the first K columns are written: owned rows
    compacted to the front, -1 after. valid_out: int32 [T], their count."""

    req_id: torch.Tensor
    block_table: torch.Tensor
    block_size: int
    stride_rows: int
    rows_out: torch.Tensor
    valid_out: torch.Tensor


@dataclass(frozen=True)
class Outputs:
    ids: torch.Tensor | None
    rows: RowsOutput | None
    sorted: bool


# ------------------------------------------------------------------ epochs


def call_epochs(ws: DcpTopkWorkspace, rows: int) -> torch.Tensor:
    """int32 [rows]: the epoch this call merges each row at."""
    return ws.epochs[:rows] + 1


def parity(epochs: torch.Tensor) -> torch.Tensor:
    """The gather buffer half (int64, for indexing) of each row's epoch."""
    return (epochs & 1).long()


def gathered(ws: DcpTopkWorkspace, epochs: torch.Tensor) -> torch.Tensor:
    """This epoch's round-1 rows [W, T, words] from the local gather buffer."""
    rows = torch.arange(epochs.shape[0], device=ws.device)
    senders = torch.arange(ws.world_size, device=ws.device)[:, None]
    return ws.gather.local[parity(epochs)[None, :], senders, rows[None, :]]


# ----------------------------------------------------------------- stages


IMPLS = ("reference", "triton")
EXCHANGES = ("push", "all_gather", "fcollect")  # how round-1 rows travel (``exchange``)


def resolve_impl(impl: str | None, device: torch.device) -> str:
    """The implementation to run on ``device``: ``impl``, or by default the
    Triton kernels on CUDA and the reference on CPU. Raises when the one
    named cannot run here; never substitutes another."""
    if impl is None:
        return "triton" if device.type == "cuda" else "reference"
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "impl='triton' on a CPU tensor needs the Triton interpreter: set "
            "TRITON_INTERPRET=1 before importing nvshmem_topk (or use impl='reference')"
        )
    return impl


def backend(impl: str):
    return ReferenceBackend() if impl == "reference" else TritonBackend()


class ReferenceBackend:
    """The protocol in eager torch (host-side bounded waits; syncs freely)."""

    @staticmethod
    def compiled_widths(max_local_len: int) -> tuple[int, ...]:
        """Row widths whose merges compile every variant: none to compile."""
        return (max_local_len,)

    @staticmethod
    def merges_locally(ws: DcpTopkWorkspace, width: int) -> bool:
        """The reference runs every merge as its stages."""
        return False

    @staticmethod
    def pack(logits, row_ends, out, *, local_topk, max_local_len, row_starts=None, pdl=False,  # pdl: no kernels
             score_bits=16):
        out.copy_(reference.pack(logits, row_ends, local_topk, max_local_len, row_starts, score_bits=score_bits))

    @staticmethod
    def pack_indices(logits, local_idx, row_ends, out, *, max_local_len, row_starts=None, pdl=False, score_bits=16):
        out.copy_(reference.pack_indices(logits, local_idx, row_ends, max_local_len, row_starts, score_bits))

    @staticmethod
    def push_rows(ws: DcpTopkWorkspace, packed: torch.Tensor) -> None:
        rows = packed.shape[0]
        epochs = call_epochs(ws, rows)
        index = torch.arange(rows, device=ws.device)
        for peer_gather, peer_flags in zip(ws.gather.peers, ws.flags.peers):
            peer_gather[parity(epochs), ws.rank, index] = packed
            peer_flags[0, ws.rank, :rows] = epochs

    @classmethod
    def pack_and_push(cls, ws: DcpTopkWorkspace, logits, row_ends, out, row_starts=None) -> None:
        cls.pack(logits, row_ends, out, local_topk=ws.local_topk, max_local_len=ws.max_local_len,
                 row_starts=row_starts, score_bits=ws.score_bits)
        cls.push_rows(ws, out)

    @staticmethod
    def select(ws: DcpTopkWorkspace, logits, row_ends, rows: int, out: Outputs, row_starts=None) -> None:
        epochs = call_epochs(ws, rows)
        need = torch.ones((ws.world_size, rows), dtype=torch.bool, device=ws.device)
        missing = reference.wait_flags(ws.flags.local[0, :, :rows], need, epochs, ws.timeout_s)
        if missing:
            ws.record_timeout(*missing)
            return
        selected, sat = reference.select(
            gathered(ws, epochs), topk=ws.topk, local_topk=ws.local_topk,
            world_size=ws.world_size, interleave=ws.interleave, max_local_len=ws.max_local_len,
            score_bits=ws.score_bits,
        )
        ws.sat[:rows] = sat
        _emit(ws, selected, torch.arange(rows, device=ws.device), out)
        mask = fmt.sat_mask(sat, ws.score_bits)
        mine = ((mask >> ws.rank) & 1).nonzero().flatten()
        if mine.numel():
            starts = None if row_starts is None else row_starts[mine]
            pushed = reference.pack(logits[mine], row_ends[mine], ws.list_len, ws.max_local_len, starts,
                                    fmt.list_floor(sat[mine], ws.gid_bits, ws.score_bits), ws.score_bits)
            slot = reference.rescue_slot(mask[mine], ws.rank)
            for peer_recv, peer_flags in zip(ws.recv.peers, ws.flags.peers):
                peer_recv[mine, slot] = pushed
                peer_flags[1, ws.rank, mine] = epochs[mine]

    @staticmethod
    def rescue(ws: DcpTopkWorkspace, logits, row_ends, rows: int, out: Outputs) -> None:
        epochs = call_epochs(ws, rows)
        sat = ws.sat[:rows]
        mask = fmt.sat_mask(sat, ws.score_bits)
        ranks = torch.arange(ws.world_size, device=ws.device)[:, None]
        need = ((mask[None, :] >> ranks) & 1).bool()
        missing = reference.wait_flags(ws.flags.local[1, :, :rows], need, epochs, ws.timeout_s)
        if missing:
            ws.record_timeout(*missing)
            return
        todo = (mask != 0).nonzero().flatten()
        if todo.numel():
            selected = reference.rescue(
                gathered(ws, epochs)[:, todo], sat[todo], ws.recv.local[todo], topk=ws.topk,
                local_topk=ws.local_topk, world_size=ws.world_size, interleave=ws.interleave,
                max_local_len=ws.max_local_len, score_bits=ws.score_bits,
            )
            _emit(ws, selected, todo, out)
        ws.epochs[:rows] = epochs


def _emit(ws: DcpTopkWorkspace, selected: torch.Tensor, rows: torch.Tensor, out: Outputs) -> None:
    ids = reference.ids_from_keys(selected, ws.gid_bits, out.sorted)
    if out.ids is not None:
        out.ids[rows] = ids
    if out.rows is not None:
        spec = out.rows
        owned, count = reference.owned_rows(
            ids, rank=ws.rank, world_size=ws.world_size, interleave=ws.interleave,
            req_id=spec.req_id[rows], block_table=spec.block_table, block_size=spec.block_size,
            stride_rows=spec.stride_rows,
        )
        spec.rows_out[rows, : ws.topk] = owned
        spec.valid_out[rows] = count


# Waits are bounded by a poll count: one poll is about a microsecond on a GPU
# (a system-scope atomic round trip) and 0.25 to 0.9 ms under the interpreter
# (2-core machines, from one day to the next), so timeout_s holds roughly on
# both, within a factor of two under the interpreter.
SPINS_PER_SECOND = {"cuda": 1_000_000, "cpu": 2_000}


class TritonBackend:
    """The protocol in Triton kernels: no host synchronisation, peers reached
    through the workspace's address tables."""

    @staticmethod
    def compiled_widths(max_local_len: int) -> tuple[int, ...]:
        """Row widths whose merges compile every pack variant: the widest
        row of each of the pack's width classes."""
        from .kernels import pack

        return tuple(dict.fromkeys((min(pack.SHORT_ROWS, max_local_len), max_local_len)))

    @staticmethod
    def pack(logits, row_ends, out, *, local_topk, max_local_len, row_starts=None, pdl=False, score_bits=16):
        from .kernels import pack

        pack.pack(out, logits, row_starts, row_ends, local_topk=local_topk,
                  max_local_len=max_local_len, pdl=pdl, score_bits=score_bits)

    @staticmethod
    def pack_indices(logits, local_idx, row_ends, out, *, max_local_len, row_starts=None, pdl=False, score_bits=16):
        from .kernels import pack

        pack.pack_indices(out, logits, local_idx, row_starts, row_ends, max_local_len=max_local_len, pdl=pdl,
                          score_bits=score_bits)

    @staticmethod
    def push_rows(ws: DcpTopkWorkspace, packed: torch.Tensor) -> None:
        from .kernels import exchange

        exchange.push_rows(packed, ws.epochs, ws.gather.peer_ptrs, ws.flags.peer_ptrs, ws.pes,
                           max_rows=ws.max_rows, rank=ws.rank, world_size=ws.world_size,
                           library_peers=ws.library_peers, pdl=ws.pdl)

    @staticmethod
    def pack_and_push(ws: DcpTopkWorkspace, logits, row_ends, out, row_starts=None) -> None:
        """The pack that also pushes each finished row to every peer (all of
        them reached by address) and raises its flags: no push kernel."""
        from .kernels import pack

        push = pack.Publish(ws.epochs, ws.gather.peer_ptrs, ws.flags.peer_ptrs, ws.pes, ws.max_rows, ws.rank,
                            ws.world_size)
        pack.pack(out, logits, row_starts, row_ends, local_topk=ws.local_topk, max_local_len=ws.max_local_len,
                  push=push, scratch=(ws.scratch, ws.arrivals), pdl=ws.pdl, score_bits=ws.score_bits)

    @staticmethod
    def merges_locally(ws: DcpTopkWorkspace, width: int) -> bool:
        """Whether a merge of calls ``width`` tokens wide is ``local_merge``:
        a one-rank group's short rows in 16-bit order."""
        from .kernels import local

        return local.merges_locally(ws.world_size, ws.score_bits, width, ws.max_local_len)

    @classmethod
    def local_merge(cls, ws: DcpTopkWorkspace, logits, row_ends, rows: int, out: Outputs, row_starts=None) -> None:
        """A one-rank group's merge in one kernel (``kernels/local.py``):
        the outputs of the pack, select and rescue, bit for bit; no epoch
        or flag is touched (nothing is exchanged)."""
        from .kernels import local, select

        if rows:
            local.local_merge_launch(logits=logits[:rows], row_starts=row_starts, row_ends=row_ends[:rows],
                                     ids=out.ids, rows=out.rows, sorted=out.sorted, selected=ws.selected,
                                     topk=ws.topk, max_local_len=ws.max_local_len, gid_bits=ws.gid_bits,
                                     pdl=ws.pdl)()
            if out.sorted:
                select.order_launch(**cls._common(ws, rows, out), rescued_only=False)()

    @staticmethod
    def _common(ws: DcpTopkWorkspace, rows: int, out: Outputs) -> dict:
        return dict(num_rows=rows, ids=out.ids, rows=out.rows, sorted=out.sorted, sat=ws.sat,
                    status=ws.status, gather=ws.gather.local, flags=ws.flags.local, epochs=ws.epochs,
                    ties=ws.ties, selected=ws.selected, max_rows=ws.max_rows, rank=ws.rank,
                    world_size=ws.world_size, topk=ws.topk, local_topk=ws.local_topk, planes=ws.planes,
                    interleave=ws.interleave, gid_bits=ws.gid_bits,
                    max_spins=max(1, int(ws.timeout_s * SPINS_PER_SECOND[ws.device.type])), pdl=ws.pdl,
                    score_bits=ws.score_bits)

    @classmethod
    def select(cls, ws: DcpTopkWorkspace, logits, row_ends, rows: int, out: Outputs, row_starts=None) -> None:
        """The select, and on the rows where this rank is saturated its list
        (``format.list_floor``) into its receive slot on every rank, and the
        rescue flags raised: built by the select itself on rows of at most
        ``pack.SHORT_ROWS`` tokens, else spread over the row's blocks like
        the pack, after it."""
        from .kernels import pack, select

        common = cls._common(ws, rows, out)
        if not (ws.slots and rows):
            select.select(**common)
            return
        push = pack.Publish(ws.epochs, ws.recv.peer_ptrs, ws.flags.peer_ptrs, ws.pes, ws.max_rows, ws.rank,
                            ws.world_size, sat=ws.sat, list_slots=ws.slots, gid_bits=ws.gid_bits,
                            library_peers=ws.library_peers)
        starts = row_starts[:rows] if row_starts is not None else None
        if min(logits.shape[1], ws.max_local_len) <= pack.SHORT_ROWS:
            select.select(**common, lists=select.ShortLists(logits[:rows], starts, row_ends[:rows], ws.recv.local,
                                                            push, ws.max_local_len))
            return
        select.select(**common)
        pack.select_local(ws.recv.local, logits[:rows], starts, row_ends[:rows], n=ws.list_len,
                          max_local_len=ws.max_local_len, scratch=ws.scratch, arrivals=ws.arrivals,
                          publish=push, pdl=ws.pdl, score_bits=ws.score_bits)

    @classmethod
    def rescue(cls, ws: DcpTopkWorkspace, logits, row_ends, rows: int, out: Outputs) -> None:
        from .kernels import select

        select.rescue(**cls._common(ws, rows, out), recv=ws.recv.local)


# ------------------------------------------------------------- sequence


def _collected(ws: DcpTopkWorkspace, packed: torch.Tensor) -> torch.Tensor:
    """Every rank's rows [W, T, words] by a collective: NVSHMEM fcollect
    (into symmetric memory) or the group's all-gather (bounded)."""
    if ws.exchange == "fcollect":
        gathered_rows = ws.collect_dst.local[: ws.world_size * packed.numel()]
        gathered_rows = gathered_rows.view(ws.world_size, *packed.shape)
        ws.group.fcollect(gathered_rows, packed)
        return gathered_rows
    try:
        return ws.group.all_gather(packed, ws.timeout_s)
    except TimeoutError:
        ws.record_timeout(0, -1, -1)
        ws.check()
        raise


def exchange(ws: DcpTopkWorkspace, packed: torch.Tensor) -> None:
    """Round-1 rows of every rank into this rank's gather buffer (this
    epoch's parity) and their flags raised: pushed by this rank to every
    peer, or gathered by a collective and copied in."""
    rows = packed.shape[0]
    if ws.exchange == "fcollect" or ws.library_peers:  # they read symmetric memory
        staged = ws.staging.local[:rows]
        if packed.data_ptr() != staged.data_ptr():
            staged.copy_(packed)
        packed = staged
    if ws.exchange == "push":
        backend(ws.impl).push_rows(ws, packed)
        return
    epochs = call_epochs(ws, rows)
    ws.gather.local[parity(epochs), :, torch.arange(rows, device=ws.device)] = _collected(ws, packed).transpose(0, 1)
    ws.flags.local[0, :, :rows] = epochs


def run_merge(workspaces: list[DcpTopkWorkspace], logits, row_ends, outputs: list[Outputs], rows: int,
              packed=None, row_starts=None) -> None:
    """pack -> exchange -> select -> rescue of ``rows`` rows, each stage for
    every rank given before the next stage starts (one rank on a real group;
    all virtual ranks on a simulated one), or a one-rank group's
    ``local_merge`` where its backend takes one. ``packed``: per rank,
    round-1 rows that replace the pack, or None; ``row_starts``: per rank,
    or None (every row starts at 0)."""
    impls = [backend(ws.impl) for ws in workspaces]
    starts = row_starts if row_starts is not None else [None] * len(workspaces)
    if packed is None and len(workspaces) == 1 and impls[0].merges_locally(workspaces[0], logits[0].shape[-1]):
        first = starts[0][:rows] if starts[0] is not None else None
        impls[0].local_merge(workspaces[0], logits[0], row_ends[0], rows, outputs[0], first)
        workspaces[0].check()
        return
    for r, (ws, impl) in enumerate(zip(workspaces, impls)):
        mine = packed[r] if packed is not None else None
        first = starts[r][:rows] if starts[r] is not None else None
        if mine is None:  # fcollect and device-library puts read symmetric memory: pack straight into it
            mine = ws.staging.local[:rows]
            if ws.exchange == "push" and not ws.library_peers:  # the pack pushes its rows itself
                impl.pack_and_push(ws, logits[r][:rows], row_ends[r][:rows], mine, first)
                continue
            impl.pack(logits[r][:rows], row_ends[r][:rows], mine, local_topk=ws.local_topk,
                      max_local_len=ws.max_local_len, row_starts=first, pdl=ws.pdl, score_bits=ws.score_bits)
        exchange(ws, mine)
    for r, (ws, impl) in enumerate(zip(workspaces, impls)):
        impl.select(ws, logits[r], row_ends[r], rows, outputs[r], starts[r])
    for r, (ws, impl) in enumerate(zip(workspaces, impls)):
        impl.rescue(ws, logits[r], row_ends[r], rows, outputs[r])
    for ws in workspaces:
        ws.check()
