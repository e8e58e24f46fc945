"""The engine's inline scale source on the GPU (AOT-built, frozen): a GEMM whose producer warp decodes engine records
writes the same bits as the same GEMM reading native scale panels, MXFP4 and NVFP4, plain and with FC1's fused
activation, at every block size, with invalid and unused blocks, after graph replay with new block maps, and
through the whole engine layer.

Fresh random data every run (the seed is in the messages); every output is poisoned with NaN before each launch.
The random scales make raw records (uniform bytes), the synthetic planes selector records with exceptions and
escapes; K = 576 gives MXFP4 a tail record (18 scale columns) and 320 rows a 128-row tile half past the expert.
Unwritten outputs would stay NaN where the native GEMM (held to a float32 reference in test_engine_gemm_gpu.py)
writes values."""

from __future__ import annotations

import os

import pytest
import torch

from csf_codec.synthetic import DOWN_PROJ_DENSE, synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.engine import grouped_fp4_gemm_launch
from csf_kernels.moe.engine_inline import inline_scales
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel, fc1_engine_rows
from csf_kernels.moe.engine_specs import ENGINE_TILE_N
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

from ..cuda_graphs import captured, replay_allocating_nothing
from .padding_routes import with_padding_routes

pytestmark = pytest.mark.gpu

SEED = int.from_bytes(os.urandom(3), "little")
_BLOCK = {"mxfp4": 32, "nvfp4": 16}


def _planes(fmt: str, experts: int, rows: int, k: int, seed: int) -> torch.Tensor:
    """Scale bytes [E, rows, K / block]: expert 0 uniform bytes (raw records), the others a dense-exception
    synthetic plane (selector records, exceptions, escapes); a NaN scale in expert 1."""
    g = torch.Generator().manual_seed(seed)
    cols = k // _BLOCK[fmt]
    stats = DOWN_PROJ_DENSE if fmt == "mxfp4" else None
    planes = synthetic_scale_plane((experts, rows, cols), fmt, stats, seed=seed % 1000)
    planes[0] = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=g)
    planes[1, 5, 1] = 255 if fmt == "mxfp4" else 0x7F
    return planes


def _launch(w_panel, scales, x, out, block_expert, meta, tile_n, fmt, gscale, **kw):
    runtime.freeze()
    try:
        return grouped_fp4_gemm_launch(w_panel, scales, x, out, block_expert, meta, tile_n=tile_n, fmt=fmt,
                                       global_scale=gscale, **kw).bind("engine inline test")  # fmt: skip
    finally:
        runtime.unfreeze()


