"""The engine's dense FP4 x bf16 GEMM on the GPU (AOT-built, frozen): agrees with a float32 reference on the
dequantized weights to accumulation rounding, writes every output, is deterministic, and replays in a CUDA graph.

Fresh random data every run (the seed is in the test ids); outputs are poisoned with NaN before each launch."""

from __future__ import annotations

import os

import pytest
import torch

from csf_codec.quantize import dequantize_mxfp4
from csf_kernels import runtime
from csf_kernels.moe.engine import dense_fp4_gemm_launch, grouped_fp4_gemm_launch
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel
from csf_kernels.moe.engine_specs import ENGINE_TILE_N

from ..cuda_graphs import captured, replay_allocating_nothing

pytestmark = pytest.mark.gpu

SEED = int.from_bytes(os.urandom(3), "little")


def _operands(rows: int, k: int, n: int, seed: int, nan_row: int | None = None):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(112, 132, (rows, k // 32), dtype=torch.uint8, generator=g)
    scales[0, 0], scales[1, -1], scales[2, k // 64] = 0, 140, 129  # 2**-127 (subnormal product), bytes > 128
    if nan_row is not None:
        scales[nan_row, 1] = 255
    x = (torch.randn(n, k, generator=g) * 2.0).to(torch.bfloat16)
    w = dequantize_mxfp4(packed, scales).to(torch.bfloat16)  # the weights the kernel multiplies, rounded once
    dev = "cuda"
    return (
        engine_weight_panel(packed).to(dev),
        engine_scale_panel(scales).to(dev),
        x.to(dev),
        w.to(dev),
    )


def _run(w_panel, s_panel, x, rows, tile_n):
    out = torch.full((x.shape[0], rows), float("nan"), dtype=torch.bfloat16, device=x.device)
    runtime.freeze()
    try:
        bound = dense_fp4_gemm_launch(w_panel, s_panel, x, out, tile_n=tile_n).bind("engine dense test")
    finally:
        runtime.unfreeze()
    bound()
    torch.cuda.synchronize()
    return out, bound


def _check(out, x, w):
    ref = x.float() @ w.float().T
    bound = x.float().abs() @ w.float().abs().T
    err = (out.float() - ref).abs()
    tol = ref.abs() * 2.0**-8 + bound * 2.0**-16 + 1e-30
    finite = torch.isfinite(ref)
    assert torch.isfinite(out.float()[finite]).all(), "unwritten or wrong outputs (NaN poison left)"
    worst = (err[finite] / tol[finite]).max().item()
    assert worst <= 1.0, f"max error {worst:.2f}x the tolerance"


@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
@pytest.mark.parametrize(
    "rows,k,n",
    [(256, 2880, 300), (384, 128, 64), (128, 64, 1), (1152, 2880, 1000), (2880, 2880, 77), (64, 192, 5)],
    ids=lambda v: str(v),
)
def test_matches_reference(rows, k, n, tile_n):
    w_panel, s_panel, x, w = _operands(rows, k, n, SEED + rows + n)
    before = runtime.compilations()
    out, _ = _run(w_panel, s_panel, x, rows, tile_n)
    _check(out, x, w)
    out2, _ = _run(w_panel, s_panel, x, rows, tile_n)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)), "not deterministic"
    assert runtime.compilations() == before


def test_nan_scale_poisons_only_its_row():
    rows, k, n = 256, 640, 96
    w_panel, s_panel, x, w = _operands(rows, k, n, SEED, nan_row=77)
    out, _ = _run(w_panel, s_panel, x, rows, 128)
    assert torch.isnan(out[:, 77].float()).all()
    keep = torch.ones(rows, dtype=torch.bool, device=out.device)
    keep[77] = False
    _check(out[:, keep], x, w[keep])


def test_graph_replay_equals_eager():
    rows, k, n = 512, 1024, 512
    w_panel, s_panel, x, w = _operands(rows, k, n, SEED + 7)
    out, bound = _run(w_panel, s_panel, x, rows, 256)
    eager = out.clone()
    graph = captured(bound)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16))
    replay_allocating_nothing(graph)
    _check(out, x, w)


