"""Triton: group a batch's (token, slot) routes by expert into blocks of ``BM`` routes.

Three launches, all sized by the plan (graph-safe; nothing depends on a host-side count), or one where
every route fits one chunk (``SCATTER``: the plan program counts and scatters them itself, after a CTA barrier
which orders its cursor and sentinel stores before the atomics; two launches fewer at decode batch sizes):

* ``moe_align_count``: one program a ``PLAN_CHUNKS * CH`` routes counts its routes of each expert into a row
  of ``EP`` counts, written at the start of ``sorted_ids`` (which the plan fills with sentinels only after it has
  read them). One program counting every route took 55-58 us at 49-65k routes (run 319): ~3 us a 4096-route
  histogram.
* ``moe_align_plan`` (one program): sums the count programs' rows (``SCATTER``: counts the routes itself), lays
  the experts' blocks out
  back to back (each expert's count rounded up to ``BM``), writes each block's expert, a cursor per
  expert (its first route slot), the list of active experts (-1 padded, for routed-experts-only scale
  expansion), the number of blocks, and fills every used route slot with the sentinel ``pairs``.
* ``moe_align_scatter``: each route takes the next slot of its expert with an atomic add.

A call of one token aligns in ``moe_align_routes`` instead (one warp, no atomics, no pass over the experts'
bins): its routes go to distinct experts (a router's top-k), so each route is a block of its own, which is
what the two programs above would produce, in another order (a block's position changes nothing in a GEMM's
output). Should two routes of the token name one expert, each still gets its block: exact either way.

``INV`` programs also write each route's slot (``route_slots [pairs]``, -1 for a route that joins no block): the
engine's gather pass copies a token's row once to its routes' slots with it (kernels/engine_glue.py).

Route ids outside [0, E) (vLLM's CUDA-graph padding) join no block: they are computed by nobody and
the combine step skips them. Within a block the order of routes is whatever the atomics produced; a
GEMM's output row for a route does not depend on its position in the block, so results are exact
regardless.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.moe.specs import ALIGN_COUNT_CHUNKS
from csf_kernels.runtime.pdl import await_predecessor

SIGNATURE_PLAN = {
    "topk_ids": "*i32",  # or *i64: IDS64
    "cursor": "*i32",  # [EP]
    "block_expert": "*i32",  # [max_blocks]
    "active_experts": "*i32",  # [max_active]
    "meta": "*i32",  # [0]: blocks used
    "sorted_ids": "*i32",  # [max_blocks * BM]
    "route_slots": "*i32",  # [pairs] (INV), each route's slot or -1
    "pairs": "i32",
    "num_experts": "i32",
    "max_active": "i32",
    "IDS64": "constexpr",
    "EP": "constexpr",  # power of two > num_experts: bin EP - 1 collects invalid ids
    "BM": "constexpr",
    "CH": "constexpr",
    "SCATTER": "constexpr",  # 1: pairs <= CH, the routes scattered here too (no moe_align_scatter launch)
    "INV": "constexpr",  # 1: route_slots written too (SCATTER)
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}

SIGNATURE_ROUTES = {
    "topk_ids": "*i32",  # or *i64: IDS64
    "block_expert": "*i32",  # [>= pairs]
    "active_experts": "*i32",  # [max_active]
    "meta": "*i32",  # [0]: blocks used
    "sorted_ids": "*i32",  # [>= pairs * BM]
    "route_slots": "*i32",  # [pairs] (INV)
    "pairs": "i32",
    "num_experts": "i32",
    "max_active": "i32",
    "IDS64": "constexpr",
    "P": "constexpr",  # a power of two >= pairs
    "BM": "constexpr",
    "INV": "constexpr",
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}

SIGNATURE_COUNT = {
    "topk_ids": "*i32",  # or *i64: IDS64
    "counts": "*i32",  # [programs, EP]: the start of sorted_ids
    "pairs": "i32",
    "num_experts": "i32",
    "IDS64": "constexpr",
    "EP": "constexpr",
    "CH": "constexpr",
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}

SIGNATURE_SCATTER = {
    "topk_ids": "*i32",
    "cursor": "*i32",
    "sorted_ids": "*i32",
    "route_slots": "*i32",  # [pairs] (INV)
    "pairs": "i32",
    "num_experts": "i32",
    "IDS64": "constexpr",
    "CH": "constexpr",
    "INV": "constexpr",
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}


PLAN_CHUNKS: tl.constexpr = tl.constexpr(ALIGN_COUNT_CHUNKS)  # chunks of CH routes a count program
COUNT_ROWS: tl.constexpr = tl.constexpr(8)  # count programs' rows the plan sums a load


@triton.jit
def _route_experts(topk_ids, offs, pairs, num_experts, IDS64: tl.constexpr):
    """(expert as int32, valid) of routes ``offs``; ids are range-checked before any narrowing."""
    m = offs < pairs
    if IDS64:
        e64 = tl.load(topk_ids.to(tl.pointer_type(tl.int64)) + offs, mask=m, other=-1)
        valid = m & (e64 >= 0) & (e64 < num_experts)
        e = tl.where(valid, e64, 0).to(tl.int32)
    else:
        e = tl.load(topk_ids + offs, mask=m, other=-1)
        valid = m & (e >= 0) & (e < num_experts)
        e = tl.where(valid, e, 0)
    return e, valid


@triton.jit
def _pad_active(active_experts, n_active, max_active, W: tl.constexpr):
    """-1 in the active list's entries from ``n_active`` on, ``W`` at a time."""
    for start in range(n_active, max_active, W):
        offs = start + tl.arange(0, W)
        tl.store(active_experts + offs, tl.full([W], -1, tl.int32), mask=offs < max_active)


