"""Shared inputs for the sparse-MLA tests: a filled FP8 KV cache, queries, candidate lists, lengths."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_attention import write_kv
from csf_kernels.mla.layout import HEAD_DIM, LATENT, PAGE_SIZE, RECORD_BYTES, ROPE


@dataclass
class MLAInputs:
    q: torch.Tensor
    kv_cache: torch.Tensor
    indices: torch.Tensor
    lengths: torch.Tensor
    sm_scale: float


def mla_inputs(
    gen: torch.Generator,
    *,
    rows: int,
    heads: int,
    topk: int,
    pages: int,
    lengths: list[int],
    device="cpu",
    spread=1.0,
    scale_spread=False,
) -> MLAInputs:
    """Random records in every slot, random candidates (with skips: -1 and ids past the cache), and
    queries whose logits have standard deviation about ``spread``. ``scale_spread``: a record's four
    latent groups 2**-4 apart (2**-12 from first to last) and records 2**0 to 2**-14 apart, so the group
    scales span 27 binades across a chunk."""
    slots = pages * PAGE_SIZE
    kv = torch.empty(pages, PAGE_SIZE, RECORD_BYTES, dtype=torch.uint8)
    latent = torch.randn(slots, LATENT, generator=gen) * torch.rand(slots, 1, generator=gen) * 4
    if scale_spread:
        per_group = torch.tensor([1.0, 2.0**-4, 2.0**-8, 2.0**-12]).repeat_interleave(LATENT // 4)
        per_record = torch.exp2(-torch.randint(0, 15, (slots, 1), generator=gen).float())
        latent = latent * per_group[None, :] * per_record
    rope = torch.randn(slots, ROPE, generator=gen)
    write_kv(kv, torch.arange(slots), latent, rope)
    q = (torch.randn(rows, heads, HEAD_DIM, generator=gen) * 0.43 * spread).to(torch.bfloat16)  # logit std ~ spread
    indices = torch.randint(0, slots, (rows, topk), generator=gen, dtype=torch.int32)
    skip = torch.rand(rows, topk, generator=gen) < 0.1
    indices[skip] = -1
    indices[:, 3] = slots + 5  # past the cache: skipped, never read
    return MLAInputs(
        q=q.to(device),
        kv_cache=kv.to(device),
        indices=indices.to(device),
        lengths=torch.tensor(lengths, dtype=torch.int32, device=device),
        sm_scale=1.0 / HEAD_DIM**0.5,
    )


def late_maximum_inputs(gen: torch.Generator, *, heads: int, chunks: int, device="cpu") -> MLAInputs:
    """One row whose dominant keys (for head 0) all sit in the last of ``chunks`` serial chunks, after
    large values whose keys are orthogonal to head 0's query: a split that forgets to rescale its
    accumulator when the running maximum rises keeps those early values at full weight."""
    topk = 64 * chunks
    pages = -(-topk // PAGE_SIZE)
    kv = torch.empty(pages, PAGE_SIZE, RECORD_BYTES, dtype=torch.uint8)
    q = torch.randn(1, heads, HEAD_DIM, generator=gen)
    unit = q[0, 0, :LATENT] / q[0, 0, :LATENT].norm()
    latent = torch.randn(topk, LATENT, generator=gen) * 2.0
    latent -= (latent @ unit)[:, None] * unit[None, :]  # early scores ~ 0 for head 0
    latent[-64:] = 3.0 * LATENT**0.5 * unit + 0.05 * torch.randn(64, LATENT, generator=gen)  # scores ~ 60
    write_kv(kv, torch.arange(topk), latent, torch.randn(topk, ROPE, generator=gen) * 0.05)
    return MLAInputs(
        q=q.to(torch.bfloat16).to(device),
        kv_cache=kv.to(device),
        indices=torch.arange(topk, dtype=torch.int32).view(1, topk).to(device),
        lengths=torch.tensor([topk], dtype=torch.int32, device=device),
        sm_scale=1.0 / HEAD_DIM**0.5,
    )


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def worst_group_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest relative error over the output's four 128-column latent groups, each on its own."""
    return max(rel_err(got[..., g : g + 128], want[..., g : g + 128]) for g in range(0, LATENT, 128))
