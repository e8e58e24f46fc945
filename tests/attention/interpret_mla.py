"""Run sparse MLA decode (decode + merge programs) in Triton's CPU interpreter (a subprocess entry point).

Usage: python -m tests.attention.interpret_mla SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from csf_attention import MLACaps, SparseMLADecoder, dequantize_records, pack_query, plan, sparse_mla_reference
from csf_kernels.mla.heuristics import triton_decode_config
from tests.attention.mla_cases import late_maximum_inputs, mla_inputs, rel_err, worst_group_err
from tests.interpreter import run_launch


def decode(caps: MLACaps, x, attn_sink=None):
    # the Triton programs (the Gluon ones do not run in the interpreter); the cases set their split counts
    # through sm_count alone
    p = plan(replace(caps, waves=1), triton_decode_config(caps.heads))
    decoder = SparseMLADecoder(p, torch.full((p.scratch.nbytes,), 0xFF, dtype=torch.uint8))  # poisoned
    rows = x.q.shape[0]
    out = torch.full((rows, caps.heads, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((rows, caps.heads), float("nan"))
    for launch in decoder.launches(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, attn_sink, out, lse):
        run_launch(launch)
    return out, lse, p.splits_for(rows)


def check(name, got, want, tol):
    out, lse, splits = got
    ref_out, ref_lse = want
    err = rel_err(out, ref_out)
    assert err < tol, f"{name} ({splits} splits): rel err {err:.3g}"
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), f"{name}: lse -inf pattern"
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin], ref_lse[fin], atol=2e-3, rtol=1e-3), f"{name}: lse"
    assert not torch.isnan(out).any(), f"{name}: NaN in the output"


def main(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    cases = 0
    heads, topk = 16, 256
    x = mla_inputs(gen, rows=3, heads=heads, topk=topk, pages=10, lengths=[topk, 70, 0])
    sink = torch.randn(heads, generator=gen)
    for attn_sink in (None, sink):
        want = sparse_mla_reference(x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, attn_sink)
        assert (want[0][2] == 0).all() and torch.isinf(want[1][2]).all()  # the empty row
        outs = {}
        for dtype in ("float32", "bfloat16"):
            for sms in (1, 8):  # one split per row (merged, not finished directly); 8 // 3 = 2 splits
                caps = MLACaps(heads=heads, max_rows=3, topk=topk, partial_dtype=dtype, sm_count=sms,
                               direct_single_split=False)  # fmt: skip
                got = decode(caps, x, attn_sink)
                check(f"sink={attn_sink is not None} {dtype} sms={sms}", got, want, 1.5e-2)
                outs[dtype, got[2]] = got
                cases += 1
        if attn_sink is None:  # one split, no sink: float32 and bf16 partials round once, to the same bits
            assert torch.equal(outs["float32", 1][0], outs["bfloat16", 1][0])
        # one split finished by the decode program itself: the float32-partial merge's bits
        direct = decode(MLACaps(heads=heads, max_rows=3, topk=topk, sm_count=1), x, attn_sink)
        assert torch.equal(direct[0], outs["float32", 1][0]) and torch.equal(direct[1], outs["float32", 1][1])
        cases += 1
        outs = {key: got[0] for key, got in outs.items()}
        # several splits agree with one split within the merge's rounding
        diff = (outs["float32", 2].float() - outs["float32", 1].float()).abs().max()
        assert float(diff) <= 2e-2 * float(outs["float32", 1].float().abs().max()), float(diff)
    # a packed query and a bf16 query quantized in-kernel the same way: the same bits
    packed = pack_query(x.q)
    caps = MLACaps(heads=heads, max_rows=3, topk=topk, sm_count=8)
    in_kernel = decode(MLACaps(heads=heads, max_rows=3, topk=topk, sm_count=8, quantize_query=True), x)
    x_packed = type(x)(packed, x.kv_cache, x.indices, x.lengths, x.sm_scale)
    from_packed = decode(caps, x_packed)
    assert torch.equal(in_kernel[0], from_packed[0]) and torch.equal(in_kernel[1], from_packed[1])
    q_deq = dequantize_records(packed.view(-1, packed.shape[-1])).view(x.q.shape)
    want = sparse_mla_reference(q_deq, x.kv_cache, x.indices, x.lengths, x.sm_scale)
    check("packed query", from_packed, want, 1.5e-2)
    cases += 2
    # adversarial logit spreads: near-one-hot softmax rows, over two splits
    for spread in (8.0, 40.0):
        z = mla_inputs(gen, rows=2, heads=heads, topk=128, pages=4, lengths=[128, 100], spread=spread)
        want = sparse_mla_reference(z.q, z.kv_cache, z.indices, z.lengths, z.sm_scale)
        check(f"spread {spread}", decode(MLACaps(heads=heads, max_rows=2, topk=128, sm_count=4), z), want, 1.5e-2)
        cases += 1
    # group scales 27 binades apart within a chunk: every latent group of the output keeps its accuracy
    z = mla_inputs(gen, rows=2, heads=heads, topk=128, pages=4, lengths=[128, 100], scale_spread=True)
    want = sparse_mla_reference(z.q, z.kv_cache, z.indices, z.lengths, z.sm_scale)
    got = decode(MLACaps(heads=heads, max_rows=2, topk=128, sm_count=4), z)
    check("scale spread", got, want, 1.5e-2)
    worst = worst_group_err(got[0], want[0])
    assert worst < 1.5e-2, f"scale spread: worst group rel err {worst:.3g}"
    cases += 1
    # 64-head programs (wgmma on the GPU) take bf16 operands, the others float16: both against the reference
    w = mla_inputs(gen, rows=2, heads=64, topk=128, pages=4, lengths=[128, 70])
    want = sparse_mla_reference(w.q, w.kv_cache, w.indices, w.lengths, w.sm_scale)
    for sms in (1, 4):
        got = decode(MLACaps(heads=64, max_rows=2, topk=128, sm_count=sms), w)
        assert got[2] == (1 if sms == 1 else 2)
        check(f"64 heads, {got[2]} splits", got, want, 1.5e-2)
        cases += 1
    # the running maximum rises in the last of ten serial chunks (one split walks all ten)
    y = late_maximum_inputs(gen, heads=heads, chunks=10)
    want = sparse_mla_reference(y.q, y.kv_cache, y.indices, y.lengths, y.sm_scale)
    got = decode(MLACaps(heads=heads, max_rows=1, topk=640, sm_count=1), y)
    assert got[2] == 1
    check("late maximum", got, want, 1.5e-2)
    head0 = rel_err(got[0][:, 0], want[0][:, 0])  # without the accumulator rescale: about 0.26
    assert head0 < 1.5e-2, f"late maximum, head 0: rel err {head0:.3g}"
    cases += 1
    print(f"ok {cases}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
