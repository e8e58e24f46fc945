"""The FP8 KV cache of sparse MLA: quantize and pack new tokens into records, read them back.

A record (``csf_kernels.mla.layout``) holds a token's 512 latent values as E4M3 in four groups of 128,
each group scaled by a power of two (``2**ceil(log2(max(absmax, 1e-4) / 448))``, so the group's largest
value lands at or below 448, E4M3's largest), then the four float32 scales and the 64 rope values in
bf16. The exponent comes from the absmax's bits (no logarithm), exactly as the decode kernel quantizes a
query in-kernel, so a packed query (``pack_query``) and an in-kernel quantized one give the same bits.
Pure torch: runs on the CPU or the GPU.
"""

from __future__ import annotations

import torch

from csf_kernels.mla.layout import GROUP, GROUPS, HEAD_DIM, LATENT, RECORD_BYTES, ROPE, ROPE_OFFSET, SCALE_OFFSET

__all__ = ["E4M3_MAX", "dequantize_records", "group_scales", "pack_query", "quantize_records", "read_kv", "write_kv"]

E4M3_MAX = 448.0
_SCALE_FLOOR = 1e-4  # an all-zero group still gets a finite scale


def group_scales(amax: torch.Tensor) -> torch.Tensor:
    """float32 2**e, the smallest power of two with ``max(amax, 1e-4) / 2**e <= 448``: from frexp's
    exponent and mantissa (448 = 0.875 * 2**9), no rounding anywhere."""
    m, e = torch.frexp(amax.float().clamp_min(_SCALE_FLOOR))
    return torch.ldexp(torch.ones_like(m), e - 9 + (m > 0.875).to(e.dtype))


def quantize_records(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 656] records of ``latent`` [N, 512] and ``rope`` [N, 64] (any float dtype)."""
    if latent.dim() != 2 or latent.shape[1] != LATENT or rope.shape != (latent.shape[0], ROPE):
        raise ValueError(f"latent must be [N, {LATENT}] and rope [N, {ROPE}], got {tuple(latent.shape)} and "
                         f"{tuple(rope.shape)}")  # fmt: skip
    n = latent.shape[0]
    groups = latent.float().reshape(n, GROUPS, GROUP)
    scale = group_scales(groups.abs().amax(-1))
    codes = (groups / scale[..., None]).to(torch.float8_e4m3fn)  # exact division: a power of two
    records = torch.empty(n, RECORD_BYTES, dtype=torch.uint8, device=latent.device)
    records[:, :SCALE_OFFSET] = codes.reshape(n, LATENT).view(torch.uint8)
    records[:, SCALE_OFFSET:ROPE_OFFSET] = scale.contiguous().view(torch.uint8).reshape(n, 4 * GROUPS)
    records[:, ROPE_OFFSET:] = rope.to(torch.bfloat16).contiguous().view(torch.uint8).reshape(n, 2 * ROPE)
    return records


def dequantize_records(records: torch.Tensor) -> torch.Tensor:
    """float32 [N, 576] keys (latent then rope) of uint8 [N, 656] records; the latent is also the value."""
    n = records.shape[0]
    codes = records[:, :SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float().reshape(n, GROUPS, GROUP)
    scale = records[:, SCALE_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32)
    rope = records[:, ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([(codes * scale[..., None]).reshape(n, LATENT), rope], dim=1)


def pack_query(q: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, heads, 656]: a bf16 query [rows, heads, 576] in the record form (latent quantized as
    the cache's, rope kept in bf16), for ``run_decode``'s packed-query path."""
    if q.dim() != 3 or q.shape[2] != HEAD_DIM:
        raise ValueError(f"q must be [rows, heads, {HEAD_DIM}], got {tuple(q.shape)}")
    rows, heads = q.shape[0], q.shape[1]
    flat = q.reshape(rows * heads, HEAD_DIM)
    return quantize_records(flat[:, :LATENT], flat[:, LATENT:]).view(rows, heads, RECORD_BYTES)


def _flat(kv_cache: torch.Tensor) -> torch.Tensor:
    if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != RECORD_BYTES or not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be contiguous uint8 [..., {RECORD_BYTES}], got {kv_cache.dtype} "
                         f"{tuple(kv_cache.shape)}")  # fmt: skip
    return kv_cache.view(-1, RECORD_BYTES)


def _slots(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    slots = slots.reshape(-1).long()
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise IndexError(f"slots must lie in [0, {num_slots}), got [{int(slots.min())}, {int(slots.max())}]")
    return slots


def write_kv(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor) -> None:
    """Quantize tokens and store their records at ``slots`` (page * page_size + offset)."""
    flat = _flat(kv_cache)
    idx = _slots(slots, flat.shape[0])
    if idx.numel() != latent.shape[0]:
        raise ValueError(f"{idx.numel()} slots for {latent.shape[0]} tokens")
    flat[idx] = quantize_records(latent, rope).to(flat.device)


def read_kv(kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """float32 [N, 576] dequantized keys at ``slots`` (for tests and references)."""
    flat = _flat(kv_cache)
    return dequantize_records(flat[_slots(slots, flat.shape[0])])
