"""Gluon: sparse MLA decode on ``wgmma`` in two warpgroups, keys and values as register operands, the query
in shared memory.

Same job, arguments and partials as ``mla_decode`` (``mla_merge`` finishes split calls; see ``DIRECT``). One
program takes one query row, ``BH`` heads (16 or 32) and one split's 64-candidate chunks (the balanced policy
of ``mla_decode``). The products are computed transposed, candidates and output columns along the MMA's M (64
rows per warpgroup instruction, so 16 or 32 heads need no padding) and heads along N. Two warpgroups
(``gl.warp_specialize``: the program's 4 warps and one 4-warp worker) split the latent: warpgroup H takes
groups 2H and 2H + 1 and rope elements [32 H, 32 H + 32) of every record, so each key and value byte is
converted once per program and each warpgroup holds only its half of the output:

* a warpgroup's share of a chunk's 64 records is copied by ``cp.async`` into its own shared memory, two
  stages, so the next chunk is in flight while this one is computed;
* partial scores S^T [64 candidates, BH] per latent group: A = the group's key codes (E4M3 converted to
  float16, exact) read from the staged records into registers, K relabelled so each thread reads 32
  contiguous bytes of each of its two candidates; B = the float16 query of that group in the same K order,
  staged once in shared memory and read there by the tensor cores (no per-warp reloads); the group's product
  is scaled by its key and query scales in float32 (powers of two: exact); plus the warpgroup's bf16 rope
  product;
* the two partial scores meet once per chunk through shared memory (two buffers by chunk parity, an mbarrier
  per warpgroup and buffer); each warpgroup adds the other's to its own, and addition commutes, so both hold
  the same scores, maxima and probabilities bit for bit and need nothing else from each other;
* values O^T [128 columns, BH] per group: A = the group's value codes (float16), M relabelled so each thread
  reads 4 contiguous bytes per candidate; B = the probabilities times the candidate's group scale, counted in
  units of the chunk's largest scale of the group (float16 in [0, 1], as ``mla_decode`` counts them: rescaled
  exactly when the unit changes), written to shared memory once per chunk and group;
* every relabelling is a register permute + reshape that ``convert_layout(..., assert_trivial=True)`` proves
  moves no data; the columns are put back in order when the partial is stored.

With one split per row (``DIRECT``) the program finishes the output itself, as ``mla_merge`` would finish that
one split (the same float32 operations in the same order: ``_direct_weights``, ``_direct_rows``): the merged
call's bits without the partials' round trip and the merge's launch.

Query modes (and their quantization), online softmax and skipped candidates as ``mla_decode_mma``, whose
helpers this program shares (a warpgroup stages its half of the query; mode 0 takes its exponent from the
whole row's absmax, so both halves scale alike).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

from csf_kernels.mla.kernels.gluon_decode_mma import (
    CHUNK,
    GROUP,
    LATENT,
    ROPE,
    ROPE_AT,
    SCALE_AT,
    STAGES,
    _copy_layout,
    _finish,
    _ids,
    _k_order,
    _latent_staging,
    _live,
    _program_chunks,
    _query_latent,
    _query_rope,
    _records,
    _rows_layout,
    _scale_copy_layout,
    _softmax_step,
    _unit,
)
from csf_kernels.mla.kernels.gluon_decode_mma import SIGNATURE as _MMA_SIGNATURE
from csf_kernels.runtime.pdl import gluon_await_predecessor

__all__ = ["SIGNATURE", "mla_decode_wgmma"]

SIGNATURE = _MMA_SIGNATURE | {
    "DIRECT": "constexpr",  # one split: finish the output here as mla_merge would, no partials
    "HAS_SINK": "constexpr",  # (DIRECT)
    "WRITE_LSE": "constexpr",  # (DIRECT)
}
MULTIPLE_OF = {"heads": 16, "topk": 64}
HALF: gl.constexpr = gl.constexpr(LATENT // 2)  # latent bytes per warpgroup: groups 2H and 2H + 1
ROPE_HALF: gl.constexpr = gl.constexpr(ROPE // 2)  # rope elements per warpgroup


# ------------------------------------------------------------------------------------------- layouts


@gluon.constexpr_function
def _acc(BH):
    """[M, BH] accumulators: M (candidates, output columns) over the warpgroup's 4 warps, heads along N."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BH, 16])


