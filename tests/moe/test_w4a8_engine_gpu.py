"""The engine's W4A8 GEMM and layer on the GPU (AOT-built, frozen): the grouped GEMM agrees with a float32 product of
exactly its quantized operands (E4M3 activations, folded and promoted weight blocks) to FP8 accumulation and bf16
output rounding, writes every output of the blocks in use and nothing past them, computes zeros for invalid experts,
is deterministic and replays in a CUDA graph; the layer agrees with ``csf_moe.w4a8_reference`` and with the W4A16
reference within W4A8's measured accuracy, and its output bits do not depend on what its padding slots held.

Fresh random data every run (the seed is in the messages); outputs are poisoned with NaN before each launch. Scales
put some blocks far from their row base so that some tiles take the promotion path."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.moe.engine_panels import engine_scale_panel, fc1_engine_rows
from csf_kernels.moe.fp8_activations import dequantize_fp8, per_token_fp8_quant
from csf_kernels.moe.w4a8 import grouped_w4a8_gemm_launch
from csf_kernels.moe.w4a8_operands import row_factor, w4a8_weights
from csf_kernels.moe.w4a8_panels import w4a8_bases, w4a8_tile_flags, w4a8_weight_panel
from csf_kernels.moe.w4a8_specs import W4A8_TILE_N

from ..cuda_graphs import captured, replay_allocating_nothing
from .padding_routes import with_padding_routes

pytestmark = pytest.mark.gpu

SEED = int.from_bytes(os.urandom(3), "little")


def _experts(experts: int, rows: int, k: int, seed: int, promote: bool):
    """Packed MXFP4 [E, rows, K / 2] and E8M0 scales (CPU); ``promote``: expert 0's first tile holds a block 30
    binades below its row (its tile promotes) and expert 1's a NaN scale."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 124, (experts, rows, k // 32), dtype=torch.uint8, generator=g)
    if promote:
        scales[0, 5, 1] = 90
        scales[1 % experts, rows - 1, 0] = 255
    return packed, scales


def _weights(packed: torch.Tensor, scales: torch.Tensor):
    """GPU operands (panels, scale panel, bases, flags) and the float32 weights the kernel multiplies (operand
    times the row factor: exactly the dequantized MXFP4 values, NaN where the scale is)."""
    bases = w4a8_bases(scales)
    w_panel = torch.stack([w4a8_weight_panel(p) for p in packed]).cuda()
    s_panel = torch.stack([engine_scale_panel(s) for s in scales]).cuda()
    flags = w4a8_tile_flags(scales, bases)
    ops = [w4a8_weights(packed[e], scales[e], bases[e]) for e in range(packed.shape[0])]
    operand = torch.stack([o.operand() for o in ops])  # [E, R, K] before the row factor
    return (w_panel, s_panel, bases.cuda(), flags.cuda()), operand.cuda(), row_factor(bases).cuda(), flags


def _activations(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-4, 4, (n, 1), generator=g).float())
    xq, xscale = per_token_fp8_quant(x)
    return xq.cuda(), xscale.cuda(), dequantize_fp8(xq, torch.ones_like(xscale), "per_token").cuda()


def _check(out, xv, xscale, operand, rf, where: str):
    """out ~ xscale * rf * (xv @ operand.T): FP8 wgmma accumulates a 128-K stage with fewer bits than float32
    (2**-13 of the magnitudes' sum, generously) and the output is bf16 (2**-8 relative)."""
    ref = (xv @ operand.T) * rf * xscale[:, None]
    bound = (xv.abs() @ operand.abs().T) * rf * xscale[:, None]
    finite = torch.isfinite(ref)
    got = out.float()
    assert torch.isfinite(got[finite]).all(), f"{where}: unwritten or wrong outputs (NaN poison left), seed {SEED}"
    assert torch.isnan(got[~finite]).all(), f"{where}: a NaN scale's row lost its NaN, seed {SEED}"
    err = (got - ref).abs()[finite]
    tol = (ref.abs() * 2.0**-8 + bound * 2.0**-13 + 1e-30)[finite]
    worst = (err / tol).max().item()
    assert worst <= 1.0, f"{where}: max error {worst:.2f}x the tolerance, seed {SEED}"


