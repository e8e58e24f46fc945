"""The float32 torch reference of sparse MLA decode (what the kernels are tested against)."""

from __future__ import annotations

import torch

from csf_kernels.mla.layout import LATENT, RECORD_BYTES

from .cache import dequantize_records

__all__ = ["live_candidates", "sparse_mla_reference"]


def live_candidates(indices: torch.Tensor, lengths: torch.Tensor, num_slots: int) -> torch.Tensor:
    """bool [rows, topk]: the candidates a row attends to (inside its length, index in [0, num_slots))."""
    pos = torch.arange(indices.shape[1], device=indices.device)
    inside = pos[None, :] < lengths.long().clamp(0, indices.shape[1])[:, None]
    return inside & (indices >= 0) & (indices.long() < num_slots)


def sparse_mla_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out float32 [rows, heads, 512], lse float32 [rows, heads]).

    Scores ``sm_scale * q . k`` over the 576 dimensions; values are the 512 latent dimensions. The sink
    (per head) joins the softmax denominator only; lse covers the keys; rows without a live candidate
    give zeros and lse = -inf."""
    rows = q.shape[0]
    flat = kv_cache.reshape(-1, RECORD_BYTES)
    live = live_candidates(indices, lengths, flat.shape[0])
    safe = torch.where(live, indices.long(), 0)
    keys = dequantize_records(flat[safe.reshape(-1)]).reshape(rows, indices.shape[1], -1)
    scores = torch.einsum("rhd,rkd->rhk", q.float(), keys) * sm_scale
    scores = scores.masked_fill(~live[:, None, :], float("-inf"))
    m = scores.amax(-1)
    if attn_sink is not None:
        m = torch.maximum(m, attn_sink.float()[None, :])
    m_ref = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    p = torch.exp(scores - m_ref[..., None])
    den = p.sum(-1)
    total = den + (torch.exp(attn_sink.float()[None, :] - m_ref) if attn_sink is not None else 0.0)
    out = torch.einsum("rhk,rkd->rhd", p, keys[..., :LATENT]) / torch.where(total > 0, total, 1.0)[..., None]
    lse = torch.where(den > 0, m_ref + torch.log(torch.where(den > 0, den, 1.0)), float("-inf"))
    return out, lse