@triton.jit
def moe_align_plan(
    topk_ids,
    cursor,
    block_expert,
    active_experts,
    meta,
    sorted_ids,
    route_slots,
    pairs,
    num_experts,
    max_active,
    IDS64: tl.constexpr,
    EP: tl.constexpr,
    BM: tl.constexpr,
    CH: tl.constexpr,
    SCATTER: tl.constexpr,
    INV: tl.constexpr,
    PDL: tl.constexpr,
):
    await_predecessor(PDL)
    ex = tl.arange(0, EP)
    counts = tl.zeros([EP], dtype=tl.int32)
    if SCATTER:  # one chunk of routes
        e, valid = _route_experts(topk_ids, tl.arange(0, CH), pairs, num_experts, IDS64)
        counts += tl.histogram(tl.where(valid, e, EP - 1), EP)
    else:  # the count programs' rows, COUNT_ROWS a load
        for p0 in range(0, tl.cdiv(pairs, PLAN_CHUNKS * CH), COUNT_ROWS):
            p = p0 + tl.arange(0, COUNT_ROWS)
            rows = tl.load(sorted_ids + p[:, None] * EP + ex[None, :], mask=p[:, None] * (PLAN_CHUNKS * CH) < pairs,
                           other=0)  # fmt: skip
            counts += tl.sum(rows, 0)
        tl.debug_barrier()  # every row read before the sentinels below overwrite them
    counts = tl.where(ex < num_experts, counts, 0)
    nblk = (counts + BM - 1) // BM
    blk_end = tl.cumsum(nblk, 0)
    blk_start = blk_end - nblk
    total = tl.sum(nblk, 0)
    tl.store(cursor + ex, blk_start * BM)
    most = tl.max(nblk, 0)
    for j in range(0, most):
        tl.store(block_expert + blk_start + j, ex, mask=j < nblk)
    active = counts > 0
    slot = tl.cumsum(active.to(tl.int32), 0) - 1
    tl.store(active_experts + slot, ex, mask=active & (slot < max_active))
    _pad_active(active_experts, tl.sum(active.to(tl.int32), 0), max_active, CH)
    for start in range(0, total * BM, CH):
        offs = start + tl.arange(0, CH)
        tl.store(sorted_ids + offs, tl.full([CH], 0, tl.int32) + pairs, mask=offs < total * BM)
    tl.store(meta, total)
    if SCATTER:  # every route in one chunk (the host checks pairs <= CH)
        tl.debug_barrier()  # the cursors and sentinels above are stored before any route takes a slot
        _scatter(topk_ids, cursor, sorted_ids, route_slots, tl.arange(0, CH), pairs, num_experts, IDS64, INV)