@gluon.constexpr_function
def _a_operand(BH):
    return gl.DotOperandLayout(operand_index=0, parent=_acc(BH), k_width=2)


@gluon.constexpr_function
def _key_layout(width):
    """A group's key bytes (or the rope's bf16 elements) [64 candidates, width] as loaded for the A operand:
    thread (warp w, lane 4r + q) holds candidates 16w + r and 16w + r + 8, elements [q, q + 1) * width / 4."""
    run = width // 4
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << b] for b in range(run.bit_length() - 1)] + [[8, 0]],
        lane_bases=[[0, run], [0, 2 * run], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, width],
    )


@gluon.constexpr_function
def _value_layout():
    """A group's value bytes [64 candidates, 128 columns] as loaded for the A operand of O^T: thread (warp w,
    lane 4r + q) holds candidates 16s + 8a + 2q + e and columns 32w + 4r + [0, 4): 4 contiguous bytes each."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 4], [0, 8], [0, 16]],
        warp_bases=[[0, 32], [0, 64]],
        block_bases=[],
        shape=[64, GROUP],
    )


@gluon.constexpr_function
def _exchange_layout(BH):
    """The scores' exchange [64 candidates, BH] float32 under the accumulator (a lane writes 8 bytes, a quad
    32 bytes of a row, one access 8 rows): 32-byte vectors swizzled by the rows that share a 128-byte line's
    banks (row / (128 / 4 BH)), so every 128 / 32 rows of one access cover all banks (the NVMMA swizzle leaves
    rows 4 apart on the same banks)."""
    return gl.SwizzledSharedLayout(vec=8, per_phase=128 // (4 * BH), max_phase=BH // 8, order=[1, 0])


@gluon.constexpr_function
def _rope_copy_layout():
    """cp.async of a warpgroup's rope half [64, 32] bf16, 16 bytes per copy."""
    return gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])


# ------------------------------------------------------------------------------------------- helpers


@gluon.jit
def _column_order(v):
    """[128 stored columns, K] -> the value A operand's M order: stored column 32w + 4r + 2i + h is M row
    64i + 16w + 8h + r (thread (w, r) holds 4 contiguous bytes of each candidate)."""
    k: gl.constexpr = v.shape[1]
    return gl.reshape(gl.permute(gl.reshape(v, [4, 8, 2, 2, k]), [2, 0, 3, 1, 4]), [GROUP, k])


@gluon.jit
def _stored_order(o):
    """The inverse of ``_column_order`` on [128 M rows, BH]."""
    n: gl.constexpr = o.shape[1]
    return gl.reshape(gl.permute(gl.reshape(o, [2, 4, 2, 8, n]), [1, 3, 0, 2, 4]), [GROUP, n])


@gluon.jit
def _chunk_ids(indices, row, topk, n, c, active):
    """Chunk ``c``'s ids in the layouts one warpgroup uses them in: its latent half's, the rope's and its
    scales' copies and the scores' rows. Loaded a chunk ahead of their use, so no copy waits on them."""
    lat_rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _copy_layout(16, 4)))
    rope_rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _rope_copy_layout()))
    scale_cols = gl.arange(0, 2 * CHUNK, layout=_scale_copy_layout(4)) % CHUNK
    score_rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _acc(16)))
    return (
        _ids(indices, row, topk, n, c, active, lat_rows),
        _ids(indices, row, topk, n, c, active, rope_rows),
        _ids(indices, row, topk, n, c, active, scale_cols),
        _ids(indices, row, topk, n, c, active, score_rows),
    )


