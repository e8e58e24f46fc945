"""The engine's dense FP4 x bf16 GEMM on the GPU (AOT-built, frozen), MXFP4 and NVFP4: agrees with a float32
reference on the dequantized weights to accumulation rounding, writes every output, is deterministic, and replays in a
CUDA graph.

Fresh random data every run (the seed is in the test ids); outputs are poisoned with NaN before each launch. NVFP4's
global scales are not powers of two, so a GEMM that skipped or misplaced them fails the tolerance."""

from __future__ import annotations

import os

import pytest
import torch

from csf_codec.quantize import dequantize_mxfp4, dequantize_nvfp4
from csf_kernels import runtime
from csf_kernels.moe.engine import dense_fp4_gemm_launch, grouped_fp4_gemm_launch
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel
from csf_kernels.moe.engine_specs import (
    ENGINE_PAIRED_TILE_N,
    ENGINE_RAGGED_TILE_N,
    ENGINE_STAGE_TILE_N,
    ENGINE_TILE_N,
)

from ..cuda_graphs import captured, replay_allocating_nothing

pytestmark = pytest.mark.gpu

SEED = int.from_bytes(os.urandom(3), "little")
FORMATS = ("mxfp4", "nvfp4")
_BLOCK = {"mxfp4": 32, "nvfp4": 16}
_NAN = {"mxfp4": 255, "nvfp4": 0x7F}


