"""Transform warps (schedule ``transform``: producer warps convert the weights into bf16 A tiles that the consumers'
wgmmas read from shared memory; ``csf_kernels.moe.kernels.engine_transform``) on the GPU, AOT-built and frozen, from
native scale panels and from inline engine records (one decoder warp beside two transform warps): the slice
schedule's native bits, which the other GPU tests hold to the float32 reference, on block-order rows at
K step counts with and without a remainder over more units than SMs (the A tiles' phases wrapping across units),
invalid blocks inert, FC1 with its activation and ragged tails, scattering FC2, one-multiply row blocks, and the
layer at every token count. Fresh random data (the seed is in the messages); outputs poisoned with NaN first."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.engine import grouped_fp4_gemm_launch
from csf_kernels.moe.engine_inline import inline_scales
from csf_kernels.moe.engine_specs import ENGINE_TRANSFORM_TILE_N
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

from .test_engine_gemm_gpu import FORMATS, _check, _panels, _random_experts, _routed_slots

pytestmark = pytest.mark.gpu
SEED = int.from_bytes(os.urandom(3), "little")


def _launch(*args, schedule: str, **kwargs) -> torch.Tensor:
    """One frozen launch of ``schedule`` into its NaN-poisoned ``out`` (args as grouped_fp4_gemm_launch's)."""
    runtime.freeze()
    try:
        launch = grouped_fp4_gemm_launch(*args, schedule=schedule, **kwargs)
        assert launch.spec.fact.get("SCHED", "slice") == schedule, launch.spec.describe()
        launch.bind(f"engine {schedule} test")()
    finally:
        runtime.unfreeze()
    torch.cuda.synchronize()
    return args[3]


def _both(make_out, *args, inline=None, **kwargs) -> dict[str, torch.Tensor]:
    """The slice schedule from native panels and the transform warps from ``inline`` records where given (the same
    rows' scales), else from the same panels."""
    outs = {"slice": _launch(*args[:3], make_out(), *args[3:], schedule="slice", **kwargs)}
    transform_args = args if inline is None else (args[0], inline, *args[2:])
    outs["transform"] = _launch(*transform_args[:3], make_out(), *transform_args[3:], schedule="transform", **kwargs)
    return outs


@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_TRANSFORM_TILE_N)
@pytest.mark.parametrize("k", [64, 256, 448, 2880], ids=lambda k: f"k{k}")
def test_transform_gives_the_slice_schedules_bits(k, tile_n, fmt, scales):
    """Block-order rows: 1, 4, 7 and 45 K steps a unit, 9 row tiles x 40 blocks (each CTA walks several units, the A
    tiles' phases wrapping), blocks of expert -1 and E computing zeros."""
    experts, rows, blocks = 3, 1152, 40
    packed, planes, gscale, w = _random_experts(experts, rows, k, SEED + k + tile_n, fmt)
    w_panel, s_panel = _panels(packed, planes, fmt)
    inline = inline_scales(planes.cuda(), fmt) if scales == "inline" else None
    g = torch.Generator().manual_seed(SEED + 3)
    x = (torch.randn(blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    ids = torch.randint(-1, experts + 1, (blocks,), generator=g, dtype=torch.int32)
    block_expert, meta = ids.cuda(), torch.tensor([blocks], dtype=torch.int32, device="cuda")

    def out():
        return torch.full((blocks * tile_n, rows), float("nan"), dtype=torch.bfloat16, device="cuda")

    outs = _both(out, w_panel, s_panel, x, block_expert, meta, inline=inline, tile_n=tile_n, fmt=fmt,
                 global_scale=gscale)  # fmt: skip
    assert torch.equal(outs["slice"].view(torch.int16), outs["transform"].view(torch.int16)), f"seed {SEED}"
    for b in (0, blocks // 2, blocks - 1):  # and right, not merely equal
        e, span = int(ids[b]), slice(b * tile_n, (b + 1) * tile_n)
        if 0 <= e < experts:
            _check(outs["transform"][span], x[span], w[e])
        else:
            assert torch.equal(outs["transform"][span].float(), torch.zeros_like(outs["transform"][span].float()))


@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_TRANSFORM_TILE_N)
def test_transform_routed_fc1_and_fc2_give_the_slice_schedules_bits(tile_n, fmt, scales):
    """FC1 on block-order rows with its route ids (ragged tails in the half loop) and its activation fused, and
    FC2 scattering to the routes: the slice schedule's bits on every live slot, NaN-free where stored."""
    experts, rows, k, top_k = 4, 256, 640, 3
    tokens = 3 * tile_n + 5
    packed, planes, gscale, _ = _random_experts(experts, rows, k, SEED + tile_n + 7, fmt)
    w_panel, s_panel = _panels(packed, planes, fmt)
    inline = inline_scales(planes.cuda(), fmt) if scales == "inline" else None
    g = torch.Generator().manual_seed(SEED + 9)
    sorted_ids, block_expert, meta, used = _routed_slots(tokens, top_k, experts, tile_n, g)
    slots, pairs = sorted_ids.numel(), tokens * top_k
    sorted_ids[3 * tile_n // 8 : tile_n] = pairs  # block 0 runs its first half only
    live = ((sorted_ids >= 0) & (sorted_ids < pairs))[: used * tile_n]
    xs = torch.randn(slots, k, generator=g).to(torch.bfloat16).cuda()
    common = dict(tile_n=tile_n, fmt=fmt, global_scale=gscale, sorted_ids=sorted_ids)
    fc1 = _both(lambda: torch.full((slots, rows // 2), float("nan"), dtype=torch.bfloat16, device="cuda"),
                w_panel, s_panel, xs, block_expert, meta, pairs=pairs, activation="silu", inline=inline,
                **common)  # fmt: skip
    fc2 = _both(lambda: torch.full((pairs, rows), float("nan"), dtype=torch.bfloat16, device="cuda"),
                w_panel, s_panel, xs, block_expert, meta, io="scatter", inline=inline, **common)  # fmt: skip
    for name, outs in (("FC1", {s: o[: used * tile_n][live] for s, o in fc1.items()}), ("FC2", fc2)):
        assert torch.isfinite(outs["transform"].float()).any(), f"{name}: nothing stored"
        assert torch.equal(outs["slice"].view(torch.int16), outs["transform"].view(torch.int16)), (
            f"seed {SEED}: {name} differs"
        )


@pytest.mark.parametrize("tile_n", ENGINE_TRANSFORM_TILE_N)
def test_transform_one_multiply_blocks_give_two_multiplies_bits(tile_n):
    """MXFP4 row blocks flagged narrow convert with one multiply a pair in the transform warps too: the bits of
    two, a wide block beside them keeping two."""
    from csf_kernels.moe.launch import wide_row_tiles

    experts, rows, k, blocks = 3, 256, 640, 12
    g = torch.Generator().manual_seed(SEED + tile_n + 53)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    planes = torch.randint(100, 129, (experts, rows, k // 32), dtype=torch.uint8, generator=g)
    planes[0, 3, 1], planes[1, 70, 2], planes[2, 5, 0] = 255, 0, 200  # NaN, the subnormal scale, a wide block
    wide = wide_row_tiles(planes.cuda())
    w_panel, s_panel = _panels(packed, planes)
    x = (torch.randn(blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    block_expert = torch.arange(blocks, dtype=torch.int32, device="cuda") % experts
    meta = torch.tensor([blocks], dtype=torch.int32, device="cuda")
    outs = []
    for flags in (None, wide):
        out = torch.full((blocks * tile_n, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(_launch(w_panel, s_panel, x, out, block_expert, meta, tile_n=tile_n, wide=flags,
                            schedule="transform"))  # fmt: skip
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), f"seed {SEED}: one multiply differs"


GEOMETRIES = [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "mxfp4"), ("qwen3-30b-a3b", 1, "nvfp4")]


@pytest.mark.usefixtures("frozen_runtime")
@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES, ids=[f"{m}-tp{t}-{f}" for m, t, f in GEOMETRIES])
def test_transform_layer_gives_the_default_layers_bits(model, tp, fmt, scales):
    """``EngineMoE(schedule="transform")``: the default layer's bits at every token count, padding routes included;
    where the call's blocks hold 64 to 256 routes both GEMMs run transform programs (FC1 reads the gather pass)."""
    geo = load_catalog().moe_geometry(model, tp, fmt)
    reference = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    weights = engine_weights(reference, geo.activation, scale_source=scales)
    layers = {s: EngineMoE(weights, geo.top_k, schedule=s) for s in (None, "transform")}
    gen = torch.Generator(device="cuda").manual_seed(SEED + 2)
    served = []
    for t in (1, 7, 300, 1500, 5000, 8192):
        x, ids, w = synthetic_routing(geo, t, gen)
        if t >= 7:
            ids = ids.clone()
            ids[0, 0], ids[-1, -1] = -1, geo.experts
        outs = {}
        for schedule, layer in layers.items():
            outs[schedule] = torch.full_like(x, float("nan"))
            launches, _ = layer.launches(x, ids, w, outs[schedule])
            gemms = [launch.spec for launch in launches if launch.spec.kernel == "moe.engine_gemm"]
            if schedule and gemms[0].fact["TN"] >= 64:
                assert all(spec.fact.get("SCHED") == "transform" for spec in gemms), (t, gemms)
                served.append(t)
            layer.call(x, ids, w, outs[schedule])()
        assert torch.isfinite(outs["transform"].float()).all(), f"seed {SEED} {geo.name} T={t}: unwritten outputs"
        assert torch.equal(outs["transform"], outs[None]), f"seed {SEED} {geo.name} T={t}: transform differs"
    assert 8192 in served, served
