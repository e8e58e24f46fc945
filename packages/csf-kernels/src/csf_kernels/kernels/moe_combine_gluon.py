"""Gluon: the top-k weighted sum inside a few-token FC2 program that finishes FC1 (the decode GEMM's ``FIN``), so
a routed call is two kernels, FC1 -> FC2, with no combine kernel after them.

Every FC2 program of a live route counts itself in, once it has stored its float32 partial, on an arrival
counter of its token and 64-column output tile (an ``acq_rel`` atomic at GPU scope after a CTA barrier, so
the partial is visible to whoever reads the count). The program that arrives last (the count reaches the
token's live routes times FC2's splits) sums the tile as ``moe_combine`` does: per slot the partials in split
order, FC2's global scale and bias, then the top-k weighted sum in float32, rounded once to bf16. Whichever
program is last, the same values are added in the same order, so the output is deterministic. Counters live
in the call's scratch: the FC1 program (0, 0, 0) zeroes them after it has waited for its predecessor (the
previous call's FC2 is then done with them), and FC2 counts only after it has waited for FC1. A token whose
every slot is padding has no FC2 program: the programs of its first slot's route write its zero rows.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# slots a token's combine holds (top-k padded): csf_kernels.moe.COMBINE_MAX_SLOTS checks the geometry at launch
MAX_SLOTS = gl.constexpr(16)
_ZERO_CHUNK = gl.constexpr(512)


@gluon.constexpr_function
def _tile_layout(BN, num_warps):
    # [MAX_SLOTS, BN]: a warp's lanes along the columns, warps over the slots
    return gl.BlockedLayout([1, BN // 32], [1, 32], [num_warps, 1], [1, 0])


@gluon.jit
def zero_arrivals(arrivals, count, num_warps: gl.constexpr):
    """The call's ``count`` arrival counters set to 0 (FC1's first program, after its predecessor is done)."""
    L: gl.constexpr = gl.BlockedLayout([4], [32], [num_warps], [0])
    i = gl.arange(0, _ZERO_CHUNK, layout=L)
    for i0 in range(0, count, _ZERO_CHUNK):
        gl.store(arrivals + i0 + i, gl.zeros([_ZERO_CHUNK], gl.int32, L), mask=i0 + i < count)


@gluon.jit
def _token_slots(ids, token, top_k, num_experts, IDS64: gl.constexpr, layout: gl.constexpr):
    """Token ``token``'s slots (routes) [MAX_SLOTS] and which of them name an expert in [0, E)."""
    j = gl.arange(0, MAX_SLOTS, layout=layout)
    route = token * top_k + j
    if IDS64:
        e = gl.load(ids.to(gl.pointer_type(gl.int64)) + route, mask=j < top_k, other=-1)
    else:
        e = gl.load(ids + route, mask=j < top_k, other=-1)
    live = (j < top_k) & (e >= 0) & (e < num_experts)
    return route, gl.where(live, e, 0).to(gl.int64), live


@gluon.jit
def live_slots(ids, token, top_k, num_experts, IDS64: gl.constexpr, BN: gl.constexpr, num_warps: gl.constexpr):
    """How many of token ``token``'s slots name an expert (a scalar)."""
    SL: gl.constexpr = gl.SliceLayout(1, _tile_layout(BN, num_warps))
    _, _, live = _token_slots(ids, token, top_k, num_experts, IDS64, SL)
    return gl.sum(live.to(gl.int32), axis=0)


@gluon.jit
def write_zero_tile(out, token, tile, H, BN: gl.constexpr, num_warps: gl.constexpr):
    """A token without a live slot: its output columns of ``tile`` are 0."""
    CL: gl.constexpr = gl.SliceLayout(0, _tile_layout(BN, num_warps))
    cols = tile * BN + gl.arange(0, BN, layout=CL)
    gl.store(out + token.to(gl.int64) * H + cols, gl.zeros([BN], gl.bfloat16, CL), mask=cols < H)


@gluon.jit
def combine_if_last(
    part, gscale, bias, ids, topk_weights, out, arrivals, token, tile, expected, pairs, splits, top_k, H,
    num_experts, IDS64: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GSCALE: gl.constexpr, BN: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """Count this program's partial in (its stores done) and, if it is the last of ``expected`` for its token and
    column tile, write that tile of ``out`` [T, H] from FC2's partials ``part`` [splits, pairs, H]."""
    gl.thread_barrier()  # every thread's partial stores before the count that publishes them
    counter = arrivals + token * gl.num_programs(1) + tile
    if gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == expected - 1:
        TL: gl.constexpr = _tile_layout(BN, num_warps)
        route, e, live = _token_slots(ids, token, top_k, num_experts, IDS64, gl.SliceLayout(1, TL))
        cols = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, TL))
        m = gl.expand_dims(live, 1) & gl.expand_dims(cols < H, 0)
        v = gl.zeros([MAX_SLOTS, BN], gl.float32, TL)
        for s in range(0, splits):  # in split order; .cg: other SMs wrote these, never cached in this L1
            row = (s * pairs + route).to(gl.int64) * H
            v += gl.load(part + gl.expand_dims(row, 1) + gl.expand_dims(cols, 0), mask=m, other=0.0,
                         cache_modifier=".cg")  # fmt: skip
        if HAS_GSCALE:
            v = v * gl.expand_dims(gl.load(gscale + e, mask=live, other=0.0), 1)
        if HAS_BIAS:
            v += gl.load(bias + gl.expand_dims(e * H, 1) + gl.expand_dims(cols, 0), mask=m, other=0.0)
        wt = gl.load(topk_weights + route, mask=live, other=0.0)
        acc = gl.sum(gl.where(m, gl.expand_dims(wt, 1) * v, 0.0), axis=0)
        gl.store(out + token.to(gl.int64) * H + cols, acc.to(gl.bfloat16), mask=cols < H)