@gluon.jit
def _issue(kv, lat_ids, rope_ids, scale_ids, num_slots, lat, rope, sc, H: gl.constexpr):
    """cp.async one warpgroup's share of a chunk into one stage: latent bytes [256 H, 256 H + 256) and the
    scales of groups 2H, 2H + 1 ([2 x 64], group-major) and rope elements [32 H, 32 H + 32) of every record;
    candidates in chunk order (dead candidates: zero-filled, nothing read)."""
    LAT: gl.constexpr = _copy_layout(16, 4)
    SCL: gl.constexpr = _scale_copy_layout(4)
    rec, live = _records(lat_ids, num_slots)
    d = H * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, LAT))
    async_copy.async_copy_global_to_shared(lat, kv + gl.expand_dims(rec, 1) + gl.expand_dims(d, 0),
                                           mask=gl.expand_dims(live, 1))  # fmt: skip
    ROP: gl.constexpr = _rope_copy_layout()
    rec, live = _records(rope_ids, num_slots)
    r = H * ROPE_HALF + gl.arange(0, ROPE_HALF, layout=gl.SliceLayout(0, ROP))
    ropes = (kv + rec + ROPE_AT).to(gl.pointer_type(gl.bfloat16))
    async_copy.async_copy_global_to_shared(rope, gl.expand_dims(ropes, 1) + gl.expand_dims(r, 0),
                                           mask=gl.expand_dims(live, 1))  # fmt: skip
    rec, live = _records(scale_ids, num_slots)
    g = 2 * H + gl.arange(0, 2 * CHUNK, layout=SCL) // CHUNK
    async_copy.async_copy_global_to_shared(sc, (kv + rec + SCALE_AT).to(gl.pointer_type(gl.float32)) + g, mask=live)
    async_copy.commit_group()


@gluon.jit
def _stage_query(q, row, h0, heads, q_s, qr_s, qf_s, Q_MODE: gl.constexpr, BH: gl.constexpr, H: gl.constexpr):
    """One warpgroup's share of the query of heads [h0, h0 + BH) as the scores' B operands, in shared memory:
    the float16 latent of groups 2H, 2H + 1 ([BH, 128] each, rows [g BH, g BH + BH) of ``q_s``) and the bf16
    rope elements [32 H, 32 H + 32) (rows [H BH, H BH + BH) of ``qr_s``), in the A operands' relabelled K
    order; and the float32 factor of each of its (group, head) its scores are multiplied by (rows 2H, 2H + 1
    of ``qf_s`` [4, BH])."""
    lat, factor = _query_latent(q, row, h0, heads, 2 * H, 2, Q_MODE, BH)
    groups = gl.permute(gl.reshape(lat, [BH, 2, GROUP]), [1, 0, 2])  # [2, BH, 128]
    q_s.slice(2 * H * BH, 2 * BH).store(_k_order(gl.reshape(groups, [2 * BH, GROUP])))
    qf_s.slice(2 * H, 2, dim=0).store(gl.permute(factor, [1, 0]))
    RL: gl.constexpr = _rope_copy_layout()  # rope half [BH, 32]
    r = H * ROPE_HALF + gl.arange(0, ROPE_HALF, layout=gl.SliceLayout(0, RL))
    qr_s.slice(H * BH, BH).store(_k_order(_query_rope(q, row, h0, heads, r, RL, Q_MODE, BH)))


@gluon.jit
def _key_operand(lat, k: gl.constexpr, BH: gl.constexpr):
    """The warpgroup's latent group ``k`` (of two) of a staged chunk as the scores' A operand [64, 128]:
    E4M3 codes as float16 (exact), K relabelled."""
    raw = lat.slice(k * GROUP, GROUP, dim=1).load(_key_layout(GROUP))
    codes = _k_order(raw.to(gl.float8e4nv, bitcast=True).to(gl.float16))
    return gl.convert_layout(codes, _a_operand(BH), assert_trivial=True)


@gluon.jit
def _scaled(part, qf_s, sc, g: gl.constexpr, k: gl.constexpr):
    """Group ``g``'s product (the warpgroup's ``k``-th) times its key and query scales, in float32."""
    ACC: gl.constexpr = part.type.layout
    k_scale = gl.expand_dims(sc.slice(k * CHUNK, CHUNK).load(gl.SliceLayout(1, ACC)), 1)
    q_factor = qf_s.slice(g, 1, dim=0).load(ACC)  # [1, BH]
    return part * (k_scale * q_factor)


@gluon.jit
def _weights(p, p_s, sc, unit_new, g: gl.constexpr, k: gl.constexpr):
    """Group ``g``'s B operand of the values into shared memory: the probabilities ``p`` [64, BH] times the
    candidates' key scale in units of the chunk's largest (``unit_new``), float16 in [0, 1], as [BH, 64]."""
    BH: gl.constexpr = p.shape[1]
    k_scale = sc.slice(k * CHUNK, CHUNK).load(gl.SliceLayout(1, p.type.layout))
    pw = (p * gl.expand_dims(k_scale * (1.0 / unit_new), 1)).to(gl.float16)
    p_s.slice(g * BH, BH).store(gl.permute(pw, [1, 0]))