def _bind(*args, **kwargs):
    runtime.freeze()
    try:
        return grouped_w4a8_gemm_launch(*args, **kwargs).bind("w4a8 gemm test")
    finally:
        runtime.unfreeze()


@pytest.mark.parametrize("tile_n", W4A8_TILE_N)
@pytest.mark.parametrize("rows,k", [(320, 2880), (128, 128), (2880, 704)], ids=str)
def test_grouped_w4a8_gemm_matches_its_operands(rows, k, tile_n):
    experts, max_blocks = 4, 7
    packed, scales = _experts(experts, rows, k, SEED + rows + tile_n, promote=True)
    operands, operand, rf, flags = _weights(packed, scales)
    assert not bool(flags.bool().all()), "the promotion path must be exercised"
    xq, xscale, xv = _activations(max_blocks * tile_n, k, SEED + 1)
    ids = [3, 0, -1, 1, experts, 2, 0]  # -1 and E: inert
    used = 6  # block 6 is past meta[0]: never stored
    block_expert = torch.tensor(ids, dtype=torch.int32, device="cuda")
    meta = torch.tensor([used], dtype=torch.int32, device="cuda")
    out = torch.full((max_blocks * tile_n, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    before = runtime.compilations()
    bound = _bind(*operands, xq, xscale, out, block_expert, meta, tile_n=tile_n)
    bound()
    torch.cuda.synchronize()
    first = out.clone()
    for b, e in enumerate(ids):
        sl = slice(b * tile_n, (b + 1) * tile_n)
        if b >= used:
            assert torch.isnan(out[sl].float()).all(), f"block {b} past meta[0] was written"
        elif not 0 <= e < experts:
            assert torch.equal(out[sl].float(), torch.zeros_like(out[sl].float())), f"invalid block {b} not zero"
        else:
            _check(out[sl], xv[sl], xscale[sl], operand[e], rf[e], f"block {b} (expert {e})")
    out.fill_(float("nan"))
    bound()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), first.view(torch.int16)), "not deterministic"
    assert runtime.compilations() == before


