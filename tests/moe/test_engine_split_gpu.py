"""The engine GEMM's K splits on the GPU (AOT-built, frozen): split ``s``'s float32 partials are, bit for bit, what
the same program stores at one split on that K range alone (weights, scales and activations sliced there), native
and inline scale sources give the same partial bits (a CTA walking many split units included: the inline decoder
starts each at its first record and streams the next one's behind it), one split's partials round to the gathering
GEMM's bf16 output, FC1's ``[gate; up]`` columns are the plain rows permuted, slots without a route store nothing,
and a captured split launch follows a new routing.

Fresh random data every run (the seed is in the messages); partial buffers are poisoned with NaN before each launch.
K = 576 (9 steps) gives MXFP4 a tail record and an odd last split; 320 rows a 128-row tile half past the rows."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.moe.engine import grouped_fp4_gemm_launch
from csf_kernels.moe.engine_inline import inline_scales
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel
from csf_kernels.moe.engine_specs import ENGINE_SPLIT_TILE_N, engine_split_steps

from ..cuda_graphs import captured, replay_allocating_nothing
from .test_engine_gemm_gpu import _routed_slots, _scales
from .test_engine_inline_gpu import _planes

pytestmark = pytest.mark.gpu

SEED = int.from_bytes(os.urandom(3), "little")
FORMATS = ("mxfp4", "nvfp4")
_BLOCK = {"mxfp4": 32, "nvfp4": 16}
EXPERTS, TOP_K = 4, 3


def _rows(form: str) -> int:
    return 384 if form == "fc1" else 320  # FC1: 2N with N = 192; plain: a tile half past the rows


class _Problem:
    """Random experts (packed values, scale planes), NVFP4 global scales, tokens and a hand-made alignment."""

    def __init__(self, fmt: str, rows: int, k: int, tile_n: int, seed: int, synthetic: bool = False):
        g = torch.Generator().manual_seed(seed)
        self.fmt, self.rows, self.k, self.tile_n, self.seed = fmt, rows, k, tile_n, seed
        self.packed = torch.randint(0, 256, (EXPERTS, rows, k // 2), dtype=torch.uint8, generator=g)
        if synthetic:  # selector records with exceptions and escapes (expert 0 raw records)
            self.planes = _planes(fmt, EXPERTS, rows, k, seed)
        else:
            self.planes = _scales(fmt, (EXPERTS, rows, k // _BLOCK[fmt]), g)
        self.gscale = (torch.rand(EXPERTS, generator=g) * 2.0**-6 + 2.0**-7).cuda() if fmt == "nvfp4" else None
        self.tokens = 2 * tile_n + 3
        self.x = (torch.randn(self.tokens, k, generator=g) * 2).to(torch.bfloat16).cuda()
        self.sorted_ids, self.block_expert, self.meta, self.used = _routed_slots(self.tokens, TOP_K, EXPERTS,
                                                                                 tile_n, g)  # fmt: skip
        self.pairs = self.tokens * TOP_K

    def operands(self, scales: str, k0: int = 0, steps: int | None = None):
        """Weight panel, scales (panels or inline records) and x over K steps ``[k0, k0 + steps)``."""
        steps = self.k // 64 - k0 if steps is None else steps
        packed = self.packed[:, :, k0 * 32 : (k0 + steps) * 32]
        per = 64 // _BLOCK[self.fmt]
        planes = self.planes[:, :, k0 * per : (k0 + steps) * per].contiguous()
        w = torch.stack([engine_weight_panel(packed[e].contiguous()) for e in range(EXPERTS)]).cuda()
        if scales == "inline":
            s = inline_scales(planes.cuda(), self.fmt)
        else:
            s = torch.stack([engine_scale_panel(planes[e], self.fmt) for e in range(EXPERTS)]).cuda()
        x = self.x[:, k0 * 64 : (k0 + steps) * 64].contiguous()
        return w, s, x

    def bound(self, operands, out, **kw):
        w, s, x = operands
        routed = dict(io="gather", sorted_ids=self.sorted_ids, top_k=TOP_K)
        runtime.freeze()
        try:
            launch = grouped_fp4_gemm_launch(w, s, x, out, self.block_expert, self.meta, tile_n=self.tile_n,
                                             fmt=self.fmt, global_scale=self.gscale, **routed, **kw)  # fmt: skip
            return launch.bind("engine split test")
        finally:
            runtime.unfreeze()

    def partials(self, scales: str, form: str, splits: int, k0: int = 0, steps: int | None = None, **kw):
        """The partials ``[splits, pairs, R]`` of one launch into a NaN-poisoned buffer, and the bound launch."""
        part = torch.full((splits * self.pairs, self.rows), float("nan"), dtype=torch.float32, device="cuda")
        launch = self.bound(self.operands(scales, k0, steps), part, partial=form, splits=splits, **kw)
        launch()
        torch.cuda.synchronize()
        return part.view(splits, self.pairs, self.rows), launch


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))  # NaN payloads included


@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize("form", ["fc1", "rows"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_SPLIT_TILE_N)
@pytest.mark.parametrize(("k", "splits"), [(576, 2), (576, 3), (576, 5), (2880, 2), (2880, 5)])
def test_each_split_is_the_one_split_gemm_on_its_k_range(k, splits, tile_n, fmt, form, scales):
    seed = SEED + 17 * tile_n + 5 * splits + k + len(form)
    p = _Problem(fmt, _rows(form), k, tile_n, seed)
    part, _ = p.partials(scales, form, splits)
    step = engine_split_steps(k // 64, splits, fmt)
    for s in range(splits):
        k0 = s * step
        ref, _ = p.partials(scales, form, 1, k0, min(step, k // 64 - k0))
        assert _same(part[s], ref[0]), f"seed {seed}: split {s} (K steps {k0}..) differs from its range's GEMM"
    # every route has a slot (the hand-made alignment): every row of every split written, nothing else is
    assert torch.isfinite(part).all(), f"seed {seed}: an unwritten partial (NaN poison left)"


@pytest.mark.parametrize("form", ["fc1", "rows"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_SPLIT_TILE_N)
@pytest.mark.parametrize("max_ctas", [None, 1, 2, 5])
@pytest.mark.parametrize(("k", "splits"), [(576, 2), (576, 5), (2880, 3)])
def test_inline_partials_are_the_native_bits(k, splits, max_ctas, tile_n, fmt, form):
    seed = SEED + 3 * tile_n + splits + k + (max_ctas or 0)
    p = _Problem(fmt, _rows(form), k, tile_n, seed, synthetic=True)
    native, _ = p.partials("native", form, splits, max_ctas=max_ctas)
    inline, _ = p.partials("inline", form, splits, max_ctas=max_ctas)
    assert _same(native, inline), f"seed {seed}: inline partials differ from native ({max_ctas} CTAs)"
    assert not torch.isnan(native).all(dim=-1).any(), f"seed {seed}: a route's partial row unwritten"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tile_n", ENGINE_SPLIT_TILE_N)
def test_one_split_rounds_to_the_gathering_gemms_output(tile_n, fmt):
    """The plain partial is the accumulator the bf16 GEMM rounds (after NVFP4's global scale): slot ``i``'s
    output row is its route's partial row, rounded."""
    seed = SEED + tile_n + 101
    p = _Problem(fmt, 320, 576, tile_n, seed)
    part, _ = p.partials("native", "rows", 1)
    slots = p.sorted_ids.numel()
    out = torch.full((slots, p.rows), float("nan"), dtype=torch.bfloat16, device="cuda")
    p.bound(p.operands("native"), out)()
    torch.cuda.synchronize()
    n = p.used * tile_n
    ids = p.sorted_ids[:n]
    live = (ids >= 0) & (ids < p.pairs)
    acc = part[0][ids[live].long()]
    if p.gscale is not None:
        acc = acc * p.gscale[p.block_expert[torch.arange(n, device="cuda")[live] // tile_n].long()][:, None]
    assert torch.equal(acc.to(torch.bfloat16).view(torch.int16), out[:n][live].view(torch.int16)), f"seed {seed}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_fc1_partials_are_the_rows_partials_in_gate_up_columns(fmt):
    """Engine row ``j`` of W13 (16-row slabs: 8 gate rows of outputs ``8 m ..``, then their up rows) lands at
    column ``n`` (gate) or ``N + n`` (up) of the FC1 partials."""
    seed = SEED + 202
    p = _Problem(fmt, 384, 576, 16, seed)
    rows, _ = p.partials("native", "rows", 3)
    fc1, _ = p.partials("native", "fc1", 3)
    j = torch.arange(p.rows, device="cuda")
    n = (j // 16) * 8 + j % 8
    col = torch.where(j % 16 < 8, n, p.rows // 2 + n)
    assert _same(fc1[..., col], rows), f"seed {seed}: FC1's columns are not the engine rows' [gate; up] places"


@pytest.mark.parametrize("scales", ["native", "inline"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_captured_split_launch_follows_a_new_routing(fmt, scales):
    seed = SEED + 303
    p = _Problem(fmt, 320, 2880, 16, seed)  # random scale bytes: no NaN scale, so every partial is finite
    part, launch = p.partials(scales, "rows", 5)
    graph = captured(launch)
    p.sorted_ids.copy_(p.sorted_ids.flip(0))  # a new routing (device data), the spare block now first and in use
    p.meta.fill_(p.used + 1)
    part.fill_(float("nan"))
    replay_allocating_nothing(graph)
    torch.cuda.synchronize()
    eager, _ = p.partials(scales, "rows", 5)
    assert _same(part, eager), f"seed {seed}: the replayed split launch differs from a fresh one"
    assert torch.isfinite(part).all(), f"seed {seed}: the replay left a route's partial unwritten"
