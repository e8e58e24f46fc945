"""The sparse-MLA service on the GPU (no engine needed): FlashMLA-shaped calls equal csf's decoder bit
for bit, and match the float32 reference."""

from __future__ import annotations

import pytest
import torch

from csf_attention import MLACaps, bind, plan, sparse_mla_reference
from csf_serving_adapters.sparse_mla import SparseMLAService
from tests.attention.mla_cases import mla_inputs, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]


def test_service_equals_the_decoder_and_the_reference():
    x = mla_inputs(torch.Generator().manual_seed(1), rows=8, heads=32, topk=512, pages=16, lengths=[512] * 8,
                   device="cuda")  # fmt: skip
    q, idx = x.q.view(4, 2, 32, 576), x.indices.view(4, 2, 512)
    out, lse = SparseMLAService(max_rows=16).decode(q, x.kv_cache, idx, 0.05)
    p = plan(MLACaps(heads=32, max_rows=16, topk=512))
    dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))
    want_out, want_lse = dec.run_decode(x.q, x.kv_cache, x.indices, x.lengths, 0.05, return_lse=True)
    assert torch.equal(out.reshape(8, 32, 512), want_out)
    assert torch.equal(lse.permute(0, 2, 1).reshape(8, 32), want_lse)
    ref = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, 0.05)
    assert rel_err(want_out, ref[0]) < 1.5e-2


def test_a_batch_beyond_the_plan_runs_in_slices_with_the_same_bits():
    x = mla_inputs(torch.Generator().manual_seed(2), rows=8, heads=32, topk=512, pages=16, lengths=[512] * 8,
                   device="cuda")  # fmt: skip
    full = plan(MLACaps(heads=32, max_rows=8, topk=512))
    sliced = plan(MLACaps(heads=32, max_rows=3, topk=512))
    # slices of 3, 3, 2 rows get the full batch's split count, so the same bits are expected
    assert {sliced.splits_for(r) for r in (3, 2)} == {full.splits_for(8)}
    out, lse = SparseMLAService(max_rows=3).decode(x.q.view(8, 1, 32, 576), x.kv_cache, x.indices.view(8, 1, 512),
                                                   0.05)  # fmt: skip
    dec = bind(full, torch.empty(full.scratch.nbytes, dtype=torch.uint8, device="cuda"))
    want_out, want_lse = dec.run_decode(x.q, x.kv_cache, x.indices, x.lengths, 0.05, return_lse=True)
    assert torch.equal(out.reshape(8, 32, 512), want_out)
    assert torch.equal(lse.permute(0, 2, 1).reshape(8, 32), want_lse)
