"""Adversarial input families of docs/design.md ("Testing"), seeded; used by
the tests and by ``python -m nvshmem_topk check``.

Each case is (name, logits [W, T, S] bf16, row_ends [W, T] int32, topk,
local_topk, interleave). Data is built on the CPU from one seed, so every
caller (and every rank of a multi-process test) sees identical tensors."""

from __future__ import annotations

import math

import torch

from . import format as fmt

NAN, INF = float("nan"), float("inf")


def _full_ends(world_size: int, rows: int, width: int) -> torch.Tensor:
    return torch.full((world_size, rows), width, dtype=torch.int32)


def indexer_like_logits(shape, generator: torch.Generator) -> torch.Tensor:
    """bf16 scores of ``shape`` (rows along the last dimension) of the
    ``indexer_like`` family, on the generator's device."""
    rows = family_scores("indexer_like", math.prod(shape[:-1]), shape[-1], generator, generator.device)
    return rows.view(shape)


def special_value_case(world_size: int, rows: int, width: int, levels: int, seed: int):
    """Scores drawn from ``levels`` values of {NaN, -inf, -0, +0, 1, 2, +inf}
    (heavy ties, signed zeros, infinities) and random row ends in
    [0, width + 1]: (logits [W, T, S] bf16, row_ends [W, T] int32)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor([NAN, -INF, -0.0, 0.0, 1.0, 2.0, INF])
    values = pool[torch.randint(0, 7, (levels,), generator=gen)]
    logits = values[torch.randint(0, levels, (world_size, rows, width), generator=gen)].bfloat16()
    ends = torch.randint(0, width + 2, (world_size, rows), generator=gen, dtype=torch.int32)
    return logits, ends


def families(world_size: int, seed: int = 0, rows: int = 4, width: int = 512, topk: int = 128):
    """Yield every family at one world size (small shapes, CPU-friendly)."""
    gen = torch.Generator().manual_seed(seed * 1000 + world_size)
    w, t, s, k = world_size, rows, width, topk
    n = max(32, 32 * -(-(3 * k // (2 * w)) // 32))
    shape = (w, t, s)
    ends = _full_ends(w, t, s)

    yield "random", indexer_like_logits(shape, gen), ends, k, n, 1
    levels = torch.tensor([-1.0, 0.0, 0.5, 1.0]).bfloat16()
    yield "heavy_ties", levels[torch.randint(0, 4, shape, generator=gen)], ends, k, n, 1
    yield "all_equal", torch.ones(shape).bfloat16(), ends, k, n, 1

    # Saturate as many ranks as the slots allow: they hold every top score.
    hot = torch.randn(shape, generator=gen).bfloat16()
    for q in range(min(w, k // n)):
        hot[q] += 8.0
    yield "saturated_max", hot, ends, k, n, 1

    # Ties exactly at the boundary: a few tokens above, a sea of equal scores
    # at the K-th place; a full rank holds unsent ties with lower global ids.
    tie = torch.full(shape, 1.0).bfloat16()
    tie[:, :, : max(1, n // 4)] = 2.0
    tie[0, :, s // 2 :] = 0.5
    yield "boundary_ties", tie, ends, k, n, 1

    nan = indexer_like_logits(shape, gen)
    nan[torch.rand(shape, generator=gen) < 0.2] = NAN
    nan[:, 0] = NAN
    yield "nan_and_whole_nan_rows", nan, ends, k, n, 1

    special = torch.tensor([-INF, INF, -0.0, 0.0, 1.0, -1.0]).bfloat16()
    yield "inf_and_signed_zero", special[torch.randint(0, 6, shape, generator=gen)], ends, k, n, 1

    short = torch.randint(0, s + 1, (w, t), generator=gen, dtype=torch.int32)
    short[:, 0] = 0
    short[:, 1 % t] = 1
    short[:, 2 % t] = n // 2
    short[:, 3 % t] = s
    yield "row_ends_mixed", indexer_like_logits(shape, gen), short, k, n, 1

    few = torch.full((w, t), max(1, k // (2 * w)), dtype=torch.int32)
    yield "fewer_valid_than_k", indexer_like_logits(shape, gen), few, k, n, 1

    yield "n_ge_k", indexer_like_logits(shape, gen), ends, k, k + 32, 1
    yield "n_32", indexer_like_logits(shape, gen), ends, k, 32, 1
    yield "interleave_3", indexer_like_logits(shape, gen), short, k, n, 3
    yield "interleave_64_ties", levels[torch.randint(0, 4, shape, generator=gen)], ends, k, n, 64


# ------------------------------------------------------------ score families
# What indexers produce, for benchmarks and tests: every stage's cost must
# not depend on which of these the scores are (docs/design.md, "Speed").

SCORE_FAMILIES = ("normal", "indexer_like", "heavy_tailed", "smooth", "ramp", "few_levels", "all_equal",
                  "sorted_ascending", "sorted_descending", "mostly_neg_inf", "mostly_zeros", "nan_mixed")


def _smooth(rows: int, width: int, generator: torch.Generator, device) -> torch.Tensor:
    """AR(1) along the row, x_l = 0.99 x_(l-1) + sqrt(1 - 0.99^2) e_l, N(0, 1)
    marginals: closed form inside blocks of 256, the carry across them."""
    rho, block = 0.99, 256
    blocks = -(-width // block)
    e = torch.randn(rows, blocks, block, generator=generator, device=device, dtype=torch.float64)
    e[:, :, 1:] *= (1 - rho * rho) ** 0.5
    e[:, 1:, 0] *= (1 - rho * rho) ** 0.5
    power = rho ** torch.arange(block, device=device, dtype=torch.float64)
    x = torch.cumsum(e / power, dim=2) * power
    carry = torch.zeros(rows, device=device, dtype=torch.float64)
    for b in range(blocks):
        x[:, b] += carry[:, None] * power * rho
        carry = x[:, b, -1]
    return x.view(rows, blocks * block)[:, :width].float()


def family_scores(name: str, rows: int, width: int, generator: torch.Generator, device="cpu",
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[rows, width] scores of family ``name`` (SCORE_FAMILIES), bf16 or
    ``dtype``, token l of a row at position l (what depends on position, the
    ramp, the sorted rows and the masked tail, rises or ends with l)."""
    shape, kw = (rows, width), dict(generator=generator, device=device)
    position = torch.arange(width, device=device) / max(width, 1)
    if name == "normal":
        x = torch.randn(shape, **kw)
    elif name == "indexer_like":  # a Gaussian bulk, ~1% strong tokens, the last 64 (recent) raised
        x = torch.randn(shape, **kw) * 0.5
        x = torch.where(torch.rand(shape, **kw) < 0.01, x + 4.0, x)
        x[..., -64:] += 2.0
    elif name == "heavy_tailed":  # Cauchy
        x = torch.tan(torch.pi * (torch.rand(shape, **kw) - 0.5))
    elif name == "smooth":
        x = _smooth(rows, width, generator, device)
    elif name == "ramp":  # recent tokens score higher
        x = 4 * position + 0.5 * torch.randn(shape, **kw)
    elif name == "few_levels":
        x = torch.randint(-4, 4, shape, **kw).float()
    elif name == "all_equal":
        x = torch.ones(shape, device=device)
    elif name == "sorted_ascending":
        x = torch.randn(shape, **kw).sort(dim=1).values
    elif name == "sorted_descending":
        x = torch.randn(shape, **kw).sort(dim=1, descending=True).values
    elif name == "mostly_neg_inf":  # a masked tail
        x = torch.where(position < 1 / 16, torch.randn(shape, **kw), -INF)
    elif name == "mostly_zeros":  # ReLU-style: 0.6% positive
        x = torch.relu(torch.randn(shape, **kw) - 2.5)
    elif name == "nan_mixed":
        x = torch.randn(shape, **kw)
        x[torch.rand(shape, **kw) < 0.1] = NAN
    else:
        raise ValueError(f"unknown score family {name!r}; one of {SCORE_FAMILIES}")
    return x.to(dtype)


