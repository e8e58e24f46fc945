"""The engine-neutral sparse-MLA service: FlashMLA's call shapes in, csf's decoder call out (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_attention import sparse_mla_reference
from csf_serving_adapters import sparse_mla
from csf_serving_adapters.sparse_mla import SparseMLAService, enabled, service
from tests.attention.mla_cases import mla_inputs


class ReferenceDecoder:
    """Stands in for a bound csf decoder on the CPU: the float32 reference, recording its calls."""

    def __init__(self):
        self.calls = []

    def run_decode(self, q, kv, indices, lengths, sm_scale, return_lse=False, out=None, lse=None):
        self.calls.append((q.shape, kv.shape, indices.dtype, indices.is_contiguous(), lengths.tolist()))
        got_out, got_lse = sparse_mla_reference(q, kv, indices, lengths, sm_scale)
        if out is None:
            return got_out.to(torch.bfloat16), got_lse
        out.copy_(got_out)
        lse.copy_(got_lse)
        return out, lse


def test_flashmla_shaped_calls_map_to_rows_and_back(monkeypatch):
    x = mla_inputs(torch.Generator().manual_seed(0), rows=6, heads=16, topk=128, pages=4, lengths=[128] * 6)
    svc = SparseMLAService(max_rows=8)
    fake = ReferenceDecoder()
    monkeypatch.setattr(svc, "_decoder", lambda heads, topk, device: fake)
    q = x.q.view(3, 2, 16, 576)  # batch 3, two query rows each (MTP)
    indices = x.indices.view(3, 2, 128).long()  # any integer dtype
    kv = x.kv_cache.view(torch.float8_e4m3fn)  # engines may hand the cache in another dtype
    out, lse = svc.decode(q, kv, indices, 0.1)
    want_out, want_lse = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, 0.1)
    assert out.shape == (3, 2, 16, 512) and lse.shape == (3, 16, 2)  # FlashMLA's lse: [batch, heads, q_rows]
    assert torch.equal(out.reshape(6, 16, 512), want_out.to(torch.bfloat16))
    assert torch.equal(lse.permute(0, 2, 1).reshape(6, 16), want_lse)
    assert fake.calls == [((6, 16, 576), (256, 656), torch.int32, True, [128] * 6)]


def test_calls_beyond_the_planned_rows_run_in_slices_of_the_planned_size(monkeypatch):
    x = mla_inputs(torch.Generator().manual_seed(2), rows=10, heads=16, topk=128, pages=4, lengths=[128] * 10)
    svc = SparseMLAService(max_rows=4)
    fake = ReferenceDecoder()
    monkeypatch.setattr(svc, "_decoder", lambda heads, topk, device: fake)
    out, lse = svc.decode(x.q.view(5, 2, 16, 576), x.kv_cache, x.indices.view(5, 2, 128), 0.1)
    want_out, want_lse = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, 0.1)
    assert [c[0][0] for c in fake.calls] == [4, 4, 2]
    assert torch.equal(out.reshape(10, 16, 512), want_out.to(torch.bfloat16))
    assert torch.equal(lse.permute(0, 2, 1).reshape(10, 16), want_lse)


def test_malformed_shapes_are_refused():
    svc = SparseMLAService(max_rows=4)
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(1, 64, 656, dtype=torch.uint8)
    with pytest.raises(ValueError, match="indices"):
        svc.decode(q, kv, torch.zeros(2, 128, dtype=torch.int32), 0.1)


def test_the_process_service_grows_to_the_largest_batch_an_engine_states(monkeypatch):
    monkeypatch.setattr(sparse_mla, "_service", None)
    first = service()
    assert first.max_rows == sparse_mla.DEFAULT_MAX_ROWS
    assert service(64) is first  # within what it was planned for
    bigger = service(4 * sparse_mla.DEFAULT_MAX_ROWS)
    assert bigger.max_rows == 4 * sparse_mla.DEFAULT_MAX_ROWS and service() is bigger


@pytest.mark.parametrize(("raw", "want"), [(None, False), ("1", True), ("0", False)])
def test_the_switch_is_off_unless_set(monkeypatch, raw, want):
    monkeypatch.delenv("CSF_SPARSE_MLA", raising=False)
    if raw is not None:
        monkeypatch.setenv("CSF_SPARSE_MLA", raw)
    assert enabled() is want