def _scales(fmt: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random scale bytes with each format's edges: MXFP4 2**-127 (a subnormal product) and bytes > 128; NVFP4
    zero, the smallest subnormal, 448 and negative scales (E4M3's sign bit)."""
    k_blocks = shape[-1]
    if fmt == "mxfp4":
        s = torch.randint(112, 132, shape, dtype=torch.uint8, generator=g)
        s[..., 0, 0], s[..., 1, -1], s[..., 2, k_blocks // 2] = 0, 140, 129
        return s
    s = torch.randint(0x20, 0x48, shape, dtype=torch.uint8, generator=g)  # 2**-4 .. 2**1.75
    s[..., 0, 0], s[..., 1, -1], s[..., 2, k_blocks // 2], s[..., 3, 1], s[..., 4, 2] = 0x00, 0x01, 0x7E, 0xB8, 0x80
    return s


def _global_scales(experts: int, g: torch.Generator) -> torch.Tensor:
    """NVFP4 per-expert global scales as quantizers make them (amax / (6 * 448)): not powers of two."""
    return torch.rand(experts, generator=g) * 2.0**-6 + 2.0**-7


def _dequantized(fmt: str, packed: torch.Tensor, scales: torch.Tensor, gscale: torch.Tensor | None) -> torch.Tensor:
    """The weights the kernel multiplies: MXFP4 rounded once to bf16; NVFP4 the codec's float32 dequantization
    (the block products are exact in bf16; the global scale lands on the float32 accumulator)."""
    if fmt == "mxfp4":
        return dequantize_mxfp4(packed, scales).to(torch.bfloat16)
    return dequantize_nvfp4(packed, scales, gscale)


def _operands(rows: int, k: int, n: int, seed: int, nan_row: int | None = None, fmt: str = "mxfp4"):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = _scales(fmt, (rows, k // _BLOCK[fmt]), g)
    if nan_row is not None:
        scales[nan_row, 1] = _NAN[fmt]
    gscale = _global_scales(1, g) if fmt == "nvfp4" else None
    x = (torch.randn(n, k, generator=g) * 2.0).to(torch.bfloat16)
    w = _dequantized(fmt, packed, scales, gscale)
    dev = "cuda"
    return (
        engine_weight_panel(packed).to(dev),
        engine_scale_panel(scales, fmt).to(dev),
        x.to(dev),
        w.to(dev),
        None if gscale is None else gscale.to(dev),
    )


def _run(w_panel, s_panel, x, rows, tile_n, gscale=None):
    out = torch.full((x.shape[0], rows), float("nan"), dtype=torch.bfloat16, device=x.device)
    fmt = "mxfp4" if gscale is None else "nvfp4"
    runtime.freeze()
    try:
        launch = dense_fp4_gemm_launch(w_panel, s_panel, x, out, tile_n=tile_n, fmt=fmt, global_scale=gscale)
        bound = launch.bind("engine dense test")
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


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
@pytest.mark.parametrize(
    "rows,k,n",
    [(256, 2880, 300), (384, 128, 64), (128, 64, 1), (1152, 2880, 1000), (2880, 2880, 77), (64, 192, 5)],
    ids=lambda v: str(v),
)
def test_matches_reference(rows, k, n, tile_n, fmt):
    w_panel, s_panel, x, w, gscale = _operands(rows, k, n, SEED + rows + n, fmt=fmt)
    before = runtime.compilations()
    out, _ = _run(w_panel, s_panel, x, rows, tile_n, gscale)
    _check(out, x, w)
    out2, _ = _run(w_panel, s_panel, x, rows, tile_n, gscale)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)), "not deterministic"
    assert runtime.compilations() == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_scale_poisons_only_its_row(fmt):
    rows, k, n = 256, 640, 96
    w_panel, s_panel, x, w, gscale = _operands(rows, k, n, SEED, nan_row=77, fmt=fmt)
    out, _ = _run(w_panel, s_panel, x, rows, 128, gscale)
    assert torch.isnan(out[:, 77].float()).all()
    keep = torch.ones(rows, dtype=torch.bool, device=out.device)
    keep[77] = False
    _check(out[:, keep], x, w[keep])


@pytest.mark.parametrize("fmt", FORMATS)
def test_graph_replay_equals_eager(fmt):
    rows, k, n = 512, 1024, 512
    w_panel, s_panel, x, w, gscale = _operands(rows, k, n, SEED + 7, fmt=fmt)
    out, bound = _run(w_panel, s_panel, x, rows, 256, gscale)
    eager = out.clone()
    graph = captured(bound)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16))
    replay_allocating_nothing(graph)
    _check(out, x, w)
    if gscale is not None:  # the global scale is device data too: doubling it doubles every output exactly
        before = out.clone()
        gscale.mul_(2.0)
        replay_allocating_nothing(graph)
        assert torch.equal(out.float(), before.float() * 2)


def _random_experts(experts: int, rows: int, k: int, seed: int, fmt: str = "mxfp4"):
    """Packed FP4 values [E, rows, K / 2] and scale bytes [E, rows, K / block] (CPU), NVFP4's global scales and the
    dequantized weights (GPU)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    scales = _scales(fmt, (experts, rows, k // _BLOCK[fmt]), g)
    gscale = _global_scales(experts, g) if fmt == "nvfp4" else None
    w = torch.stack(
        [_dequantized(fmt, packed[e], scales[e], None if gscale is None else gscale[e]) for e in range(experts)]
    )
    return packed, scales, None if gscale is None else gscale.cuda(), w.cuda()


def _panels(packed: torch.Tensor, scales: torch.Tensor, fmt: str = "mxfp4"):
    w_panel = torch.stack([engine_weight_panel(packed[e]) for e in range(packed.shape[0])])
    s_panel = torch.stack([engine_scale_panel(scales[e], fmt) for e in range(scales.shape[0])])
    return w_panel.cuda(), s_panel.cuda()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
def test_grouped_blocks_use_their_expert_and_invalid_ones_compute_zeros(tile_n, fmt):
    experts, rows, k, max_blocks = 5, 320, 640, 9
    packed, scales, gscale, w = _random_experts(experts, rows, k, SEED + tile_n, fmt)
    w_panel, s_panel = _panels(packed, scales, fmt)
    g = torch.Generator().manual_seed(SEED)
    x = (torch.randn(max_blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    ids = [3, 0, 0, -1, 4, experts, 2, 1, 3]  # -1 and E: outside the panels, inert
    used = 7  # blocks 7 and 8 are past meta[0]: never stored
    block_expert = torch.tensor(ids, dtype=torch.int32, device="cuda")
    meta = torch.tensor([used], dtype=torch.int32, device="cuda")
    out = torch.full((max_blocks * tile_n, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    runtime.freeze()
    try:
        launch = grouped_fp4_gemm_launch(w_panel, s_panel, x, out, block_expert, meta, tile_n=tile_n, fmt=fmt,
                                         global_scale=gscale)  # fmt: skip
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


# the catalog's fused FC1 programs: gpt-oss's (MXFP4 only) and the SiLU geometries' (both formats)
FUSED = [("silu", False, "mxfp4"), ("swiglu_oai", True, "mxfp4"), ("silu", False, "nvfp4")]


@pytest.mark.parametrize(("activation", "with_bias", "fmt"), FUSED, ids=["-".join(map(str, c)) for c in FUSED])
@pytest.mark.parametrize("tile_n", [16, 128, 256])
def test_fused_activation_epilogue_matches_the_reference(activation, with_bias, fmt, tile_n):
    """FC1 with its activation in the epilogue: W13 in engine order, each output the activation of the bf16-exact
    weights' products in float32 (NVFP4: times the expert's global scale), one bf16 rounding, of the activated
    value."""
    from csf_kernels.moe.engine_panels import fc1_engine_rows
    from csf_moe.reference import activation as reference_activation

    experts, inter, k, max_blocks = 3, 160, 384, 5  # 2N = 320 rows: a last tile of 64
    packed, scales, gscale, w = _random_experts(experts, 2 * inter, k, SEED + tile_n, fmt)  # W13's own row order
    perm = fc1_engine_rows(inter, interleaved=activation == "swiglu_oai")
    eng_panel, eng_scales = _panels(packed[:, perm], scales[:, perm], fmt)
    g = torch.Generator().manual_seed(SEED + 3)
    bias = (torch.randn(experts, 2 * inter, generator=g) * 0.5).cuda() if with_bias else None
    x = (torch.randn(max_blocks * tile_n, k, generator=g)).to(torch.bfloat16).cuda()
    block_expert = torch.tensor([2, 0, 1, -1, 2], dtype=torch.int32, device="cuda")
    meta = torch.tensor([max_blocks], dtype=torch.int32, device="cuda")
    out = torch.full((max_blocks * tile_n, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    runtime.freeze()
    try:
        eng_bias = None if bias is None else bias[:, perm.cuda()].contiguous()
        scales = dict(fmt=fmt, global_scale=gscale)
        slots = torch.arange(max_blocks * tile_n, dtype=torch.int32, device="cuda")  # FC1 gathers: slot s, token s
        launch = grouped_fp4_gemm_launch(eng_panel, eng_scales, x, out, block_expert, meta, tile_n=tile_n,
                                         activation=activation, bias=eng_bias, io="gather", sorted_ids=slots,
                                         top_k=1, **scales)  # fmt: skip
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


def _grouped(w_panel, s_panel, x, rows, block_expert, meta, tile_n, fmt, gscale, schedule, **epilogue):
    """One frozen grouped launch of ``schedule`` into a NaN-poisoned output."""
    cols = rows // 2 if epilogue.get("activation") else rows
    out = torch.full((x.shape[0], cols), float("nan"), dtype=torch.bfloat16, device="cuda")
    runtime.freeze()
    try:
        launch = grouped_fp4_gemm_launch(w_panel, s_panel, x, out, block_expert, meta, tile_n=tile_n, fmt=fmt,
                                         global_scale=gscale, schedule=schedule, **epilogue)  # fmt: skip
        assert launch.spec.fact.get("SCHED", "slice") == schedule
        bound = launch.bind(f"engine {schedule} schedule test")
    finally:
        runtime.unfreeze()
    bound()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_STAGE_TILE_N)
@pytest.mark.parametrize("k", [64, 256, 448, 2880], ids=lambda k: f"k{k}")
def test_stage_schedule_gives_the_slice_schedules_bits(k, tile_n, fmt):
    """The stage schedule issues the same wgmmas in the same K order as the slice one: the same bits, at K step
    counts with no group (1 step), groups only (4), groups and a remainder (7, 45), over more units than SMs (each
    CTA walks several, the ring's phases wrapping across units), invalid blocks included."""
    experts, rows, blocks = 3, 1152, 48  # 9 row tiles x 48 blocks: 432 units
    packed, scales, gscale, w = _random_experts(experts, rows, k, SEED + k + tile_n, fmt)
    w_panel, s_panel = _panels(packed, scales, fmt)
    g = torch.Generator().manual_seed(SEED + 11)
    x = (torch.randn(blocks * tile_n, k, generator=g) * 2).to(torch.bfloat16).cuda()
    ids = torch.randint(-1, experts + 1, (blocks,), generator=g, dtype=torch.int32)  # -1 and E: inert
    block_expert, meta = ids.cuda(), torch.tensor([blocks], dtype=torch.int32, device="cuda")
    args = (w_panel, s_panel, x, rows, block_expert, meta, tile_n, fmt, gscale)
    slice_, stage = _grouped(*args, "slice"), _grouped(*args, "stage")
    assert torch.equal(slice_.view(torch.int16), stage.view(torch.int16)), "the schedules' outputs differ"
    for b in (0, blocks // 2, blocks - 1):  # and they are right, not merely equal
        e = int(ids[b])
        rows_b = slice(b * tile_n, (b + 1) * tile_n)
        if 0 <= e < experts:
            _check(stage[rows_b], x[rows_b], w[e])
        else:
            assert torch.equal(stage[rows_b].float(), torch.zeros_like(stage[rows_b].float()))


@pytest.mark.parametrize("tile_n", ENGINE_STAGE_TILE_N)
def test_stage_schedule_fused_fc1_gives_the_slice_schedules_bits(tile_n):
    """gpt-oss's FC1 (clamped SwiGLU and bias in the epilogue, the catalog's fused program): the same bits under
    both schedules."""
    from csf_kernels.moe.engine_panels import fc1_engine_rows

    experts, inter, k, blocks = 4, 1440, 2880, 24
    packed, scales, _, _ = _random_experts(experts, 2 * inter, k, SEED + 5 + tile_n)
    perm = fc1_engine_rows(inter, interleaved=True)
    w_panel, s_panel = _panels(packed[:, perm], scales[:, perm])
    g = torch.Generator().manual_seed(SEED + 13)
    bias = (torch.randn(experts, 2 * inter, generator=g) * 0.5)[:, perm].contiguous().cuda()
    x = torch.randn(blocks * tile_n, k, generator=g).to(torch.bfloat16).cuda()
    block_expert = torch.randint(0, experts, (blocks,), generator=g, dtype=torch.int32).cuda()
    meta = torch.tensor([blocks], dtype=torch.int32, device="cuda")
    args = (w_panel, s_panel, x, 2 * inter, block_expert, meta, tile_n, "mxfp4", None)
    fused = dict(activation="swiglu_oai", bias=bias)
    slice_, stage = _grouped(*args, "slice", **fused), _grouped(*args, "stage", **fused)
    assert torch.isfinite(stage.float()).all(), "unwritten outputs"
    assert torch.equal(slice_.view(torch.int16), stage.view(torch.int16)), "the schedules' outputs differ"


def _routed_slots(tokens: int, top_k: int, experts: int, tile_n: int, g: torch.Generator):
    """A hand-made alignment of ``tokens x top_k`` routes: blocks of ``tile_n`` slots per expert in random order,
    each block's tail the sentinel ``pairs``, plus one slot holding -1 and one past ``pairs`` (inert either way).
    Returns sorted_ids, block_expert, meta (GPU) and the routes' experts."""
    pairs = tokens * top_k
    route_expert = torch.randint(0, experts, (pairs,), generator=g)
    ids, blocks = [], []
    for e in torch.randperm(experts, generator=g).tolist():
        mine = (route_expert == e).nonzero().flatten()[torch.randperm(int((route_expert == e).sum()), generator=g)]
        for c in range(0, len(mine), tile_n):
            chunk = mine[c : c + tile_n].tolist()
            ids += chunk + [pairs] * (tile_n - len(chunk))
            blocks.append(e)
    sorted_ids = torch.tensor(ids + [pairs] * tile_n, dtype=torch.int32)  # one spare block past meta[0]
    empty = (sorted_ids[: len(ids)] == pairs).nonzero().flatten()
    if len(empty) >= 2:
        sorted_ids[empty[0]], sorted_ids[empty[1]] = -1, pairs + 5
    block_expert = torch.tensor([*blocks, 0], dtype=torch.int32)
    meta = torch.tensor([len(blocks)], dtype=torch.int32)
    return sorted_ids.cuda(), block_expert.cuda(), meta.cuda(), len(blocks)


def _bound(*args, **kwargs):
    runtime.freeze()
    try:
        return grouped_fp4_gemm_launch(*args, **kwargs).bind("engine routed rows test")
    finally:
        runtime.unfreeze()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_TILE_N)
def test_gather_and_scatter_equal_the_block_order_gemm(tile_n, fmt):
    """FC1's producer gather (x [tokens, K] by route) and FC2's epilogue scatter (rows at their routes) give the
    dense block-order GEMM's bits: gathered rows are the torch twin's block order (zeros in empty slots), each live
    route's row is stored once, and no other row of the output is touched (NaN poison stays)."""
    from csf_kernels.moe.engine_rows import gathered_x

    experts, rows, k, tokens, top_k = 4, 256, 640, 3 * tile_n + 5, 3
    packed, scales, gscale, _ = _random_experts(experts, rows, k, SEED + tile_n + 11, fmt)
    w_panel, s_panel = _panels(packed, scales, fmt)
    g = torch.Generator().manual_seed(SEED + 5)
    x = (torch.randn(tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
    sorted_ids, block_expert, meta, used = _routed_slots(tokens, top_k, experts, tile_n, g)
    slots = sorted_ids.numel()
    common = dict(tile_n=tile_n, fmt=fmt, global_scale=gscale)
    xs = gathered_x(x.cpu(), sorted_ids.cpu(), slots // tile_n, tile_n, top_k).cuda()
    dense = torch.full((slots, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    _bound(w_panel, s_panel, xs, dense, block_expert, meta, **common)()
    gathered = torch.full_like(dense, float("nan"))
    fc1 = _bound(w_panel, s_panel, x, gathered, block_expert, meta, io="gather", sorted_ids=sorted_ids,
                 top_k=top_k, **common)  # fmt: skip
    fc1()
    scattered = torch.full((tokens * top_k, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    fc2 = _bound(w_panel, s_panel, xs, scattered, block_expert, meta, io="scatter", sorted_ids=sorted_ids, **common)
    fc2()
    torch.cuda.synchronize()
    n = used * tile_n
    assert torch.equal(gathered[:n].view(torch.int16), dense[:n].view(torch.int16)), "gathered rows differ"
    assert torch.isnan(gathered[n:].float()).all(), "a block past meta[0] was stored"
    live = (sorted_ids[:n] >= 0) & (sorted_ids[:n] < tokens * top_k)
    routes = sorted_ids[:n][live].long()
    assert torch.equal(scattered[routes].view(torch.int16), dense[:n][live].view(torch.int16)), "scattered rows"
    untouched = torch.ones(tokens * top_k, dtype=torch.bool, device="cuda")
    untouched[routes] = False
    assert untouched.sum() == 0 or torch.isnan(scattered[untouched].float()).all(), "a row without a slot was stored"

    # captured, both follow a new routing (device data); PDL or not, the bits are the same
    graph1, graph2 = captured(fc1), captured(fc2)
    sorted_ids.copy_(sorted_ids.flip(0)), meta.fill_(used)
    gathered.fill_(float("nan")), scattered.fill_(float("nan"))
    replay_allocating_nothing(graph1), replay_allocating_nothing(graph2)
    g_plain = torch.full_like(gathered, float("nan"))
    s_plain = torch.full_like(scattered, float("nan"))
    runtime.set_pdl(False)
    try:
        plain1 = _bound(w_panel, s_panel, x, g_plain, block_expert, meta, io="gather", sorted_ids=sorted_ids,
                        top_k=top_k, **common)  # fmt: skip
        plain2 = _bound(w_panel, s_panel, xs, s_plain, block_expert, meta, io="scatter", sorted_ids=sorted_ids,
                        **common)  # fmt: skip
    finally:
        runtime.set_pdl(True)
    plain1(), plain2()
    torch.cuda.synchronize()
    assert torch.equal(gathered.view(torch.int16), g_plain.view(torch.int16)), "replayed gather differs"
    assert torch.equal(scattered.view(torch.int16), s_plain.view(torch.int16)), "replayed scatter differs"
    assert not torch.isnan(gathered[:n].float()).all(), "the replay stored nothing"


@pytest.mark.parametrize("tile_n", ENGINE_STAGE_TILE_N)
def test_stage_schedule_gathering_fc1_gives_the_slice_schedules_bits(tile_n):
    """FC1 gathering its routes' rows by ``cp.async``: the stage schedule's consumers fence each gathered stage
    before wgmma reads it, as the slice schedule's do; the same bits under both, every live slot written."""
    experts, rows, k, tokens, top_k = 4, 256, 2880, 3 * tile_n + 5, 3
    packed, scales, _, _ = _random_experts(experts, rows, k, SEED + tile_n + 17)
    w_panel, s_panel = _panels(packed, scales)
    g = torch.Generator().manual_seed(SEED + 19)
    x = (torch.randn(tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
    sorted_ids, block_expert, meta, used = _routed_slots(tokens, top_k, experts, tile_n, g)
    outs = {}
    for schedule in ("slice", "stage"):
        outs[schedule] = torch.full((sorted_ids.numel(), rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        _bound(w_panel, s_panel, x, outs[schedule], block_expert, meta, tile_n=tile_n, io="gather",
               sorted_ids=sorted_ids, top_k=top_k, schedule=schedule)()  # fmt: skip
    torch.cuda.synchronize()
    n = used * tile_n
    assert not torch.isnan(outs["stage"][:n].float()).any(), "unwritten slots"
    assert torch.equal(outs["slice"].view(torch.int16), outs["stage"].view(torch.int16)), "the schedules differ"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_RAGGED_TILE_N)
def test_ragged_blocks_give_the_whole_blocks_bits_on_live_slots(tile_n, fmt):
    """Ragged programs (level 1: a block whose live slots lie in its first half multiplies that half only; level 2:
    also one whose live slots lie in its first quarter that quarter): gathering FC1, FC1 on block-order rows with
    the route ids beside them, and scattering FC2 store the whole-block programs' bits on every live slot; the
    hand-made alignment gives tails below a quarter, between a quarter and a half and above half a block."""
    experts, rows, k, top_k = 4, 256, 640, 3
    tokens = 3 * tile_n + 5  # about 2.25 blocks an expert: random tails on both sides of half a block
    packed, scales, gscale, _ = _random_experts(experts, rows, k, SEED + tile_n + 31, fmt)
    w_panel, s_panel = _panels(packed, scales, fmt)
    g = torch.Generator().manual_seed(SEED + 37)
    x = (torch.randn(tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
    sorted_ids, block_expert, meta, used = _routed_slots(tokens, top_k, experts, tile_n, g)
    slots, pairs = sorted_ids.numel(), tokens * top_k
    # blocks 0-2 cut to an eighth, three eighths and five eighths of their slots (their routes' rows unstored):
    # a tail in each of the quarter, half and whole loops whatever the draw
    for b, eighths in enumerate((1, 3, 5)):
        sorted_ids[b * tile_n + eighths * tile_n // 8 : (b + 1) * tile_n] = pairs
    live = ((sorted_ids >= 0) & (sorted_ids < pairs))[: used * tile_n]
    tails = [int(live[b * tile_n : (b + 1) * tile_n].sum()) for b in range(used)]
    assert any(n <= tile_n // 4 for n in tails) and any(tile_n // 4 < n <= tile_n // 2 for n in tails), tails
    assert any(n > tile_n // 2 for n in tails), tails
    xs = torch.randn(slots, k, generator=g).to(torch.bfloat16).cuda()
    common = dict(tile_n=tile_n, fmt=fmt, global_scale=gscale, sorted_ids=sorted_ids)
    outs = {}
    for ragged in (0, 1, 2):
        fc1 = torch.full((slots, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        fc1_dense = torch.full_like(fc1, float("nan"))
        fc2 = torch.full((pairs, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        runtime.freeze()
        try:
            launches = [
                grouped_fp4_gemm_launch(w_panel, s_panel, x, fc1, block_expert, meta, io="gather", top_k=top_k,
                                        ragged=ragged, **common),
                grouped_fp4_gemm_launch(w_panel, s_panel, xs, fc1_dense, block_expert, meta, pairs=pairs,
                                        ragged=ragged, **common),
                grouped_fp4_gemm_launch(w_panel, s_panel, xs, fc2, block_expert, meta, io="scatter", ragged=ragged,
                                        **common),
            ]  # fmt: skip
            assert all(launch.spec.fact.get("RAG", 0) == int(ragged) for launch in launches)
            for launch in launches:
                launch.bind("engine ragged test")()
        finally:
            runtime.unfreeze()
        torch.cuda.synchronize()
        outs[ragged] = fc1[: used * tile_n][live], fc1_dense[: used * tile_n][live], fc2
    for level in (1, 2):
        for name, whole, part in zip(("gathered FC1", "dense FC1", "scattered FC2"), outs[0], outs[level], strict=True):
            assert torch.isfinite(part.float()).any(), f"{name}: nothing stored"
            assert torch.equal(whole.view(torch.int16), part.view(torch.int16)), f"seed {SEED}: level {level} {name}"


@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_PAIRED_TILE_N)
def test_two_ctas_an_sm_give_one_ctas_bits(tile_n, fmt, scales):
    """The paired programs (two CTAs an SM, 96 consumer registers, grid twice the SMs, the stage schedule)
    gathering FC1's rows, scattering FC2's and on block-order rows: the bits of the one-CTA programs of the slice
    schedule (built at every size), every live slot written."""
    from csf_kernels.moe.engine_inline import inline_scales

    experts, rows, k, top_k = 4, 256, 640, 3
    tokens = 40 * tile_n + 3  # more units than two CTAs a SM walk at once
    packed, scales_, gscale, _ = _random_experts(experts, rows, k, SEED + tile_n + 41, fmt)
    w_panel, s_panel = _panels(packed, scales_, fmt)
    if scales == "inline":
        s_panel = inline_scales(scales_.cuda(), fmt)
    g = torch.Generator().manual_seed(SEED + 43)
    x = (torch.randn(tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
    sorted_ids, block_expert, meta, used = _routed_slots(tokens, top_k, experts, tile_n, g)
    slots, pairs = sorted_ids.numel(), tokens * top_k
    xs = torch.randn(slots, k, generator=g).to(torch.bfloat16).cuda()
    common = dict(tile_n=tile_n, fmt=fmt, global_scale=gscale, sorted_ids=sorted_ids)
    outs = {}
    for occ, schedule in ((1, "slice"), (2, "stage")):
        fc1 = torch.full((slots, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        dense = torch.full_like(fc1, float("nan"))
        fc2 = torch.full((pairs, rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        runtime.freeze()
        try:
            launches = [
                grouped_fp4_gemm_launch(w_panel, s_panel, x, fc1, block_expert, meta, io="gather", top_k=top_k,
                                        schedule=schedule, ctas_per_sm=occ, **common),
                grouped_fp4_gemm_launch(w_panel, s_panel, xs, dense, block_expert, meta, pairs=pairs,
                                        schedule=schedule, ctas_per_sm=occ, **common),
                grouped_fp4_gemm_launch(w_panel, s_panel, xs, fc2, block_expert, meta, io="scatter",
                                        schedule=schedule, ctas_per_sm=occ, **common),
            ]  # fmt: skip
            assert all(launch.spec.fact.get("OCC", 1) == occ for launch in launches)
            for launch in launches:
                launch.bind("engine paired test")()
        finally:
            runtime.unfreeze()
        torch.cuda.synchronize()
        outs[occ] = fc1[: used * tile_n], dense[: used * tile_n], fc2
    for name, one, two in zip(("gathered FC1", "dense FC1", "scattered FC2"), outs[1], outs[2], strict=True):
        assert torch.isfinite(two.float()).any(), f"{name}: nothing stored"
        assert torch.equal(one.view(torch.int16), two.view(torch.int16)), f"seed {SEED}: paired {name} differs"


@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize("tile_n", [16, 64, 256])
def test_one_multiply_blocks_give_two_multiplies_bits(tile_n, scales):
    """MXFP4 row blocks flagged narrow (every E8M0 byte <= 128 or 255) convert each pair with one multiply by
    2**126 times its scale: the bits of two multiplies, gathering FC1 and on block-order rows; a block flagged wide
    keeps two (its bytes 129..254 would overflow the one factor)."""
    from csf_kernels.moe.engine_inline import inline_scales
    from csf_kernels.moe.launch import wide_row_tiles

    experts, rows, k, top_k = 3, 256, 640, 2
    tokens = 3 * tile_n + 5
    g = torch.Generator().manual_seed(SEED + tile_n + 53)
    packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=g)
    planes = torch.randint(100, 129, (experts, rows, k // 32), dtype=torch.uint8, generator=g)
    planes[0, 3, 1], planes[1, 70, 2], planes[2, 200, 4] = 255, 0, 128  # NaN, the subnormal scale, the edge
    planes[2, 5, 0] = 200  # expert 2's first 64-row block is wide
    wide = wide_row_tiles(planes.cuda())
    assert wide.sum().item() == 1 and wide[2, 0].item() == 1
    w_panel, s_panel = _panels(packed, planes)
    if scales == "inline":
        s_panel = inline_scales(planes.cuda(), "mxfp4")
    x = (torch.randn(tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
    sorted_ids, block_expert, meta, used = _routed_slots(tokens, top_k, experts, tile_n, g)
    outs = {}
    for flags in (None, wide):
        out = torch.full((sorted_ids.numel(), rows), float("nan"), dtype=torch.bfloat16, device="cuda")
        runtime.freeze()
        try:
            launch = grouped_fp4_gemm_launch(w_panel, s_panel, x, out, block_expert, meta, tile_n=tile_n,
                                             io="gather", sorted_ids=sorted_ids, top_k=top_k, wide=flags)  # fmt: skip
            launch.bind("engine wide test")()
        finally:
            runtime.unfreeze()
        torch.cuda.synchronize()
        outs[flags is None] = out[: used * tile_n]
    assert not torch.isnan(outs[False].float()).all(), "nothing stored"
    assert torch.equal(outs[True].view(torch.int16), outs[False].view(torch.int16)), (
        f"seed {SEED}: one multiply differs"
    )