def sub_bf16_scores(rows: int, total: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 [rows, total] scores that bf16 cannot rank: each shares its bf16
    level (the fp32 cut to bf16) with others and differs from them in its
    low 16 bits; an eighth are copies of others (exact fp32 ties); row 0 is
    vLLM's "10 LSBits" case, every score in one bf16 level."""
    kw = dict(generator=generator, dtype=torch.int32)
    levels = torch.randn(rows, total, generator=generator).view(torch.int32) & ~0xFFFF
    x = (levels | torch.randint(0, 1 << 16, (rows, total), **kw)).view(torch.float32)
    x[0] = (0x3F800000 + torch.randint(0, 1 << 10, (total,), **kw)).view(torch.float32)
    source = torch.randint(0, total, (rows, total // 8), generator=generator)
    target = torch.randint(0, total, (rows, total // 8), generator=generator)
    return x.scatter_(1, target, x.gather(1, source))


def shard(scores: torch.Tensor, world_size: int, interleave: int = 1) -> torch.Tensor:
    """Global rows [T, W * S] -> each rank's shard [W, T, S]: global token g
    lives on rank (g // I) % W at local index (g // (I W)) I + g % I."""
    rows, total = scores.shape
    width = total // world_size
    local = torch.arange(width, device=scores.device)
    ranks = torch.arange(world_size, device=scores.device)[:, None]
    return scores[:, fmt.global_id(local, ranks, world_size, interleave)].permute(1, 0, 2).contiguous()
