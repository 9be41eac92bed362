"""Drive the merge stage by stage over a simulated group, keeping every
intermediate (packed rows, saturation states, pushed lists, ids, rows), so
two implementations can be compared bit for bit at each stage."""

from __future__ import annotations

import torch

import nvshmem_topk as nt


def drive(logits, ends, *, topk, local_topk, interleave=1, impl="reference", sorted=False,
          block_size=16, stride_rows=64, starts=None, with_ids=True, score_dtype=None):
    world, rows, width = logits.shape
    device = logits.device
    group = nt.SimulatedGroup(world, device)
    wss = [nt.init_dcp_topk_merge(g, max_rows=rows + 3, topk=topk, local_topk=local_topk,
                                  max_local_len=max(width, 1), interleave=interleave, impl=impl,
                                  score_dtype=score_dtype)
           for g in group.ranks]
    blocks = -(-width // block_size)
    gen = torch.Generator().manual_seed(1)
    table = torch.randperm(rows * blocks + 7, generator=gen)[: rows * blocks].view(rows, blocks).int()
    table = table[:, : max(1, blocks - 1)].contiguous().to(device)  # the last block is off the table
    req_id = torch.arange(rows - 1, -1, -1, dtype=torch.int32, device=device)
    state = {"ids": torch.full((world, rows, topk), -7, dtype=torch.int32, device=device),
             "table": table, "req_id": req_id, "workspaces": wss}
    outs = [nt.RowsOutput(req_id, table, block_size, stride_rows,
                          torch.full((rows, topk + 2), -7, dtype=torch.int32, device=device),
                          torch.full((rows,), -7, dtype=torch.int32, device=device)) for _ in range(world)]
    first = [None if starts is None else starts[r] for r in range(world)]

    def ids_out(r):  # without ids, only the rows output is asked (state["ids"] stays as filled)
        return state["ids"][r] if with_ids else None

    packed = [nt.dcp_topk_pack(logits[r], ends[r], local_topk=wss[r].local_topk, max_local_len=max(width, 1),
                               impl=impl, row_starts=first[r], score_dtype=score_dtype) for r in range(world)]
    state["packed"] = torch.stack(packed)
    for r, ws in enumerate(wss):
        nt.dcp_topk_exchange(packed[r], workspace=ws)
    for r, ws in enumerate(wss):
        nt.dcp_topk_select(logits[r], ends[r], workspace=ws, num_rows=rows, ids_out=ids_out(r),
                           rows=outs[r], sorted=sorted, row_starts=first[r])
    state["round1_ids"] = state["ids"].clone()
    state["sat"] = torch.stack([ws.sat[:rows].clone() for ws in wss])
    state["pushed"] = torch.stack([ws.recv.local[:rows].clone() for ws in wss])
    for r, ws in enumerate(wss):
        nt.dcp_topk_rescue(logits[r], ends[r], workspace=ws, num_rows=rows, ids_out=ids_out(r),
                           rows=outs[r], sorted=sorted)
    for ws in wss:
        ws.check()
    state["rows_out"] = torch.stack([o.rows_out for o in outs])
    state["valid_out"] = torch.stack([o.valid_out for o in outs])
    state["epochs"] = torch.stack([ws.epochs.clone() for ws in wss])
    return state


STAGES = ("packed", "round1_ids", "sat", "pushed", "ids", "rows_out", "valid_out", "epochs")