@pytest.mark.parametrize("n", [1, 77])
def test_rows_past_the_last_whole_block(n):
    """A dense call (one expert, ``ceil(n / 64)`` blocks) whose last block runs past ``xq``'s rows: they read as
    zeros and are never stored."""
    packed, scales = _experts(1, 192, 640, SEED + n, promote=False)
    operands, operand, rf, _ = _weights(packed, scales)
    xq, xscale, xv = _activations(n, 640, SEED + 4)
    blocks = -(-n // 64)
    out = torch.full((n, 192), float("nan"), dtype=torch.bfloat16, device="cuda")
    be = torch.zeros(blocks, dtype=torch.int32, device="cuda")
    meta = torch.tensor([blocks], dtype=torch.int32, device="cuda")
    _bind(*operands, xq, xscale, out, be, meta, tile_n=64)()
    torch.cuda.synchronize()
    _check(out, xv, xscale, operand[0], rf[0], f"dense n={n}")


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("tile_n", [16, 128])
def test_fused_activation_epilogue(activation, tile_n):
    from csf_moe.reference import activation as reference_activation

    experts, inter, k, blocks = 3, 160, 384, 4
    packed, scales = _experts(experts, 2 * inter, k, SEED + tile_n, promote=True)
    perm = fc1_engine_rows(inter, interleaved=activation == "swiglu_oai")
    operands, operand, rf, _ = _weights(packed[:, perm], scales[:, perm])
    # as the catalog's geometries (the programs the cache holds): gpt-oss's SwiGLU with its bias, SiLU without
    bias = (torch.randn(experts, 2 * inter, generator=torch.Generator().manual_seed(SEED)) * 0.5).cuda()
    if activation == "silu":
        bias = None
    xq, xscale, xv = _activations(blocks * tile_n, k, SEED + 2)
    block_expert = torch.tensor([2, 0, 1, 2], dtype=torch.int32, device="cuda")
    meta = torch.tensor([blocks], dtype=torch.int32, device="cuda")
    out = torch.full((blocks * tile_n, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    bound = _bind(*operands, xq, xscale, out, block_expert, meta, tile_n=tile_n, activation=activation, bias=bias)
    bound()
    torch.cuda.synchronize()
    inv = torch.argsort(perm).cuda()  # engine rows back to W13's own order for the reference activation
    for b, e in enumerate(block_expert.tolist()):
        sl = slice(b * tile_n, (b + 1) * tile_n)
        h = (xv[sl] @ operand[e].T) * rf[e] * xscale[sl, None]
        h = (h if bias is None else h + bias[e])[:, inv]
        want = reference_activation(h, activation)
        finite = torch.isfinite(want)
        scale = (xv[sl].abs() @ operand[e].abs().T * rf[e] * xscale[sl, None]).nan_to_num().max()
        err = (out[sl].float() - want).abs()[finite]
        assert torch.isfinite(out[sl].float()[finite]).all(), f"block {b}: unwritten outputs, seed {SEED}"
        assert (err <= want.abs()[finite] * 2.0**-7 + 1e-2 * scale).all(), f"block {b}: error {err.max():.3e}"


def test_graph_replay_equals_eager_and_follows_new_data():
    experts, rows, k, tile_n, blocks = 3, 256, 1024, 64, 6
    packed, scales = _experts(experts, rows, k, SEED + 9, promote=False)
    operands, operand, rf, _ = _weights(packed, scales)
    xq, xscale, xv = _activations(blocks * tile_n, k, SEED + 3)
    block_expert = torch.tensor([0, 1, 2, 0, 1, 2], dtype=torch.int32, device="cuda")
    meta = torch.tensor([blocks], dtype=torch.int32, device="cuda")
    out = torch.full((blocks * tile_n, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    bound = _bind(*operands, xq, xscale, out, block_expert, meta, tile_n=tile_n)
    bound()
    eager = out.clone()
    graph = captured(bound)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    xscale.mul_(2.0)  # scales are device data: doubling them doubles every output exactly
    block_expert.copy_(torch.tensor([2, 2, 1, 1, 0, 0], dtype=torch.int32))
    replay_allocating_nothing(graph)
    for b, e in enumerate(block_expert.tolist()):
        sl = slice(b * tile_n, (b + 1) * tile_n)
        _check(out[sl], xv[sl], xscale[sl], operand[e], rf[e], f"replayed block {b}")


LAYERS = [("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1)]
# against the exact-operand reference, FC1's output rounded to bf16 as the layer stores it: each GEMM agrees with it to
# float32 rounding (the GEMM tests above), but the layer quantizes FC1's output again for FC2, so one bf16 ulp there
# can move an FC2 input a whole E4M3 step (6-12% of it); over one token's few rows that reached 2.18% (run 313,
# gpt-oss, the activation pass, seed 15046524), so calls of fewer than 300 tokens get the looser bound
W4A8_REL_TOL = 2e-2
W4A8_FEW_TOKENS_REL_TOL = 4e-2
W4A16_REL_TOL = 0.08  # against W4A16: what per-token FP8 activations cost (docs/moe-engine.md §8.3: 2.3-5.5%)


@pytest.mark.usefixtures("frozen_runtime")
@pytest.mark.parametrize("fused", [True, False], ids=["fused-act", "act-pass"])
@pytest.mark.parametrize(("model", "tp"), LAYERS, ids=[f"{m}-tp{t}" for m, t in LAYERS])
def test_w4a8_layer_matches_the_references(model, tp, fused):
    from csf_kernels.catalog import load_catalog
    from csf_moe.engine_layer import EngineMoE, engine_weights
    from csf_moe.reference import moe_reference
    from csf_moe.synthetic import synthetic_layer, synthetic_routing
    from csf_moe.w4a8_reference import W4A8Experts, w4a8_moe_reference

    geo = load_catalog().moe_geometry(model, tp, "mxfp4")
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    layer = EngineMoE(engine_weights(ref, geo.activation, fused=fused, w4a8=True), geo.top_k)
    w4a8 = W4A8Experts.of(ref)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in (1, 7, 300, 1500, 5000):
        x, ids, w = synthetic_routing(geo, t, gen)
        if t >= 7:  # graph padding: ids outside [0, E) contribute nothing
            ids = with_padding_routes(ids, geo.experts)
        out = torch.full_like(x, float("nan"))
        layer.call(x, ids, w, out)()
        want8 = w4a8_moe_reference(x, w4a8, w, ids, kind=geo.activation, fused_activation=fused)
        want16 = moe_reference(x, ref, w, ids, kind=geo.activation)
        err8 = float((out.float() - want8).norm() / want8.norm())
        err16 = float((out.float() - want16).norm() / want16.norm())
        tol8 = W4A8_REL_TOL if t >= 300 else W4A8_FEW_TOKENS_REL_TOL
        assert err8 < tol8, f"seed {SEED} {geo.name} T={t}: {err8:.3e} from the W4A8 reference"
        # the accuracy trade is a statistic: over one token's few rows it reached 10.4% (run 311, Qwen3, seed
        # 364488) while the kernel held its exact-operand reference; held to the bound from 300 tokens
        if t >= 300:
            assert err16 < W4A16_REL_TOL, f"seed {SEED} {geo.name} T={t}: {err16:.3e} from W4A16"


@pytest.mark.usefixtures("frozen_runtime")
@pytest.mark.parametrize("fused", [True, False], ids=["fused-act", "act-pass"])
def test_w4a8_layer_bits_do_not_depend_on_what_padding_slots_hold(fused):
    """FC1's gather writes the routes' slots only: an expert's padding slots keep whatever the scratch held before
    (docs/moe-engine.md §8.2). The GEMMs compute a slot's row from that slot's bytes and scale alone and the combine
    reads routed slots only, so a scratch of zeros and one of 0xFF bytes (E4M3 NaN, NaN scales and bf16 rows) give the
    same output bits, all finite."""
    from csf_kernels.catalog import load_catalog
    from csf_moe.engine_layer import EngineMoE, call_buffer_bytes, call_buffers, engine_weights
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    layer = EngineMoE(engine_weights(ref, geo.activation, fused=fused, w4a8=True), geo.top_k)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in (7, 300):  # 56 and 2400 routes over 128 experts: most slots of the blocks in use are padding at 7
        x, ids, w = synthetic_routing(geo, t, gen)
        ids = ids.clone()
        ids[0, 0] = -1
        shapes = call_buffers(t, geo.top_k, geo.experts, geo.hidden, geo.intermediate, w4a8=True, fused=fused,
                              fc1_rows="pass", float_weights=w.dtype != torch.float32)  # fmt: skip
        outs = []
        for fill in (0, 0xFF):
            scratch = torch.full((call_buffer_bytes(shapes),), fill, dtype=torch.uint8, device="cuda")
            out = torch.full_like(x, float("nan"))
            layer.call(x, ids, w, out, scratch=scratch)()
            outs.append(out)
        assert torch.isfinite(outs[1].float()).all(), f"seed {SEED} T={t}: a padding slot reached the output"
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), f"seed {SEED} T={t}"


@pytest.mark.usefixtures("frozen_runtime")
def test_w4a8_layer_replays_new_routings_in_a_graph():
    from csf_kernels.catalog import load_catalog
    from csf_moe.engine_layer import EngineMoE, engine_weights
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    layer = EngineMoE(engine_weights(ref, geo.activation, w4a8=True), geo.top_k)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    x, ids, w = synthetic_routing(geo, 700, gen)
    out = torch.full_like(x, float("nan"))
    run = layer.call(x, ids, w, out)
    graph = captured(run)
    x2, ids2, w2 = synthetic_routing(geo, 700, gen)
    x.copy_(x2), ids.copy_(ids2), w.copy_(w2)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    replayed = out.clone()
    out.fill_(float("nan"))
    run()
    assert torch.equal(replayed, out), "graph replay differs from the eager call"
    assert torch.isfinite(out.float()).all()