def _both(w_panel, planes, x, cols_out, block_expert, meta, tile_n, fmt, gscale, rows_out=None, **kw):
    """Native and inline outputs of one launch each (NaN-poisoned first, ``rows_out`` rows: ``x``'s by default)
    and their bound launches."""
    native = torch.stack([engine_scale_panel(planes[e], fmt) for e in range(planes.shape[0])]).cuda()
    inline = inline_scales(planes.cuda(), fmt)
    outs, bound = [], []
    for scales in (native, inline):
        out = torch.full((rows_out or x.shape[0], cols_out), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch = _launch(w_panel, scales, x, out, block_expert, meta, tile_n, fmt, gscale, **kw)
        launch()
        outs.append(out)
        bound.append(launch)
    torch.cuda.synchronize()
    return outs, bound


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))  # NaN payloads included


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
def test_inline_equals_native_grouped(tile_n, fmt):
    experts, rows, k, max_blocks = 4, 320, 576, 8
    seed = SEED + tile_n
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    planes = _planes(fmt, experts, rows, k, seed)
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(experts)]).cuda()
    gscale = (torch.rand(experts, generator=g) * 2.0**-6 + 2.0**-7).cuda() if fmt == "nvfp4" else None
    x = (torch.randn(max_blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    block_expert = torch.tensor([1, 0, -1, 3, experts, 2, 1, 0], dtype=torch.int32, device="cuda")
    meta = torch.tensor([6], dtype=torch.int32, device="cuda")  # blocks 6 and 7: never stored
    (native, inline), (_, bound) = _both(w_panel, planes, x, rows, block_expert, meta, tile_n, fmt, gscale)
    assert _same(native, inline), f"seed {seed}: inline differs from native"
    assert torch.isnan(inline[6 * tile_n :].float()).all(), "blocks past meta[0] written"

    graph = captured(bound)  # the inline launch follows new block maps in a graph
    block_expert.copy_(torch.tensor([3, 2, 1, 0, 0, 1, 2, 3], dtype=torch.int32))
    meta.fill_(max_blocks)
    inline.fill_(float("nan"))
    replay_allocating_nothing(graph)
    (native2, _), _ = _both(w_panel, planes, x, rows, block_expert, meta, tile_n, fmt, gscale)
    assert _same(native2, inline), f"seed {seed}: replayed inline differs from native"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tile_n", [16, 128])
@pytest.mark.parametrize("max_ctas", [1, 2, 5])
@pytest.mark.parametrize("k", [576, 128])
def test_inline_equals_native_when_a_cta_walks_many_units(k, max_ctas, tile_n, fmt):
    """A capped grid makes each CTA walk many units: the decoder warps stream the next unit's records behind the
    current one's (warm starts), restart cold after invalid blocks, cross tail tiles and expert changes, and take
    turns across units (K = 128: one MXFP4 record a unit, so a unit has work for one of the three warps); the same
    bits."""
    experts, rows, max_blocks = 4, 320, 12
    seed = SEED + 11 * tile_n + max_ctas + k
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    planes = _planes(fmt, experts, rows, k, seed)
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(experts)]).cuda()
    gscale = (torch.rand(experts, generator=g) * 2.0**-6 + 2.0**-7).cuda() if fmt == "nvfp4" else None
    x = (torch.randn(max_blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    block_expert = torch.tensor([1, 0, -1, -1, 3, experts, 2, 1, 1, 0, 3, 2], dtype=torch.int32, device="cuda")
    meta = torch.tensor([11], dtype=torch.int32, device="cuda")  # block 11: never stored
    (native, inline), _ = _both(w_panel, planes, x, rows, block_expert, meta, tile_n, fmt, gscale,
                                max_ctas=max_ctas)  # fmt: skip
    assert _same(native, inline), f"seed {seed}: inline differs from native with {max_ctas} CTAs"
    assert torch.isnan(inline[11 * tile_n :].float()).all(), "a block past meta[0] written"
    assert not torch.isnan(inline[: 11 * tile_n].float()).all(dim=1).any(), f"seed {seed}: a used row unwritten"


@pytest.mark.parametrize(("activation", "fmt"), [("swiglu_oai", "mxfp4"), ("silu", "nvfp4")])
@pytest.mark.parametrize("tile_n", [16, 128, 256])
def test_inline_equals_native_fused_fc1(activation, fmt, tile_n):
    experts, inter, k, max_blocks = 3, 160, 2880 if fmt == "mxfp4" else 384, 4
    seed = SEED + 5 * tile_n
    g = torch.Generator().manual_seed(seed)
    perm = fc1_engine_rows(inter, interleaved=activation == "swiglu_oai")
    packed = torch.randint(0, 256, (experts, 2 * inter, k // 2), dtype=torch.uint8, generator=g)[:, perm]
    planes = _planes(fmt, experts, 2 * inter, k, seed)[:, perm].contiguous()
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(experts)]).cuda()
    gscale = (torch.rand(experts, generator=g) * 2.0**-6 + 2.0**-7).cuda() if fmt == "nvfp4" else None
    bias = (torch.randn(experts, 2 * inter, generator=g) * 0.5).cuda() if activation == "swiglu_oai" else None
    x = torch.randn(max_blocks * tile_n, k, generator=g).to(torch.bfloat16).cuda()
    block_expert = torch.tensor([2, 0, 1, 2], dtype=torch.int32, device="cuda")
    meta = torch.tensor([max_blocks], dtype=torch.int32, device="cuda")
    ids = torch.arange(x.shape[0], dtype=torch.int32, device="cuda")  # fused FC1 is built gathering: identity
    (native, inline), _ = _both(w_panel, planes, x, inter, block_expert, meta, tile_n, fmt, gscale,
                                activation=activation, bias=bias, io="gather", sorted_ids=ids)  # fmt: skip
    assert _same(native, inline), f"seed {seed}: inline FC1 differs from native"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
def test_inline_equals_native_routed(tile_n, fmt):
    """FC1's gather (producer warps 0, 1, 3 beside the decoder warp 2) and FC2's scatter: the same bits as the
    native programs (whose gather uses all four producer warps), with empty slots, a padding route, an invalid
    block and a block past meta[0]."""
    experts, rows, k, max_blocks, tokens, top_k = 4, 320, 576, 6, 24, 2
    pairs, slots = tokens * top_k, max_blocks * tile_n
    seed = SEED + 7 * tile_n
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    planes = _planes(fmt, experts, rows, k, seed)
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(experts)]).cuda()
    gscale = (torch.rand(experts, generator=g) * 2.0**-6 + 2.0**-7).cuda() if fmt == "nvfp4" else None
    ids = torch.full((slots,), pairs, dtype=torch.int32)  # empty slots hold a value past the routes
    where = torch.randperm(slots, generator=g)[:pairs]
    ids[where] = torch.randperm(pairs, generator=g).to(torch.int32)
    ids[where[0]] = -1  # a padding route
    sorted_ids = ids.cuda()
    block_expert = torch.tensor([1, 0, -1, 3, 2, 1], dtype=torch.int32, device="cuda")
    meta = torch.tensor([5], dtype=torch.int32, device="cuda")  # block 5: never read or stored
    x = (torch.randn(tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
    (native, inline), _ = _both(w_panel, planes, x, rows, block_expert, meta, tile_n, fmt, gscale, rows_out=slots,
                                io="gather", sorted_ids=sorted_ids, top_k=top_k)  # fmt: skip
    assert _same(native, inline), f"seed {seed}: inline gather differs from native"
    # expert 1's NaN scale poisons one column; an unwritten row would be NaN throughout
    assert not torch.isnan(inline[: 5 * tile_n].float()).all(dim=1).any(), f"seed {seed}: a used block's row unwritten"
    assert torch.isnan(inline[5 * tile_n :].float()).all(), f"seed {seed}: a block past meta[0] written"
    xs = (torch.randn(slots, k, generator=g) * 2).to(torch.bfloat16).cuda()
    (native, inline), _ = _both(w_panel, planes, xs, rows, block_expert, meta, tile_n, fmt, gscale, rows_out=pairs,
                                io="scatter", sorted_ids=sorted_ids)  # fmt: skip
    assert _same(native, inline), f"seed {seed}: inline scatter differs from native"
    used = ids[: 5 * tile_n]
    stored = torch.zeros(pairs, dtype=torch.bool)
    stored[used[(used >= 0) & (used < pairs)].long()] = True
    assert torch.equal(~torch.isnan(inline.float()).all(dim=1).cpu(), stored), f"seed {seed}: rows stored"


LAYERS = [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "mxfp4"), ("qwen3-30b-a3b", 1, "nvfp4")]


@pytest.mark.usefixtures("frozen_runtime")
@pytest.mark.parametrize(("model", "tp", "fmt"), LAYERS, ids=[f"{m}-tp{t}-{f}" for m, t, f in LAYERS])
def test_inline_layer_equals_native_layer(model, tp, fmt):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    native = EngineMoE(engine_weights(ref, geo.activation), geo.top_k)
    inline = EngineMoE(engine_weights(ref, geo.activation, scale_source="inline"), geo.top_k)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in (1, 8, 128, 512, 3000):
        x, ids, w = synthetic_routing(geo, t, gen)
        ids = with_padding_routes(ids, geo.experts, invalid=[-1])  # a padding route: inert in both
        outs = []
        for layer in (native, inline):
            out = torch.full_like(x, float("nan"))
            run = layer.call(x, ids, w, out)
            run()
            if layer is inline and t == 128:  # and in a graph, replayed on new routes
                graph = captured(run)
                x2, ids2, w2 = synthetic_routing(geo, t, gen)
                x.copy_(x2), ids.copy_(ids2), w.copy_(w2)
                out.fill_(float("nan"))
                replay_allocating_nothing(graph)
                want = torch.full_like(x, float("nan"))
                native.call(x, ids, w, want)()
                assert _same(out, want), f"seed {SEED} {geo.name}: replayed inline layer differs"
                out = torch.full_like(x, float("nan"))
                run = layer.call(x, ids, w, out)
                run()
                outs[0] = torch.full_like(x, float("nan"))
                native.call(x, ids, w, outs[0])()
            outs.append(out)
        assert _same(outs[0], outs[1]), f"seed {SEED} {geo.name} T={t}: inline layer differs from native"