@triton.jit
def moe_align_count(topk_ids, counts, pairs, num_experts, IDS64: tl.constexpr, EP: tl.constexpr, CH: tl.constexpr,
                    PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    offs = tl.program_id(0) * (PLAN_CHUNKS * CH) + tl.arange(0, PLAN_CHUNKS * CH)
    e, valid = _route_experts(topk_ids, offs, pairs, num_experts, IDS64)
    row = counts + tl.program_id(0) * EP + tl.arange(0, EP)
    tl.store(row, tl.histogram(tl.where(valid, e, EP - 1), EP))  # bin EP - 1 (invalid ids) is never read as one


@triton.jit
def _scatter(topk_ids, cursor, sorted_ids, route_slots, offs, pairs, num_experts, IDS64: tl.constexpr,
             INV: tl.constexpr):  # fmt: skip
    """Routes ``offs`` take the next slot of their expert (an atomic add on its cursor); ``INV``: each route's slot
    (-1: none) is stored at the route too."""
    e, valid = _route_experts(topk_ids, offs, pairs, num_experts, IDS64)
    pos = tl.atomic_add(cursor + e, tl.full(offs.shape, 1, tl.int32), mask=valid)
    tl.store(sorted_ids + pos, offs, mask=valid)
    if INV:
        tl.store(route_slots + offs, tl.where(valid, pos, -1), mask=offs < pairs)


@triton.jit
def moe_align_scatter(
    topk_ids, cursor, sorted_ids, route_slots, pairs, num_experts, IDS64: tl.constexpr, CH: tl.constexpr,
    INV: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    await_predecessor(PDL)
    offs = tl.program_id(0) * CH + tl.arange(0, CH)
    _scatter(topk_ids, cursor, sorted_ids, route_slots, offs, pairs, num_experts, IDS64, INV)


@triton.jit
def moe_align_routes(
    topk_ids,
    block_expert,
    active_experts,
    meta,
    sorted_ids,
    route_slots,
    pairs,
    num_experts,
    max_active,
    IDS64: tl.constexpr,
    P: tl.constexpr,
    BM: tl.constexpr,
    INV: tl.constexpr,
    PDL: tl.constexpr,
):
    """One token's routes as blocks of one route each (valid routes in order), the distinct experts they
    name as the active list (first occurrences, -1 padded), and the block count."""
    await_predecessor(PDL)
    r = tl.arange(0, P)
    e, valid = _route_experts(topk_ids, r, pairs, num_experts, IDS64)
    block = tl.cumsum(valid.to(tl.int32), 0) - 1
    tl.store(block_expert + block, e, mask=valid)
    slot = tl.arange(0, BM)[None, :]
    tl.store(sorted_ids + block[:, None] * BM + slot, tl.where(slot == 0, r[:, None], pairs), mask=valid[:, None])
    if INV:
        tl.store(route_slots + r, tl.where(valid, block * BM, -1), mask=r < pairs)
    # a route's expert is new unless an earlier valid route names it
    seen = (r[None, :] < r[:, None]) & valid[None, :] & (e[None, :] == e[:, None])
    first = valid & (tl.max(seen.to(tl.int32), 1) == 0)
    rank = tl.cumsum(first.to(tl.int32), 0) - 1
    n_active = tl.sum(first.to(tl.int32), 0)
    tl.store(active_experts + rank, e, mask=first & (rank < max_active))
    _pad_active(active_experts, n_active, max_active, P)
    tl.store(meta, tl.sum(valid.to(tl.int32), 0))
