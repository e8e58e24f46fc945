"""The float32 sparse-MLA reference against a direct per-row, per-head float64 loop (CPU)."""

from __future__ import annotations

import math

import torch

from csf_attention import read_kv, sparse_mla_reference
from csf_kernels.mla.layout import LATENT, RECORD_BYTES
from tests.attention.mla_cases import mla_inputs


def _naive(q, kv, indices, lengths, sm_scale, sink):
    rows, heads = q.shape[0], q.shape[1]
    num_slots = kv.numel() // RECORD_BYTES
    out = torch.zeros(rows, heads, LATENT, dtype=torch.float64)
    lse = torch.full((rows, heads), float("-inf"), dtype=torch.float64)
    for r in range(rows):
        ids = [int(i) for i in indices[r, : max(0, min(int(lengths[r]), indices.shape[1]))] if 0 <= i < num_slots]
        if not ids:
            continue
        keys = read_kv(kv, torch.tensor(ids)).double()
        for h in range(heads):
            s = (keys @ q[r, h].double()) * sm_scale
            m = float(s.max()) if sink is None else max(float(s.max()), float(sink[h]))
            p = torch.exp(s - m)
            den = float(p.sum()) + (0.0 if sink is None else math.exp(float(sink[h]) - m))
            out[r, h] = (p[:, None] * keys[:, :LATENT]).sum(0) / den
            lse[r, h] = m + math.log(float(p.sum()))
    return out, lse


def test_reference_matches_a_direct_loop_with_and_without_a_sink():
    gen = torch.Generator().manual_seed(5)
    x = mla_inputs(gen, rows=4, heads=3, topk=128, pages=3, lengths=[128, 70, 0, 500])
    x.indices[1, 10:20] = -1
    for sink in (None, torch.randn(x.q.shape[1], generator=gen) * 3):
        out, lse = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, sink)
        want_out, want_lse = _naive(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, sink)
        assert torch.allclose(out.double(), want_out, rtol=1e-4, atol=1e-5)
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
        fin = torch.isfinite(want_lse)
        assert torch.allclose(lse.double()[fin], want_lse[fin], rtol=1e-5, atol=1e-5)
        assert (out[2] == 0).all() and torch.isinf(lse[2]).all()  # an empty row