@gluon.jit
def _value_operand(lat, k: gl.constexpr, BH: gl.constexpr):
    """The warpgroup's latent group ``k`` (of two) of a staged chunk as the values' A operand [128 relabelled
    columns, 64 candidates]: E4M3 codes as float16."""
    codes = lat.slice(k * GROUP, GROUP, dim=1).load(_value_layout()).to(gl.float8e4nv, bitcast=True)
    v = _column_order(gl.permute(codes.to(gl.float16), [1, 0]))
    return gl.convert_layout(v, _a_operand(BH), assert_trivial=True)


@gluon.jit
def _group_rows(acc, unit, den_safe):
    """A group's normalised output [BH, 128] (float32, columns back in stored order, one row per head)."""
    o = _stored_order(acc * gl.expand_dims(unit / den_safe, 0))
    return gl.convert_layout(gl.permute(o, [1, 0]), _rows_layout(4, 4))


@gluon.jit
def _group_offsets(at_head, g: gl.constexpr):
    """Element offsets of group ``g``'s rows ([BH, 128], as ``_group_rows``), given each head's column 0."""
    OL: gl.constexpr = _rows_layout(4, 4)
    col = g * GROUP + gl.arange(0, GROUP, layout=gl.SliceLayout(0, OL))
    return gl.expand_dims(gl.convert_layout(at_head, gl.SliceLayout(1, OL)), 1) + gl.expand_dims(col, 0)


@gluon.jit
def _store_rows(o, part_out, at, PARTIAL_BF16: gl.constexpr):
    """Normalised partial rows ``o`` (float32, one row per head) at element offsets ``at`` (o's layout; both
    wgmma programs)."""
    if PARTIAL_BF16:
        gl.store(part_out.to(gl.pointer_type(gl.bfloat16)) + at, o.to(gl.bfloat16))
    else:
        gl.store(part_out + at, o)


@gluon.jit
def _direct_weights(lse, attn_sink, lse_out, slot, h, HAS_SINK: gl.constexpr, WRITE_LSE: gl.constexpr):
    """A single split's weight and the total it is divided by, as ``mla_merge`` finishes one split
    (csf_kernels.mla.kernels.finish: ``reference_max``, ``split_weight``, ``keys_lse``); stores the lse when
    asked (both wgmma programs)."""
    m_all = lse
    if HAS_SINK:
        sink = gl.load(attn_sink + h)
        m_all = gl.maximum(m_all, sink)
    m_fin = gl.where(m_all == float("-inf"), 0.0, m_all)
    w = gl.exp(lse - m_fin)
    total = w
    if HAS_SINK:
        total = w + gl.exp(sink - m_fin)
    if WRITE_LSE:
        gl.store(lse_out + slot, gl.where(w > 0, m_fin + gl.log(gl.where(w > 0, w, 1.0)), float("-inf")))
    return w, total


@gluon.jit
def _direct_rows(o, w, total, out, at):
    """Finished output rows (bf16) at element offsets ``at`` from their float32 partial rows ``o`` (one row per
    head), weighted and divided as ``mla_merge`` finishes a single split (``weighted``, then ``finished``; both
    wgmma programs)."""
    heads: gl.constexpr = gl.SliceLayout(1, o.type.layout)
    w = gl.expand_dims(gl.convert_layout(w, heads), 1)
    total = gl.expand_dims(gl.convert_layout(total, heads), 1)
    num = gl.where(w > 0, w * o, 0.0)
    res = gl.where(total > 0, num / gl.where(total > 0, total, 1.0), 0.0)
    gl.store(out + at, res.to(gl.bfloat16))


