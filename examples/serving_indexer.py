"""A toy sparse-attention indexer layer as a serving engine runs it: each
rank holds its shard of the key cache (token g on rank g % W), scores its
decode rows by ReLU(q . k) (bf16, rows masked past each request's length),
and the exact global top-K comes from ``DcpTopkIndexer.dcp_topk_merge``
inside a compiled layer, two micro-batches in flight on two workspaces. On
GPUs each (batch size, micro-batch) step is captured in a CUDA graph once
and replayed with new queries. Every merge is checked against a top-K of
the unsharded row; rank 0 prints one line a step.

    torchrun --nproc-per-node 2 examples/serving_indexer.py          # CPU processes (ShmGroup), or one GPU each
                                                                      # (NvshmemGroup) when there are GPUs
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import nvshmem_topk as nt

TOPK, DIM, MAX_LOCAL_LEN, BATCH_SIZES, STEPS = 256, 32, 8192, (1, 2, 4, 8), 12


def make_group():
    if not torch.cuda.is_available():
        return nt.ShmGroup.from_env()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("cpu:gloo,cuda:nccl")
    return nt.NvshmemGroup()


class IndexerLayer(torch.nn.Module):
    def __init__(self, indexer: nt.DcpTopkIndexer, local_keys: torch.Tensor, micro_batch: int) -> None:
        super().__init__()
        self.indexer, self.local_keys, self.micro_batch = indexer, local_keys, micro_batch

    def forward(self, queries, local_lengths, ids):
        scores = torch.relu(queries @ self.local_keys.T).bfloat16()  # [T, S_local]: many exact zeros
        self.indexer.dcp_topk_merge(scores, local_lengths, ids, micro_batch=self.micro_batch)
        return scores


def unsharded_topk(local_scores: torch.Tensor, local_lengths: torch.Tensor, world_size: int) -> list[set]:
    """From every rank's scores [W, T, S] and lengths [W, T]: per row, the
    global ids of the top-K by (score desc, global id asc)."""
    scores = local_scores.float().permute(1, 2, 0).reshape(local_scores.shape[1], -1)  # global id l * W + r
    valid = (torch.arange(local_scores.shape[2])[None, :, None] < local_lengths.T[:, None, :]).reshape(scores.shape)
    scores = torch.where(valid, scores, float("-inf"))
    order = scores.sort(dim=1, descending=True, stable=True).indices
    return [set(order[t, : min(TOPK, int(valid[t].sum()))].tolist()) for t in range(scores.shape[0])]


def main() -> None:
    group = make_group()
    rank, world, device = group.rank, group.world_size, group.device
    gen = torch.Generator().manual_seed(0)  # every rank builds the same global cache and queries
    keys = torch.randn(MAX_LOCAL_LEN * world, DIM, generator=gen)
    indexer = nt.DcpTopkIndexer(group, max_rows=max(BATCH_SIZES), topk=TOPK, max_local_len=MAX_LOCAL_LEN,
                                micro_batches=2)
    indexer.warmup()
    layers = [IndexerLayer(indexer, keys[rank::world].to(device), mb) for mb in range(2)]
    compiled = [torch.compile(layer, fullgraph=True, backend="inductor" if device.type == "cuda" else "aot_eager")
                for layer in layers]
    graphs = {}  # (T, micro-batch) -> (graph, static queries, static lengths, ids)
    for step in range(STEPS):
        rows, micro_batch = BATCH_SIZES[step % len(BATCH_SIZES)], step % 2
        queries = torch.randn(rows, DIM, generator=gen).to(device)
        lengths = torch.randint(TOPK // 2, MAX_LOCAL_LEN * world, (rows,), generator=gen)
        local_lengths = ((lengths - rank + world - 1) // world).int().to(device)  # tokens g < length, g % W == rank
        ids = torch.empty(rows, TOPK, dtype=torch.int32, device=device)
        if device.type == "cuda":
            key = (rows, micro_batch)
            if key not in graphs:
                static = (queries.clone(), local_lengths.clone(), ids)
                compiled[micro_batch](*static)  # compiles outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = compiled[micro_batch](*static)
                graphs[key] = (graph, static, out)
            graph, (static_q, static_len, ids), scores = graphs[key]
            static_q.copy_(queries)
            static_len.copy_(local_lengths)
            graph.replay()
        else:
            scores = compiled[micro_batch](queries, local_lengths, ids)
        every_scores = [torch.empty_like(scores) for _ in range(world)]
        every_lengths = [torch.empty_like(local_lengths) for _ in range(world)]
        every_ids = [torch.empty_like(ids) for _ in range(world)]
        dist.all_gather(every_scores, scores)
        dist.all_gather(every_lengths, local_lengths)
        dist.all_gather(every_ids, ids)
        want = unsharded_topk(torch.stack(every_scores).cpu(), torch.stack(every_lengths).cpu(), world)
        exact = all(set(r_ids[t].tolist()) - {-1} == want[t] for r_ids in every_ids for t in range(rows))
        if rank == 0:
            print(f"step {step:2d}  micro-batch {micro_batch}  T={rows}  W={world}  K={TOPK}  "
                  f"{'graph' if device.type == 'cuda' else 'eager'}  exact={exact}", flush=True)
        if not exact:
            raise SystemExit(f"rank {rank}: step {step} is not exact")
    group.barrier()
    indexer.destroy()
    group.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