def _random_experts(experts: int, rows: int, k: int, seed: int):
    """Packed FP4 values [E, rows, K / 2] and E8M0 scales [E, rows, K / 32] (CPU), and their dequantized bf16 (GPU)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(112, 132, (experts, rows, k // 32), dtype=torch.uint8, generator=g)
    w = torch.stack([dequantize_mxfp4(packed[e], scales[e]) for e in range(experts)]).to(torch.bfloat16)
    return packed, scales, w.cuda()


def _panels(packed: torch.Tensor, scales: torch.Tensor):
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(packed.shape[0])])
    s_panel = torch.stack([engine_scale_panel(scales[e]) for e in range(scales.shape[0])])
    return w_panel.cuda(), s_panel.cuda()


def _experts(experts: int, rows: int, k: int, seed: int):
    packed, scales, w = _random_experts(experts, rows, k, seed)
    return (*_panels(packed, scales), w)


@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
def test_grouped_blocks_use_their_expert_and_invalid_ones_compute_zeros(tile_n):
    experts, rows, k, max_blocks = 5, 320, 640, 9
    w_panel, s_panel, w = _experts(experts, rows, k, SEED + tile_n)
    g = torch.Generator().manual_seed(SEED)
    x = (torch.randn(max_blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    ids = [3, 0, 0, -1, 4, experts, 2, 1, 3]  # -1 and E: outside the panels, inert
    used = 7  # blocks 7 and 8 are past meta[0]: never stored
    block_expert = torch.tensor(ids, dtype=torch.int32, device="cuda")
    meta = torch.tensor([used], dtype=torch.int32, device="cuda")
    out = torch.full((max_blocks * tile_n, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    runtime.freeze()
    try:
        launch = grouped_fp4_gemm_launch(w_panel, s_panel, x, out, block_expert, meta, tile_n=tile_n)
        bound = launch.bind("engine grouped test")
    finally:
        runtime.unfreeze()
    bound()
    torch.cuda.synchronize()
    for b, e in enumerate(ids):
        got = out[b * tile_n : (b + 1) * tile_n]
        if b >= used:
            assert torch.isnan(got.float()).all(), f"block {b} past meta[0] was written"
        elif not 0 <= e < experts:
            assert torch.equal(got.float(), torch.zeros_like(got.float())), f"invalid block {b} not zero"
        else:
            _check(got, x[b * tile_n : (b + 1) * tile_n], w[e])

    # a captured launch follows new block maps and counts (device data)
    graph = captured(bound)
    block_expert.copy_(torch.tensor([1, 2, 3, 4, 0, 0, 1, 2, 3], dtype=torch.int32))
    meta.fill_(max_blocks)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    for b, e in enumerate(block_expert.tolist()):
        _check(out[b * tile_n : (b + 1) * tile_n], x[b * tile_n : (b + 1) * tile_n], w[e])


@pytest.mark.parametrize(("activation", "with_bias"), [("silu", False), ("swiglu_oai", True)])
@pytest.mark.parametrize("tile_n", [16, 128, 256])
def test_fused_activation_epilogue_matches_the_reference(activation, with_bias, tile_n):
    """FC1 with its activation in the epilogue: W13 in engine order, each output the activation of the bf16-exact
    weights' products in float32 (one bf16 rounding, of the activated value)."""
    from csf_kernels.moe.engine_panels import fc1_engine_rows
    from csf_moe.reference import activation as reference_activation

    experts, inter, k, max_blocks = 3, 160, 384, 5  # 2N = 320 rows: a last tile of 64
    packed, scales, w = _random_experts(experts, 2 * inter, k, SEED + tile_n)  # rows in W13's own order
    perm = fc1_engine_rows(inter, interleaved=activation == "swiglu_oai")
    eng_panel, eng_scales = _panels(packed[:, perm], scales[:, perm])
    g = torch.Generator().manual_seed(SEED + 3)
    bias = (torch.randn(experts, 2 * inter, generator=g) * 0.5).cuda() if with_bias else None
    x = (torch.randn(max_blocks * tile_n, k, generator=g)).to(torch.bfloat16).cuda()
    block_expert = torch.tensor([2, 0, 1, -1, 2], dtype=torch.int32, device="cuda")
    meta = torch.tensor([max_blocks], dtype=torch.int32, device="cuda")
    out = torch.full((max_blocks * tile_n, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    runtime.freeze()
    try:
        eng_bias = None if bias is None else bias[:, perm.cuda()].contiguous()
        launch = grouped_fp4_gemm_launch(eng_panel, eng_scales, x, out, block_expert, meta, tile_n=tile_n,
                                         activation=activation, bias=eng_bias)  # fmt: skip
        bound = launch.bind("engine fused activation test")
    finally:
        runtime.unfreeze()
    bound()
    torch.cuda.synchronize()
    for b, e in enumerate(block_expert.tolist()):
        rows = slice(b * tile_n, (b + 1) * tile_n)
        if not 0 <= e < experts:
            continue  # computes the activation of zeros (and of a clamped expert's bias): unread by the layer
        h = x[rows].float() @ w[e].float().T
        if bias is not None:
            h = h + bias[e]
        want = reference_activation(h, activation)
        err = (out[rows].float() - want).abs()
        tol = want.abs() * 2.0**-7 + 1e-2 * (x[rows].float().abs() @ w[e].float().abs().T).max(dim=1).values[:, None]
        assert torch.isfinite(out[rows].float()).all(), f"block {b}: unwritten outputs"
        assert (err <= tol).all(), f"block {b}: max error {err.max().item():.3e}"
