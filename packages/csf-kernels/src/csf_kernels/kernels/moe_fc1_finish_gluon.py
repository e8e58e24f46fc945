"""Gluon: FC1's finish inside a few-token FC2 program (the decode GEMM's ``FIN``), so no kernel runs between them.

A routed FC2 program (one route, one K split) needs FC1's activations of its own K range only. It sums FC1's
float32 partials over the splits in split order, then global scale, bias and the activation: the same float32
steps, in the same order, as ``moe_finish`` (Triton), four K steps at a time, so one round trip per four splits
(the partials copied into shared memory by cp.async) is on its critical path instead of a launch boundary and a
kernel. The bf16 result goes to shared memory, [FIN_STEPS, BM, BK], one K step per stage, copied into each of the
block's BM route rows (the program's K loop reads a step's [BM, BK] as the unfused program reads its staged
activations; only the first row's route is live).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .moe_gemm import SWIGLU_ALPHA, SWIGLU_LIMIT

# K steps of a fused FC2 program's range held as activations (bf16: 2 KB MXFP4, 1 KB NVFP4); csf_moe plans such
# programs' splits so that no range is longer (moe_specs.FIN_STEPS mirrors it)
FIN_STEPS = gl.constexpr(8)
# K steps finished together, one a warp; their partials come through shared memory by cp.async, a round of
# splits at once (the whole activation buffer, written only after the sums), so no register budget limits what
# is in flight (loaded into registers, ptxas kept 2-4 of a round's loads in flight)
_CHUNK = gl.constexpr(4)
_SPLITS_PER_ROUND = gl.constexpr(4)  # splits copied together: [4 x 2, _CHUNK, BK] float32, the bytes of xf
_ALPHA = gl.constexpr(SWIGLU_ALPHA.value)
_LIMIT = gl.constexpr(SWIGLU_LIMIT.value)


@gluon.constexpr_function
def finish_layout(BK, num_warps):
    # [_CHUNK, BM, BK]: a warp's lanes along one step's columns (BK / 32 contiguous each), warps over the chunk's
    # steps; the sums are computed in its slice without the route rows, [_CHUNK, BK]
    return gl.BlockedLayout([1, 1, BK // 32], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit
def _finish_chunk(
    xf, part, bias, gscale, splits, route, pairs, e, t, steps, N, FIN: gl.constexpr, HAS_BIAS: gl.constexpr,
    HAS_GSCALE: gl.constexpr, BK: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """The activations of K steps [t, t + _CHUNK) (zero past ``steps`` and N), [_CHUNK, BK] bf16, the partials
    staged in ``xf``'s bytes."""
    L: gl.constexpr = gl.SliceLayout(1, finish_layout(BK, num_warps))
    # [split, half] pieces of [_CHUNK, BK]
    stage = xf._reinterpret(gl.float32, [2 * _SPLITS_PER_ROUND, _CHUNK, BK],
                            gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))  # fmt: skip
    j = gl.expand_dims(gl.arange(0, _CHUNK, layout=gl.SliceLayout(1, L)), 1)
    n = (t + j) * BK + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, L)), 0)
    nm = (t + j < steps) & (n < N)
    acc_a = gl.zeros([_CHUNK, BK], gl.float32, L)
    acc_b = gl.zeros([_CHUNK, BK], gl.float32, L)
    for s0 in range(0, splits, _SPLITS_PER_ROUND):
        # every thread copies the 16-byte pieces it sums and reads back only its own (no barrier between); a
        # masked piece is zero-filled: adding a masked split's 0.0 changes no sum (never -0.0)
        for u in gl.static_range(_SPLITS_PER_ROUND):
            row = ((s0 + u) * pairs + route).to(gl.int64) * (2 * N)
            live = nm & (s0 + u < splits)
            async_copy.async_copy_global_to_shared(stage.index(2 * u), part + row + n, mask=live)
            async_copy.async_copy_global_to_shared(stage.index(2 * u + 1), part + row + N + n, mask=live)
        async_copy.commit_group()
        async_copy.wait_group(0)
        for u in gl.static_range(_SPLITS_PER_ROUND):  # in split order, as moe_finish sums them
            acc_a += stage.index(2 * u).load(L)
            acc_b += stage.index(2 * u + 1).load(L)
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
    return gl.where(nm, y, 0.0).to(gl.bfloat16)


@gluon.jit
def _to_route_rows(xf, y, BM: gl.constexpr, BK: gl.constexpr, num_warps: gl.constexpr):
    """``y`` [_CHUNK, BK] into each route row of ``xf`` [_CHUNK, BM, BK]."""
    L3: gl.constexpr = finish_layout(BK, num_warps)
    xf.store(gl.broadcast(gl.expand_dims(y, 1), gl.zeros([_CHUNK, BM, BK], gl.bfloat16, layout=L3))[0])


@gluon.jit
def fc1_finish_to_shared(
    xf, part, bias, gscale, splits, route, pairs, e, t0, steps, N, FIN: gl.constexpr, HAS_BIAS: gl.constexpr,
    HAS_GSCALE: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Route ``route``'s (expert ``e``) FC1 activations of K steps [t0, steps) (columns past N: zero) from the
    partials ``part`` [splits, pairs, 2N] into each route row of ``xf`` [FIN_STEPS, BM, BK] bf16 (the second
    chunk's stages, where the range ends before it: not written, never read). ``FIN``: 1 SiLU-and-mul, 2
    gpt-oss's clamped SwiGLU."""
    gl.static_assert(FIN_STEPS == 2 * _CHUNK, "two chunks of steps")
    gl.static_assert(_SPLITS_PER_ROUND * 2 * _CHUNK * BK * 4 == FIN_STEPS * BM * BK * 2, "a round fills xf")
    y0 = _finish_chunk(xf, part, bias, gscale, splits, route, pairs, e, t0, steps, N, FIN, HAS_BIAS, HAS_GSCALE,
                       BK, num_warps)  # fmt: skip
    more = t0 + _CHUNK < steps
    if more:
        gl.thread_barrier()  # every thread's reads of the last round before this chunk's copies overwrite them
        y1 = _finish_chunk(xf, part, bias, gscale, splits, route, pairs, e, t0 + _CHUNK, steps, N, FIN, HAS_BIAS,
                           HAS_GSCALE, BK, num_warps)  # fmt: skip
    else:
        y1 = gl.zeros_like(y0)
    gl.thread_barrier()  # every thread's staged partials read before the activations overwrite them
    _to_route_rows(xf.slice(0, _CHUNK), y0, BM, BK, num_warps)
    if more:
        _to_route_rows(xf.slice(_CHUNK, _CHUNK), y1, BM, BK, num_warps)
