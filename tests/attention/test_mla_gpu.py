"""Sparse MLA decode on the GPU, from the AOT cache (frozen): every catalog head count and top-k width
against the float32 reference, splits, sinks, CUDA graphs with changing lengths, and records past 4 GiB."""

from __future__ import annotations

import os

import pytest
import torch

from csf_attention import MLACaps, bind, dequantize_records, pack_query, plan, sparse_mla_reference, write_kv
from csf_kernels.catalog import load_catalog
from csf_kernels.mla.layout import LATENT, PAGE_SIZE, RECORD_BYTES, ROPE, VALUE_DIM
from tests.attention.mla_cases import late_maximum_inputs, mla_inputs, rel_err, worst_group_err
from tests.cuda_graphs import replay_allocating_nothing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")  # fresh data every run; in every failure message
REL_TOL = 1.5e-2  # the output rounds to bf16 once; p to float16 (11 bits) before the value product
CATALOG = load_catalog().sparse_mla


def _decoder(caps: MLACaps):
    p = plan(caps)
    return bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))


def _poisoned(dec, x, attn_sink=None):
    dec.scratch.fill_(0xFF)
    rows, heads = x.q.shape[0], x.q.shape[1]
    out = torch.full((rows, heads, VALUE_DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), device="cuda")
    return dec.run_decode(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, attn_sink, return_lse=True, out=out,
                          lse=lse)  # fmt: skip


def _check(got, want, what):
    out, lse = got
    err = rel_err(out, want[0])
    assert err < REL_TOL, f"seed {SEED} {what}: rel err {err:.3g}"
    assert not torch.isnan(out).any(), f"seed {SEED} {what}: NaN"
    assert torch.equal(torch.isinf(lse), torch.isinf(want[1])), f"seed {SEED} {what}: lse -inf pattern"
    fin = torch.isfinite(want[1])
    assert torch.allclose(lse[fin], want[1][fin], atol=2e-3, rtol=1e-3), f"seed {SEED} {what}: lse"


@pytest.mark.parametrize("heads", CATALOG["heads"])
@pytest.mark.parametrize("topk", CATALOG["top_k"])
def test_decode_matches_the_reference(heads, topk):
    gen = torch.Generator().manual_seed(SEED)
    for rows in (1, 7, 64):
        lengths = [topk - 3 * r for r in range(rows)]
        lengths[-1] = 0 if rows > 1 else topk
        x = mla_inputs(gen, rows=rows, heads=heads, topk=topk, pages=64, lengths=lengths, device="cuda")
        sink = torch.randn(heads, generator=gen).cuda()
        for dtype in ("float32", "bfloat16"):
            dec = _decoder(MLACaps(heads=heads, max_rows=64, topk=topk, partial_dtype=dtype))
            for attn_sink in (None, sink):
                want = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, attn_sink)
                _check(_poisoned(dec, x, attn_sink), want, f"h={heads} k={topk} rows={rows} {dtype}")


@pytest.mark.parametrize("spread", [8.0, 40.0])
def test_adversarial_logit_spreads(spread):
    gen = torch.Generator().manual_seed(SEED)
    x = mla_inputs(gen, rows=4, heads=64, topk=2048, pages=64, lengths=[2048, 1000, 65, 1], spread=spread,
                   device="cuda")  # fmt: skip
    want = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale)
    _check(_poisoned(_decoder(MLACaps(heads=64, max_rows=4, topk=2048)), x), want, f"spread {spread}")


@pytest.mark.parametrize("heads", [16, 64])
def test_group_scales_far_apart_keep_every_output_group_accurate(heads):
    gen = torch.Generator().manual_seed(SEED)
    x = mla_inputs(gen, rows=4, heads=heads, topk=2048, pages=64, lengths=[2048, 1000, 65, 1], scale_spread=True,
                   device="cuda")  # fmt: skip
    want = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale)
    got = _poisoned(_decoder(MLACaps(heads=heads, max_rows=4, topk=2048)), x)
    _check(got, want, "scale spread")
    worst = worst_group_err(got[0], want[0])
    assert worst < REL_TOL, f"seed {SEED}: scale spread, worst group rel err {worst:.3g}"


