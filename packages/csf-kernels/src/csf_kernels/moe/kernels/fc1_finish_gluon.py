"""Gluon: FC1's finish inside a few-token FC2 program (the decode GEMM's ``FIN``), so no kernel runs between them.

A routed FC2 program (one route, one K split) needs FC1's activations of its own K range only. It sums FC1's
float32 partials over the splits in split order, then global scale, bias and the activation: the same float32
steps, in the same order, as ``moe_finish`` (Triton), for every column of the range at once, so one round of
loads (per four splits) is on its critical path instead of a launch boundary and a kernel. The bf16 result
goes to shared memory, [FIN_STEPS, BM, BK], one K step per stage, copied into each of the block's BM route rows
(the program's K loop reads a step's [BM, BK] as the unfused program reads its staged activations; only the
first row's route is live).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from csf_kernels.moe.kernels.gemm import SWIGLU_ALPHA, SWIGLU_LIMIT

# K steps of a fused FC2 program's range held as activations (bf16: 2 KB MXFP4, 1 KB NVFP4); csf_moe plans such
# programs' splits so that no range is longer (moe_specs.FIN_STEPS mirrors it)
FIN_STEPS = gl.constexpr(8)
# partial splits loaded together in whole rounds; the rest a split at a time. In the SASS of a one-token FC2 (72
# registers) ptxas keeps about half of a whole round's 16 loads a thread in flight, far fewer of a round masked by
# the split count, and all 4 of a split's; measured faster than masked rounds of four, rounds of two or copies
# through cp.async (docs/perf-notes.md, "FC2 finishes FC1 in few-token routed calls")
_SPLITS_PER_ROUND = gl.constexpr(4)
_ALPHA = gl.constexpr(SWIGLU_ALPHA.value)
_LIMIT = gl.constexpr(SWIGLU_LIMIT.value)


@gluon.constexpr_function
def finish_layout(BK, num_warps):
    # [FIN_STEPS, BM, BK]: a warp's lanes along one step's columns (BK / 32 contiguous each), warps over the
    # steps; the sums are computed in its slice without the route rows, [FIN_STEPS, BK]
    return gl.BlockedLayout([1, 1, BK // 32], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit
def fc1_finish_to_shared(
    xf, part, bias, gscale, splits, route, pairs, e, t0, steps, N, FIN: gl.constexpr, HAS_BIAS: gl.constexpr,
    HAS_GSCALE: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Route ``route``'s (expert ``e``) FC1 activations of K steps [t0, steps) (columns past N: zero) from the
    partials ``part`` [splits, pairs, 2N] into each route row of ``xf`` [FIN_STEPS, BM, BK] bf16. ``FIN``: 1
    SiLU-and-mul, 2 gpt-oss's clamped SwiGLU."""
    L3: gl.constexpr = finish_layout(BK, num_warps)
    L: gl.constexpr = gl.SliceLayout(1, L3)
    j = gl.expand_dims(gl.arange(0, FIN_STEPS, layout=gl.SliceLayout(1, L)), 1)
    n = (t0 + j) * BK + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, L)), 0)
    nm = (t0 + j < steps) & (n < N)
    acc_a = gl.zeros([FIN_STEPS, BK], gl.float32, L)
    acc_b = gl.zeros([FIN_STEPS, BK], gl.float32, L)
    whole = splits - splits % _SPLITS_PER_ROUND
    for s0 in range(0, whole, _SPLITS_PER_ROUND):  # whole rounds: no split masked
        for u in gl.static_range(_SPLITS_PER_ROUND):
            row = ((s0 + u) * pairs + route).to(gl.int64) * (2 * N)
            acc_a += gl.load(part + row + n, mask=nm, other=0.0)
            acc_b += gl.load(part + row + N + n, mask=nm, other=0.0)
    for s in range(whole, splits):  # the rest a split a round (masked slots are not free)
        row = (s * pairs + route).to(gl.int64) * (2 * N)
        acc_a += gl.load(part + row + n, mask=nm, other=0.0)
        acc_b += gl.load(part + row + N + n, mask=nm, other=0.0)
    if HAS_GSCALE:
        g = gl.load(gscale + e)
        acc_a = acc_a * g
        acc_b = acc_b * g
    if HAS_BIAS:
        b_row = e.to(gl.int64) * (2 * N)
        acc_a += gl.load(bias + b_row + n, mask=nm, other=0.0)
        acc_b += gl.load(bias + b_row + N + n, mask=nm, other=0.0)
    if FIN == 1:
        y = acc_a / (1.0 + gl.exp(-acc_a)) * acc_b
    else:
        gate = gl.minimum(acc_a, _LIMIT)
        up = gl.minimum(gl.maximum(acc_b, -_LIMIT), _LIMIT)
        y = gate / (1.0 + gl.exp(-_ALPHA * gate)) * (up + 1.0)
    y = gl.expand_dims(gl.where(nm, y, 0.0).to(gl.bfloat16), 1)
    xf.store(gl.broadcast(y, gl.zeros([FIN_STEPS, BM, BK], gl.bfloat16, layout=L3))[0])
