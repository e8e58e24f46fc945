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

from ..cuda_graphs import replay_allocating_nothing

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
    out.fill_(float("nan"))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        bound()  # warm up on the capture stream
        torch.cuda.synchronize()
        out.fill_(float("nan"))
        with torch.cuda.graph(graph, stream=stream):
            bound()
    replay_allocating_nothing(graph)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16))
    replay_allocating_nothing(graph)
    _check(out, x, w)


def _experts(experts: int, rows: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(112, 132, (experts, rows, k // 32), dtype=torch.uint8, generator=g)
    w = torch.stack([dequantize_mxfp4(packed[e], scales[e]) for e in range(experts)]).to(torch.bfloat16)
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(experts)])
    s_panel = torch.stack([engine_scale_panel(scales[e]) for e in range(experts)])
    return w_panel.cuda(), s_panel.cuda(), w.cuda()


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
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        bound()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            bound()
    block_expert.copy_(torch.tensor([1, 2, 3, 4, 0, 0, 1, 2, 3], dtype=torch.int32))
    meta.fill_(max_blocks)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    for b, e in enumerate(block_expert.tolist()):
        _check(out[b * tile_n : (b + 1) * tile_n], x[b * tile_n : (b + 1) * tile_n], w[e])