def test_splits_agree_with_one_split_and_a_late_maximum_is_rescaled():
    gen = torch.Generator().manual_seed(SEED)
    x = mla_inputs(gen, rows=2, heads=16, topk=2048, pages=64, lengths=[2048, 100], device="cuda")
    one = _poisoned(_decoder(MLACaps(heads=16, max_rows=2, topk=2048, sm_count=1)), x)[0]
    many = _poisoned(_decoder(MLACaps(heads=16, max_rows=2, topk=2048)), x)[0]
    assert float((many.float() - one.float()).abs().max()) <= 2e-2 * float(one.float().abs().max())
    y = late_maximum_inputs(gen, heads=16, chunks=10, device="cuda")
    want = sparse_mla_reference(y.q, y.kv_cache, y.indices, y.lengths, y.sm_scale)
    got = _poisoned(_decoder(MLACaps(heads=16, max_rows=1, topk=640, sm_count=1)), y)
    assert rel_err(got[0][:, 0], want[0][:, 0]) < REL_TOL, f"seed {SEED}: late maximum"


@pytest.mark.parametrize("heads", [h for h in CATALOG["heads"] if plan(MLACaps(heads=h, max_rows=1, topk=512)).direct])
def test_a_single_split_finished_in_the_decode_gives_the_merged_bits(heads):
    """One split per row (sm_count 1): the decode program finishes the output, sink and lse itself; the same
    call merged by the merge program (float32 partials) must give the same bits."""
    gen = torch.Generator().manual_seed(SEED)
    x = mla_inputs(gen, rows=5, heads=heads, topk=512, pages=32, lengths=[512, 300, 64, 1, 0], device="cuda")
    sink = torch.randn(heads, generator=gen).cuda()
    caps = MLACaps(heads=heads, max_rows=5, topk=512, sm_count=1)
    direct, merged = _decoder(caps), _decoder(MLACaps(**{**vars(caps), "direct_single_split": False}))
    assert direct.plan.splits_for(5) == 1 and direct.plan.direct and not merged.plan.direct
    for attn_sink in (None, sink):
        got, want = _poisoned(direct, x, attn_sink), _poisoned(merged, x, attn_sink)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"seed {SEED} h={heads} sink"
        ref = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, attn_sink)
        _check(got, ref, f"direct h={heads}")


@pytest.mark.parametrize("heads", [16, 128])
def test_a_packed_query_gives_the_bits_of_the_same_query_quantized_in_kernel(heads):
    gen = torch.Generator().manual_seed(SEED)
    x = mla_inputs(gen, rows=5, heads=heads, topk=512, pages=32, lengths=[512, 300, 64, 1, 0], device="cuda")
    in_kernel = _poisoned(_decoder(MLACaps(heads=heads, max_rows=5, topk=512, quantize_query=True)), x)
    packed = pack_query(x.q)
    x_packed = type(x)(packed, x.kv_cache, x.indices, x.lengths, x.sm_scale)
    from_packed = _poisoned(_decoder(MLACaps(heads=heads, max_rows=5, topk=512)), x_packed)
    assert torch.equal(in_kernel[0], from_packed[0]) and torch.equal(in_kernel[1], from_packed[1]), f"seed {SEED}"
    q_deq = dequantize_records(packed.view(-1, packed.shape[-1])).view(x.q.shape)
    _check(from_packed, sparse_mla_reference(q_deq, x.kv_cache, x.indices, x.lengths, x.sm_scale), "packed query")


