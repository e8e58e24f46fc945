"""The FP8 KV cache writer and reader (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_attention import dequantize_records, quantize_records, read_kv, write_kv
from csf_kernels.mla.layout import GROUP, LATENT, RECORD_BYTES, ROPE, ROPE_OFFSET, SCALE_OFFSET


def _tokens(n, seed):
    gen = torch.Generator().manual_seed(seed)
    latent = torch.randn(n, LATENT, generator=gen) * torch.logspace(-3, 3, n)[:, None]
    return latent, torch.randn(n, ROPE, generator=gen)


def test_records_round_trip_within_e4m3_precision_with_power_of_two_scales():
    latent, rope = _tokens(33, seed=1)
    latent[5, :GROUP] = 0.0  # an all-zero group keeps a finite scale and decodes to zeros
    records = quantize_records(latent, rope)
    assert records.shape == (33, RECORD_BYTES) and records.dtype == torch.uint8
    scales = records[:, SCALE_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32)
    assert torch.isfinite(scales).all()
    assert torch.equal(torch.exp2(torch.log2(scales).round()), scales)  # powers of two
    codes = records[:, :SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
    assert codes.abs().max() <= 448.0
    back = dequantize_records(records)
    assert torch.equal(back[5, :GROUP], torch.zeros(GROUP))
    rel = ((back[:, :LATENT] - latent).abs() / latent.abs().amax(1, keepdim=True)).max()
    assert rel < 2**-3  # E4M3: 3 mantissa bits; the group's largest value sits in [224, 448]
    assert torch.equal(back[:, LATENT:], rope.to(torch.bfloat16).float())  # rope stored as bf16


def test_write_then_read_through_pages_and_slots():
    kv = torch.zeros(4, 64, RECORD_BYTES, dtype=torch.uint8)
    latent, rope = _tokens(5, seed=2)
    slots = torch.tensor([0, 63, 64, 200, 255])
    write_kv(kv, slots, latent, rope)
    assert torch.equal(read_kv(kv, slots), dequantize_records(quantize_records(latent, rope)))
    untouched = torch.ones(256, dtype=torch.bool)
    untouched[slots] = False
    assert (kv.view(256, RECORD_BYTES)[untouched] == 0).all()


@pytest.mark.parametrize("bad", [[-1], [256], [0, 1 << 40]])
def test_slots_outside_the_cache_are_refused_and_nothing_is_written(bad):
    kv = torch.zeros(4, 64, RECORD_BYTES, dtype=torch.uint8)
    latent, rope = _tokens(len(bad), seed=3)
    with pytest.raises(IndexError, match="slots must lie in"):
        write_kv(kv, torch.tensor(bad), latent, rope)
    assert (kv == 0).all()


def test_malformed_caches_and_tokens_are_refused():
    latent, rope = _tokens(2, seed=4)
    with pytest.raises(ValueError, match="kv_cache must be"):
        write_kv(torch.zeros(4, 64, 655, dtype=torch.uint8), torch.tensor([0, 1]), latent, rope)
    with pytest.raises(ValueError, match="latent must be"):
        quantize_records(latent[:, :256], rope)
    with pytest.raises(ValueError, match="slots for"):
        write_kv(torch.zeros(1, 64, RECORD_BYTES, dtype=torch.uint8), torch.tensor([0]), latent, rope)


def test_group_scales_follow_the_exact_rule_at_and_around_every_boundary():
    from csf_attention import group_scales

    edges = torch.tensor([448.0 * 2.0**k for k in range(-20, 20)], dtype=torch.float32)
    below = torch.nextafter(edges, torch.zeros_like(edges))
    above = torch.nextafter(edges, torch.full_like(edges, float("inf")))
    gen = torch.Generator().manual_seed(6)
    amax = torch.cat([edges, below, above, torch.rand(1000, generator=gen) * 1e4, torch.tensor([0.0, 1e-6, 1e-4])])
    got = group_scales(amax)
    want = torch.exp2(torch.ceil(torch.log2(amax.double().clamp_min(float(torch.tensor(1e-4))) / 448.0)))
    assert torch.equal(got.double(), want)
    assert (amax.clamp_min(1e-4) / got <= 448.0).all() and (amax.clamp_min(1e-4) / got > 224.0).all()


def test_packed_queries_are_records_of_the_query():
    from csf_attention import pack_query

    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 16, LATENT + ROPE, generator=gen).to(torch.bfloat16)
    packed = pack_query(q)
    assert packed.shape == (3, 16, RECORD_BYTES) and packed.dtype == torch.uint8
    flat = q.view(48, -1)
    assert torch.equal(packed.view(48, RECORD_BYTES), quantize_records(flat[:, :LATENT], flat[:, LATENT:]))
    with pytest.raises(ValueError, match="q must be"):
        pack_query(q[..., :512])