@gluon.jit
def _warpgroup(q, kv, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads,
               topk, splits, lat_s, rope_s, sc_s, q_s, qr_s, qf_s, p_s, x_s, bars,
               BH: gl.constexpr, PARTIAL_BF16: gl.constexpr, Q_MODE: gl.constexpr, DIRECT: gl.constexpr,
               HAS_SINK: gl.constexpr, WRITE_LSE: gl.constexpr, H: gl.constexpr):  # fmt: skip
    """Warpgroup ``H``'s share of a program: latent groups 2H and 2H + 1 and half the rope of every
    chunk. The two partial scores meet through shared memory once per chunk (``x_s``, two buffers by chunk
    parity, an mbarrier per warpgroup and buffer); both add them in the same commuted order, so both see the
    same scores, maxima and probabilities bit for bit and need nothing else from each other."""
    ACC: gl.constexpr = _acc(BH)
    HEADS: gl.constexpr = gl.SliceLayout(0, ACC)
    G0: gl.constexpr = 2 * H
    G1: gl.constexpr = 2 * H + 1
    row, h0, s, n, c0, c1 = _program_chunks(lengths, heads, topk, splits, BH)

    la, ro, sx, score_ids = _chunk_ids(indices, row, topk, n, c0, c0 < c1)
    _issue(kv, la, ro, sx, num_slots, lat_s.index(H * STAGES), rope_s.index(H * STAGES), sc_s.index(H * STAGES), H)
    la, ro, sx, next_score_ids = _chunk_ids(indices, row, topk, n, c0 + 1, c0 + 1 < c1)
    _stage_query(q, row, h0, heads, q_s, qr_s, qf_s, Q_MODE, BH, H)
    fence_async_shared()  # the query's stores before the tensor cores read them

    m = gl.full([BH], float("-inf"), gl.float32, HEADS)
    den = gl.zeros([CHUNK, BH], gl.float32, ACC)
    acc0 = gl.zeros([GROUP, BH], gl.float32, ACC)
    acc1 = gl.zeros([GROUP, BH], gl.float32, ACC)
    unit0 = 1.0
    unit1 = 1.0
    for c in range(c0, c1):
        i = c - c0
        st = i % STAGES
        nx = (i + 1) % STAGES
        gl.thread_barrier()  # every warp of this warpgroup is done with the stage the next chunk goes to
        _issue(
            kv,
            la,
            ro,
            sx,
            num_slots,
            lat_s.index(H * STAGES + nx),
            rope_s.index(H * STAGES + nx),
            sc_s.index(H * STAGES + nx),
            H,
        )
        live = _live(score_ids, num_slots)
        score_ids = next_score_ids
        la, ro, sx, next_score_ids = _chunk_ids(indices, row, topk, n, c + 2, c + 2 < c1)
        async_copy.wait_group(1)  # this chunk's copies (the next chunk's may be in flight)
        gl.thread_barrier()  # everyone's
        lat = lat_s.index(H * STAGES + st)
        sc = sc_s.index(H * STAGES + st)
        ZERO = gl.zeros([CHUNK, BH], gl.float32, ACC)
        kr = _k_order(rope_s.index(H * STAGES + st).load(_key_layout(ROPE_HALF)))
        kr = gl.convert_layout(kr, _a_operand(BH), assert_trivial=True)
        rope_part = warpgroup_mma(kr, qr_s.slice(H * BH, BH).permute([1, 0]), ZERO, use_acc=False)
        p0 = warpgroup_mma(_key_operand(lat, 0, BH), q_s.slice(G0 * BH, BH).permute([1, 0]), ZERO, use_acc=False)
        p1 = warpgroup_mma(_key_operand(lat, 1, BH), q_s.slice(G1 * BH, BH).permute([1, 0]), ZERO, use_acc=False)
        part = rope_part + _scaled(p0, qf_s, sc, G0, 0)
        part = part + _scaled(p1, qf_s, sc, G1, 1)
        # exchange the partial scores (arrive: the warpgroup's stores are ordered before it)
        x_s.index(2 * H + i % 2).store(part)
        mbarrier.arrive(bars.index(2 * H + i % 2))
        mbarrier.wait(bars.index(2 * (1 - H) + i % 2), (i // 2) & 1)
        sco = part + x_s.index(2 * (1 - H) + i % 2).load(ACC)  # commuted in the other warpgroup: same bits
        live_rows = gl.expand_dims(gl.convert_layout(live, gl.SliceLayout(1, ACC)), 1)
        sco = gl.where(live_rows, sco * sm_scale, float("-inf"))
        m_new, alpha, p, den = _softmax_step(sco, m, den, 0)
        new0 = _unit(sc, unit0, 0)
        new1 = _unit(sc, unit1, 1)
        _weights(p, p_s, sc, new0, G0, 0)
        _weights(p, p_s, sc, new1, G1, 1)
        fence_async_shared()  # the weights' stores before the tensor cores read them
        gl.thread_barrier()
        v0 = _value_operand(lat, 0, BH)
        acc0 = warpgroup_mma(
            v0, p_s.slice(G0 * BH, BH).permute([1, 0]), acc0 * gl.expand_dims(alpha * (unit0 / new0), 0)
        )
        v1 = _value_operand(lat, 1, BH)
        acc1 = warpgroup_mma(
            v1, p_s.slice(G1 * BH, BH).permute([1, 0]), acc1 * gl.expand_dims(alpha * (unit1 / new1), 0)
        )
        unit0, unit1 = new0, new1
        m = m_new
    async_copy.wait_group(0)

    lse, den_safe = _finish(m, den, 0)
    h = h0 + gl.arange(0, BH, layout=HEADS)
    slot = (row.to(gl.int64) * splits + s) * heads + h
    at_head = slot * LATENT
    if DIRECT:  # the merge of this one split
        w, total = _direct_weights(lse, attn_sink, lse_out, slot, h, HAS_SINK, WRITE_LSE and H == 0)
        _direct_rows(_group_rows(acc0, unit0, den_safe), w, total, out, _group_offsets(at_head, G0))
        _direct_rows(_group_rows(acc1, unit1, den_safe), w, total, out, _group_offsets(at_head, G1))
    else:
        if H == 0:
            gl.store(part_lse + slot, lse)
        _store_rows(_group_rows(acc0, unit0, den_safe), part_out, _group_offsets(at_head, G0), PARTIAL_BF16)
        _store_rows(_group_rows(acc1, unit1, den_safe), part_out, _group_offsets(at_head, G1), PARTIAL_BF16)


@gluon.jit
def mla_decode_wgmma(
    q, kv, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads, topk, splits,
    BH: gl.constexpr, PARTIAL_BF16: gl.constexpr, Q_MODE: gl.constexpr, PDL: gl.constexpr, DIRECT: gl.constexpr,
    HAS_SINK: gl.constexpr, WRITE_LSE: gl.constexpr,
):  # fmt: skip
    gluon_await_predecessor(PDL)
    gl.static_assert(BH == 16 or BH == 32, "the register layouts are built for 16 or 32 heads")
    gl.static_assert(gl.num_warps() == 4, "two warpgroups: this one and one worker")
    gl.static_assert(DIRECT == 1 or (HAS_SINK == 0 and WRITE_LSE == 0), "the sink and lse are the finisher's")
    sw64: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=2, max_phase=4, order=[1, 0])  # 64-byte rows
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    lat_s = gl.allocate_shared_memory(gl.uint8, [2 * STAGES, CHUNK, HALF], _latent_staging())  # [warpgroup, stage]
    rope_s = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, CHUNK, ROPE_HALF], sw64)  # [warpgroup, stage]
    sc_s = gl.allocate_shared_memory(gl.float32, [2 * STAGES, 2 * CHUNK], flat)  # [warpgroup, stage], 2 groups
    q_s = gl.allocate_shared_memory(
        gl.float16, [4 * BH, GROUP], gl.NVMMASharedLayout.get_default_for([BH, GROUP], gl.float16)
    )
    qr_s = gl.allocate_shared_memory(  # [warpgroup x BH, 32]
        gl.bfloat16, [2 * BH, ROPE_HALF], gl.NVMMASharedLayout.get_default_for([BH, ROPE_HALF], gl.bfloat16)
    )
    qf_s = gl.allocate_shared_memory(gl.float32, [4, BH], plain)
    p_s = gl.allocate_shared_memory(
        gl.float16, [4 * BH, CHUNK], gl.NVMMASharedLayout.get_default_for([BH, CHUNK], gl.float16)
    )
    x_s = gl.allocate_shared_memory(gl.float32, [4, CHUNK, BH], _exchange_layout(BH))  # [warpgroup, chunk parity]
    bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(4):
        mbarrier.init(bars.index(b), count=1)
    # (each partition's arguments written out: a concatenated tuple would lose the constexprs)
    gl.warp_specialize([
        (_warpgroup, (q, kv, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale,
                      heads, topk, splits, lat_s, rope_s, sc_s, q_s, qr_s, qf_s, p_s, x_s, bars, BH, PARTIAL_BF16,
                      Q_MODE, DIRECT, HAS_SINK, WRITE_LSE, 0)),
        (_warpgroup, (q, kv, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale,
                      heads, topk, splits, lat_s, rope_s, sc_s, q_s, qr_s, qf_s, p_s, x_s, bars, BH, PARTIAL_BF16,
                      Q_MODE, DIRECT, HAS_SINK, WRITE_LSE, 1)),
    ], [4], [248])  # fmt: skip