def test_cuda_graph_replay_with_changing_lengths_is_exact_and_allocation_free():
    gen = torch.Generator().manual_seed(SEED)
    rows, heads, topk = 8, 32, 2048
    x = mla_inputs(gen, rows=rows, heads=heads, topk=topk, pages=128, lengths=[topk] * rows, device="cuda")
    dec = _decoder(MLACaps(heads=heads, max_rows=rows, topk=topk))
    out = torch.empty(rows, heads, VALUE_DIM, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, heads, device="cuda")

    def run():
        dec.run_decode(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, return_lse=True, out=out, lse=lse)

    run()  # bind outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):
        x.lengths.copy_(torch.randint(0, topk + 1, (rows,), generator=gen, dtype=torch.int32))
        x.indices.copy_(torch.randint(-1, 128 * PAGE_SIZE, (rows, topk), generator=gen, dtype=torch.int32))
        eager = [t.clone() for t in _poisoned(dec, x)]
        dec.scratch.fill_(0xFF)
        out.fill_(float("nan"))
        replay_allocating_nothing(graph)
        assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1]), f"seed {SEED}: replay != eager"


def test_records_past_2_and_4_gib_are_addressed_exactly():
    slots = -(-(4 * 2**30 + 2**28) // RECORD_BYTES)  # a 4.25 GiB cache
    pages = -(-slots // PAGE_SIZE)
    kv = torch.zeros(pages, PAGE_SIZE, RECORD_BYTES, dtype=torch.uint8, device="cuda")
    gen = torch.Generator().manual_seed(SEED)
    n = pages * PAGE_SIZE
    high = torch.tensor([(2**31) // RECORD_BYTES + i for i in range(32)] + [n - 1 - i for i in range(32)])
    latent, rope = torch.randn(64, LATENT, generator=gen), torch.randn(64, ROPE, generator=gen)
    write_kv(kv, high.cuda(), latent.cuda(), rope.cuda())  # records straddling 2 GiB, and past 4 GiB
    indices = high.to(torch.int32).view(1, 64).repeat(2, 1).cuda()
    indices[1, ::2] = -1
    q = (torch.randn(2, 16, LATENT + ROPE, generator=gen) * 0.05).to(torch.bfloat16).cuda()
    lengths = torch.tensor([64, 64], dtype=torch.int32, device="cuda")
    dec = _decoder(MLACaps(heads=16, max_rows=2, topk=64))
    out, lse = dec.run_decode(q, kv, indices, lengths, 0.04, return_lse=True)
    want = sparse_mla_reference(q, kv, indices, lengths, 0.04)
    assert rel_err(out, want[0]) < REL_TOL and torch.allclose(lse, want[1], atol=2e-3, rtol=1e-3), f"seed {SEED}"


def test_a_decode_planned_one_program_per_sm_gets_an_sm_of_its_own():
    """The driver's occupancy for the bound 16-head decode: one program per SM where the plan split the rows for
    one (32 rows), two where it planned two (128 rows); the output is the reference's either way."""
    gen = torch.Generator().manual_seed(SEED)
    dec = _decoder(MLACaps(heads=16, max_rows=128, topk=2048))
    for rows, per_sm in ((32, 1), (128, 2)):
        assert dec.plan.programs_per_sm(rows) == per_sm
        x = mla_inputs(gen, rows=rows, heads=16, topk=2048, pages=64, lengths=[2048] * rows, device="cuda")
        out = torch.empty(rows, 16, VALUE_DIM, dtype=torch.bfloat16, device="cuda")
        launches = dec.launches(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, None, out, None)
        decode = launches[0].bind("sparse_mla")
        fits = decode.programs_per_sm()  # (a driver error raises)
        assert fits == per_sm, f"rows={rows}: {fits} programs fit an SM, planned {per_sm}"
        want = sparse_mla_reference(x.q[:4], x.kv_cache, x.indices[:4], x.lengths[:4], x.sm_scale)
        got = dec.run_decode(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale)
        assert rel_err(got[:4], want[0]) < REL_TOL, f"seed {SEED} rows={rows}"
