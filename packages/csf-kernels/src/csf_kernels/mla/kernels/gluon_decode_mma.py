"""Gluon: sparse MLA decode for 16 or 32 heads per program on ``mma.sync``, records staged by ``cp.async``.

Same job, arguments and partials as ``mla_decode`` (split programs only: ``mla_merge`` finishes them). One
program (4 or 8 warps) takes one query row, ``BH`` heads and one split's 64-candidate chunks (the balanced
policy of ``mla_decode``). What differs is how records reach the tensor cores:

* a chunk's 64 records (latent, scales, rope) are copied by ``cp.async`` into shared memory, two stages,
  so the next chunk is in flight while this one is computed (the Triton program gathers into registers
  and waits on every chunk);
* scores: each of the W warps takes 64 / W of the 64 candidates, the latent per 128-byte group (one
  scale each) as E4M3 codes converted to float16 (exact), the K order inside a group relabelled for
  query and keys alike so that each thread reads 32 contiguous bytes of a record (two 16-byte shared
  loads, no bank conflicts); a group's product is scaled by its query and key scales in float32
  (powers of two: exact), so no scale enters an operand;
* values: each warp takes 128 / W of a group's 128 output columns; the candidate (K) and column orders
  are relabelled so that each thread reads 4 x J byte blocks (J = 4 on 4 warps, 2 on 8) and the columns
  are put back in order when the partial is stored; the probabilities times the candidate's group scale,
  counted in units of the chunk's largest scale of that group, are float16 in [0, 1] (as ``mla_decode``
  counts them: rescaled exactly when the unit changes);
* scores, probabilities and the staged rope and scales are kept in the value MMA's candidate order
  (``_staged_row``), so the probabilities cross between warps once per chunk and every relabelling is a
  register permute + reshape that ``convert_layout(..., assert_trivial=True)`` proves moves no data;
* a chunk's candidate ids are loaded a chunk ahead of its copies.

The query quantization (mode 1), the float16 query scaling (mode 0) and their ``_pow2`` / ``_exponent``
(``_query_latent``, shared with ``mla_decode_wgmma``) restate ``mla_decode``'s with explicit layouts (Gluon
cannot call Triton functions); the tests hold both to the float32 reference and modes 1 and 2 to the same
bits.

Online softmax in float32 as ``mla_decode``; candidates past the row's length, negative or not below
``num_slots`` are skipped and never read (their copies are predicated off and zero-filled).
Query modes as ``mla_decode`` (0 bf16; 1 bf16 quantized here as a record; 2 packed records): modes 1 and
2 give the same bits.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from csf_kernels.mla import layout as mla_layout
from csf_kernels.mla.kernels.triton_decode import SIGNATURE as _DECODE_SIGNATURE
from csf_kernels.runtime.pdl import gluon_await_predecessor

# mla_decode's runtime arguments, in its order (one launch builder serves both; attn_sink, out and lse_out
# go unused: finishing is the merge's), and fewer constants
SIGNATURE = {n: t for n, t in _DECODE_SIGNATURE.items() if t != "constexpr"} | {
    "BH": "constexpr",  # heads per program: 16 or 32
    "PARTIAL_BF16": "constexpr",
    "Q_MODE": "constexpr",  # 0 bf16, 1 bf16 quantized here, 2 packed records
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}
MULTIPLE_OF = {"heads": 16, "topk": 64}

LATENT = gl.constexpr(mla_layout.LATENT)
ROPE = gl.constexpr(mla_layout.ROPE)
CHUNK = gl.constexpr(mla_layout.CHUNK)
GROUP = gl.constexpr(mla_layout.GROUP)
RECORD = gl.constexpr(mla_layout.RECORD_BYTES)
SCALE_AT = gl.constexpr(mla_layout.SCALE_OFFSET)
ROPE_AT = gl.constexpr(mla_layout.ROPE_OFFSET)
QDIM = gl.constexpr(mla_layout.HEAD_DIM)
STAGES = gl.constexpr(2)


# ------------------------------------------------------------------------------------------- layouts


@gluon.constexpr_function
def _log2(x):
    return x.bit_length() - 1


@gluon.constexpr_function
def _staged_row_of(j):
    """``_staged_row`` on the host (layout bases are built from it)."""
    return 16 * (j >> 4) + 4 * ((j >> 1) & 3) + 2 * ((j >> 3) & 1) + (j & 1)


@gluon.constexpr_function
def _mma(W):
    # warps side by side along N: scores [BH, 64] give each warp 64 / W candidates, outputs [BH, 128]
    # 128 / W columns of each latent group
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, W], instr_shape=[16, 8])


@gluon.constexpr_function
def _key_layout(W):
    """A group's latent bytes [64 staged rows, 128] as the score MMA's B fragments want them: thread
    (warp w, lane 4r + q) holds the candidates of score columns 8w + r (+ 8W ...), that is their staged
    rows (``_staged_row``), and bytes [32q, 32q + 32)."""
    column_bit = [[_staged_row_of(1 << b), 0] for b in range(6)]  # score column bit b -> staged row
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], *column_bit[3 + _log2(W) :]],
        lane_bases=[[0, 32], [0, 64], *column_bit[:3]],
        warp_bases=column_bit[3 : 3 + _log2(W)],
        block_bases=[],
        shape=[64, 128],
    )


@gluon.constexpr_function
def _value_columns(W):
    """Output columns per thread and MMA N tile of a latent group (4 on 4 warps, 2 on 8)."""
    return 128 // (8 * W)


@gluon.constexpr_function
def _value_layout(W):
    """A group's latent bytes [64 candidates, 128 columns] as the value MMA's B fragments want them
    (relabelled): thread (warp w, lane 4r + q) holds candidates 16s + 4q + [0, 4) for s < 4 and columns
    (128 / W) w + J r + [0, J), J = ``_value_columns(W)``: J contiguous bytes per candidate."""
    J = _value_columns(W)
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << b] for b in range(_log2(J))] + [[1, 0], [2, 0], [16, 0], [32, 0]],
        lane_bases=[[4, 0], [8, 0], [0, J], [0, 2 * J], [0, 4 * J]],
        warp_bases=[[0, 8 * J << b] for b in range(_log2(W))],
        block_bases=[],
        shape=[64, 128],
    )


@gluon.constexpr_function
def _copy_layout(vec, W):
    """cp.async of [64, cols] elements, ``vec`` (16 bytes) per copy, 128 bytes of a row per 8 lanes."""
    return gl.BlockedLayout([1, vec], [4, 8], [W, 1], [1, 0])


@gluon.constexpr_function
def _latent_staging():
    """The staged latent bytes (rows of 512 or 256 bytes, both Gluon programs): 16-byte units swizzled by the
    row modulo 8."""
    return gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])


@gluon.constexpr_function
def _scale_copy_layout(W):
    return gl.BlockedLayout([1], [32], [W], [0])  # [4 groups x 64]: 4-byte copies


@gluon.constexpr_function
def _rows_layout(cols_per_thread, W):
    """A plain layout for [rows, cols] tensors of the query and the stores."""
    return gl.BlockedLayout([1, cols_per_thread], [1, 32], [W, 1], [1, 0])


@gluon.constexpr_function
def _every_warp(W):
    """[64] read whole by every warp (a group's maximum without a cross-warp reduction)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[1]],
        lane_bases=[[2], [4], [8], [16], [32]],
        warp_bases=[[0]] * _log2(W),
        block_bases=[],
        shape=[64],
    )


@gluon.constexpr_function
def _operand(index, W):
    return gl.DotOperandLayout(operand_index=index, parent=_mma(W), k_width=2)


# ------------------------------------------------------------------------------------------- helpers


@gluon.jit
def _pow2(e):
    """2**e as float32 for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _exponent(x):
    """The binary exponent of positive normal float32 ``x``."""
    return ((x.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127


@gluon.jit
def _k_order(x):
    """[rows, n] in stored order -> the relabelled K order of an MMA operand (both programs): stored element
    (n / 4) q + 4s + 2h + e is K position 16s + 8h + 2q + e (what thread q of a quad holds in step s), so each
    thread reads n / 4 contiguous elements of a row."""
    rows: gl.constexpr = x.shape[0]
    n: gl.constexpr = x.shape[1]
    return gl.reshape(gl.permute(gl.reshape(x, [rows, 4, n // 16, 2, 2]), [0, 2, 3, 1, 4]), [rows, n])


@gluon.jit
def _staged_row(j):
    """The staged row (candidate of the chunk) behind score column j: the value MMA's K order, in which
    K position 16s + 8h + 2q + e is candidate 16s + 4q + 2h + e (so that thread q of a quad reads 4 x 4 byte
    blocks of values). Scores, probabilities and the staged scales are kept in this column order."""
    return 16 * (j >> 4) + 4 * ((j >> 1) & 3) + 2 * ((j >> 3) & 1) + (j & 1)


@gluon.jit
def _candidate_order(x):
    """[rows, 64] in staged-row order -> score-column order (``_staged_row``)."""
    rows: gl.constexpr = x.shape[0]
    return gl.reshape(gl.permute(gl.reshape(x, [rows, 4, 4, 2, 2]), [0, 1, 3, 2, 4]), [rows, CHUNK])


@gluon.jit
def _program_chunks(lengths, heads, topk, splits, BH: gl.constexpr):
    """This program's work (both Gluon programs): its query row, first head, split, the row's live length
    ``n`` and its chunks [c0, c1) under the balanced split policy of ``mla_decode``."""
    pid = gl.program_id(0)
    s = gl.program_id(1)
    head_blocks = heads // BH
    row = pid // head_blocks
    h0 = (pid % head_blocks) * BH
    n = gl.minimum(gl.maximum(gl.load(lengths + row), 0), topk)
    live_chunks = (n + CHUNK - 1) // CHUNK
    cps = (live_chunks + splits - 1) // splits
    c0 = s * cps
    return row, h0, s, n, c0, gl.minimum(c0 + cps, live_chunks)


@gluon.jit
def _softmax_step(sco, m, den, AXIS: gl.constexpr):
    """One chunk of the online softmax over the candidates (along ``AXIS`` of ``sco``, masked scores -inf):
    the new running maximum, the factor that rescales what earlier chunks accumulated (0 before the first live
    key), the probabilities, and the normaliser kept per candidate column (summed once, by ``_finish``)."""
    m_new = gl.maximum(m, gl.max(sco, AXIS))
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no live key yet: keep exp() finite
    alpha = gl.exp(m - m_ref)
    p = gl.exp(sco - gl.expand_dims(m_ref, AXIS))
    return m_new, alpha, p, den * gl.expand_dims(alpha, AXIS) + p


@gluon.jit
def _finish(m, den, AXIS: gl.constexpr):
    """The log-sum-exp of each head and its normaliser (1 where no key was live), from the normaliser kept per
    candidate column (summed along ``AXIS``; a program summing per chunk passes a column of one)."""
    den = gl.sum(den, AXIS)
    has = den > 0
    den_safe = gl.where(has, den, 1.0)
    return gl.where(has, m + gl.log(den_safe), float("-inf")), den_safe


@gluon.jit
def _ids(indices, row, topk, n, c, active, j):
    """Chunk ``c``'s candidate ids at chunk positions ``j`` (-1: past the row's length, or not ``active``)."""
    pos = c * CHUNK + j
    return gl.load(indices + row.to(gl.int64) * topk + pos, mask=(pos < n) & active, other=-1)


@gluon.jit
def _chunk_ids(indices, row, topk, n, c, active):
    """Chunk ``c``'s ids in every layout they are used in: the latent's copies (by candidate), the rope's
    and the scales' copies and the scores (in score-column order). Loaded a chunk ahead of their use, so
    no copy waits on them."""
    W: gl.constexpr = gl.num_warps()
    lat_rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _copy_layout(16, W)))
    rope_rows = _staged_row(gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _copy_layout(8, W))))
    scale_cols = _staged_row(gl.arange(0, 4 * CHUNK, layout=_scale_copy_layout(W)) % CHUNK)
    score_cols = _staged_row(gl.arange(0, CHUNK, layout=gl.SliceLayout(0, _mma(W))))
    return (
        _ids(indices, row, topk, n, c, active, lat_rows),
        _ids(indices, row, topk, n, c, active, rope_rows),
        _ids(indices, row, topk, n, c, active, scale_cols),
        _ids(indices, row, topk, n, c, active, score_cols),
    )


@gluon.jit
def _records(ids, num_slots):
    """Record byte offsets and liveness (negative or past the cache: dead, never read)."""
    live = _live(ids, num_slots)
    return gl.where(live, ids, 0).to(gl.int64) * RECORD, live


@gluon.jit
def _live(ids, num_slots):
    """Whether each candidate id names a record of the cache (negative: skipped; past the cache: never read)."""
    return (ids >= 0) & (ids.to(gl.int64) < num_slots)


@gluon.jit
def _issue(kv, lat_ids, rope_ids, scale_ids, num_slots, lat, rope, sc):
    """cp.async one chunk's records into one stage: the latent by candidate, the rope and the group
    scales ([4 x 64], group-major) in score-column order (dead candidates: zero-filled, nothing read)."""
    W: gl.constexpr = gl.num_warps()
    LAT: gl.constexpr = _copy_layout(16, W)
    ROP: gl.constexpr = _copy_layout(8, W)
    SCL: gl.constexpr = _scale_copy_layout(W)
    rec, live = _records(lat_ids, num_slots)
    d = gl.arange(0, LATENT, layout=gl.SliceLayout(0, LAT))
    async_copy.async_copy_global_to_shared(lat, kv + gl.expand_dims(rec, 1) + gl.expand_dims(d, 0),
                                           mask=gl.expand_dims(live, 1))  # fmt: skip
    rec, live = _records(rope_ids, num_slots)
    r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROP))
    ropes = (kv + rec + ROPE_AT).to(gl.pointer_type(gl.bfloat16))
    async_copy.async_copy_global_to_shared(rope, gl.expand_dims(ropes, 1) + gl.expand_dims(r, 0),
                                           mask=gl.expand_dims(live, 1))  # fmt: skip
    rec, live = _records(scale_ids, num_slots)
    g = gl.arange(0, 4 * CHUNK, layout=SCL) // CHUNK
    async_copy.async_copy_global_to_shared(sc, (kv + rec + SCALE_AT).to(gl.pointer_type(gl.float32)) + g, mask=live)
    async_copy.commit_group()


@gluon.jit
def _query_latent(q, row, h0, heads, G0: gl.constexpr, NG: gl.constexpr, Q_MODE: gl.constexpr, BH: gl.constexpr):
    """Latent groups [G0, G0 + NG) of the query of heads [h0, h0 + BH) as the score MMAs take them (both
    programs): float16 values [BH, 128 NG] in stored order, exact, and the float32 factor [BH, NG] each
    (head, group)'s scores are multiplied by. Mode 2 reads packed records (E4M3 codes and their group scales);
    mode 1 quantizes the bf16 query as a cache record; mode 0 scales it exactly (one power of two per head,
    from the whole row's absmax)."""
    W: gl.constexpr = gl.num_warps()
    QL: gl.constexpr = _rows_layout(8, W)
    FL: gl.constexpr = gl.BlockedLayout([1, 1], [32 // NG, NG], [W, 1], [1, 0])  # factors [BH, NG]
    h = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, QL))
    d = G0 * GROUP + gl.arange(0, NG * GROUP, layout=gl.SliceLayout(0, QL))
    hf = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, FL))
    zeros = gl.zeros([BH, NG], gl.float32, FL)
    if Q_MODE == 2:  # packed records: E4M3 codes, their group scales
        recs = q.to(gl.pointer_type(gl.uint8))
        raw = gl.load(gl.expand_dims(recs + (row.to(gl.int64) * heads + h) * RECORD, 1) + gl.expand_dims(d, 0))
        lat = raw.to(gl.float8e4nv, bitcast=True).to(gl.float16)
        g = G0 + gl.arange(0, NG, layout=gl.SliceLayout(0, FL))
        at = recs + (row.to(gl.int64) * heads + hf) * RECORD + SCALE_AT
        factor = gl.load(gl.expand_dims(at.to(gl.pointer_type(gl.float32)), 1) + gl.expand_dims(g, 0))
    else:
        rows = gl.expand_dims(q + (row.to(gl.int64) * heads + h) * QDIM, 1)
        x = gl.load(rows + gl.expand_dims(d, 0)).to(gl.float32)
        if Q_MODE == 1:
            # as a cache record: per group 2**e, the smallest power of two with max(absmax, 1e-4) / 2**e <= 448
            xg = gl.reshape(x, [BH, NG, GROUP])
            absmax = gl.maximum(gl.max(gl.abs(xg), 2), 1e-4)
            mantissa = absmax.to(gl.int32, bitcast=True) & 0x7FFFFF
            e = _exponent(absmax) - 8 + (mantissa > 0x600000).to(gl.int32)  # 448 = 1.75 * 2**8
            codes = (xg * gl.expand_dims(_pow2(-e), 2)).to(gl.float8e4nv)
            lat = gl.reshape(codes.to(gl.float16), [BH, NG * GROUP])
            factor = gl.convert_layout(_pow2(e), FL) + zeros
        else:
            # bf16 times 2**-e with the row's absmax brought to [2**14, 2**15): every bf16 value within 2**29 of
            # it is a normal float16 (exact); an all-zero query keeps a finite exponent
            absmax = gl.max(gl.abs(x), 1)
            if NG != 4:  # the rest of the row too, so that every share of it is scaled alike
                whole = gl.load(rows + gl.expand_dims(gl.arange(0, LATENT, layout=gl.SliceLayout(0, QL)), 0))
                absmax = gl.maximum(absmax, gl.max(gl.abs(whole.to(gl.float32)), 1))
            e = _exponent(gl.maximum(absmax, 1e-30)) - 14
            lat = (x * gl.expand_dims(_pow2(-e), 1)).to(gl.float16)
            factor = gl.expand_dims(gl.convert_layout(_pow2(e), gl.SliceLayout(1, FL)), 1) + zeros
    return lat, factor


@gluon.jit
def _query_rope(q, row, h0, heads, r, layout: gl.constexpr, Q_MODE: gl.constexpr, BH: gl.constexpr):
    """Rope elements ``r`` of the query of heads [h0, h0 + BH) (bf16 [BH, len(r)], ``layout``)."""
    hr = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, layout))
    if Q_MODE == 2:
        at = q.to(gl.pointer_type(gl.uint8)) + (row.to(gl.int64) * heads + hr) * RECORD + ROPE_AT
        ropes = at.to(gl.pointer_type(gl.bfloat16))
    else:
        ropes = q + (row.to(gl.int64) * heads + hr) * QDIM + LATENT
    return gl.load(gl.expand_dims(ropes, 1) + gl.expand_dims(r, 0))


@gluon.jit
def _stage_query(q, row, h0, heads, q_s, qr_s, qf_s, Q_MODE: gl.constexpr, BH: gl.constexpr):
    """The query of heads [h0, h0 + BH) into shared memory: float16 latent in the score MMA's relabelled K
    order, bf16 rope, and the float32 factor of each (group, head) its scores are multiplied by."""
    lat, factor = _query_latent(q, row, h0, heads, 0, 4, Q_MODE, BH)
    q_s.store(gl.reshape(_k_order(gl.reshape(lat, [BH * 4, GROUP])), [BH, LATENT]))  # per group
    RL: gl.constexpr = _copy_layout(8, gl.num_warps())  # rope [BH, 64]
    qr_s.store(_query_rope(q, row, h0, heads, gl.arange(0, ROPE, layout=gl.SliceLayout(0, RL)), RL, Q_MODE, BH))
    qf_s.store(factor)


@gluon.jit
def _scores(q_s, qr_s, qf_s, lat, rope, sc, BH: gl.constexpr):
    """Scores [BH, 64] of one staged chunk, before ``sm_scale``: per latent group, float16 codes times
    float16 query, scaled by the group's query and key scales in float32; plus the bf16 rope product."""
    W: gl.constexpr = gl.num_warps()
    MMA: gl.constexpr = _mma(W)
    s = gl.zeros([BH, CHUNK], gl.float32, MMA)
    for g in gl.static_range(4):
        raw = lat.slice(g * GROUP, GROUP, dim=1).load(_key_layout(W))
        codes = raw.to(gl.float8e4nv, bitcast=True).to(gl.float16)
        keys = _candidate_order(gl.permute(_k_order(codes), [1, 0]))  # [K, score columns]
        keys = gl.convert_layout(keys, _operand(1, W), assert_trivial=True)
        part = mma_v2(q_s.slice(g * GROUP, GROUP, dim=1).load(_operand(0, W)), keys, gl.zeros_like(s))
        q_factor = qf_s.slice(g, 1, dim=1).load(MMA)  # [BH, 1]
        k_scale = gl.expand_dims(sc.slice(g * CHUNK, CHUNK).load(gl.SliceLayout(0, MMA)), 0)
        s += part * (q_factor * k_scale)
    return mma_v2(qr_s.load(_operand(0, W)), rope.permute([1, 0]).load(_operand(1, W)), s)  # staged in column order


@gluon.jit
def _values(acc, unit, unit_new, pa, lat, sc, rescale, g: gl.constexpr):
    """Group ``g``'s output columns [BH, 128] (relabelled order) after one more chunk. ``pa``: the
    probabilities as the value MMA's A operand (float16); the accumulator counts in units of the largest
    key scale of the group seen in its chunk (``unit_new``), so the float16 probabilities p * scale / unit lie
    in [0, 1]."""
    W: gl.constexpr = gl.num_warps()
    J: gl.constexpr = _value_columns(W)
    k_scale = gl.expand_dims(sc.slice(g * CHUNK, CHUNK).load(gl.SliceLayout(0, _operand(0, W))), 0)
    pw = pa * (k_scale * (1.0 / unit_new)).to(gl.float16)  # powers of two: as exact as rounding p * scale
    codes = lat.slice(g * GROUP, GROUP, dim=1).load(_value_layout(W)).to(gl.float8e4nv, bitcast=True)
    v = codes.to(gl.float16)  # converted in load order (a word's bytes pairwise), then regrouped by halves
    # [16s + 4q + 2h + e, 8J w + J r + j] -> K (candidates) 16s + 8h + 2q + e, N (columns) 8W j + 8w + r
    v = gl.reshape(gl.permute(gl.reshape(v, [4, 4, 2, 2, W, 8, J]), [0, 2, 1, 3, 6, 4, 5]), [CHUNK, GROUP])
    v = gl.convert_layout(v, _operand(1, W), assert_trivial=True)
    return mma_v2(pw, v, acc * gl.expand_dims(rescale * (unit / unit_new), 1))


@gluon.jit
def _unit(sc, unit, g: gl.constexpr):
    """Group ``g``'s unit for this chunk: its largest key scale, read whole by every warp (no cross-warp
    reduction); a chunk without live keys keeps the unit."""
    top = gl.max(sc.slice(g * CHUNK, CHUNK).load(_every_warp(gl.num_warps())), 0)
    return gl.where(top > 0, top, unit)


@gluon.jit
def _store_group(acc, unit, den_safe, part_out, at_row, g: gl.constexpr, PARTIAL_BF16: gl.constexpr):
    """Group ``g``'s normalised partial [BH, 128], columns back in stored order (logical 8W j + 8w + r is
    column 8J w + J r + j)."""
    BH: gl.constexpr = acc.shape[0]
    W: gl.constexpr = gl.num_warps()
    OL: gl.constexpr = _rows_layout(4, W)
    o = acc * gl.expand_dims(unit / den_safe, 1)
    o = gl.reshape(gl.permute(gl.reshape(o, [BH, _value_columns(W), W, 8]), [0, 2, 3, 1]), [BH, GROUP])
    o = gl.convert_layout(o, OL)
    col = g * GROUP + gl.arange(0, GROUP, layout=gl.SliceLayout(0, OL))
    at = gl.expand_dims(gl.convert_layout(at_row, gl.SliceLayout(1, OL)), 1) + gl.expand_dims(col, 0)
    if PARTIAL_BF16:
        gl.store(part_out.to(gl.pointer_type(gl.bfloat16)) + at, o.to(gl.bfloat16))
    else:
        gl.store(part_out + at, o)


@gluon.jit
def mla_decode_mma(
    q, kv, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads, topk, splits,
    BH: gl.constexpr, PARTIAL_BF16: gl.constexpr, Q_MODE: gl.constexpr, PDL: gl.constexpr,
):  # fmt: skip
    gluon_await_predecessor(PDL)
    W: gl.constexpr = gl.num_warps()
    gl.static_assert(BH == 16 or BH == 32, "the register layouts are built for 16 or 32 heads")
    gl.static_assert(W == 4 or W == 8, "the register layouts are built for 4 or 8 warps")
    MMA: gl.constexpr = _mma(W)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    row, h0, s, n, c0, c1 = _program_chunks(lengths, heads, topk, splits, BH)

    sw8: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    lat_s = gl.allocate_shared_memory(gl.uint8, [STAGES, CHUNK, LATENT], _latent_staging())
    rope_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, CHUNK, ROPE], sw8)
    # [stage, 4 groups x 64 candidates]; a one-dimensional layout, so a stage's group is a 1-D slice
    sc_s = gl.allocate_shared_memory(
        gl.float32, [STAGES, 4 * CHUNK], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    )
    q_s = gl.allocate_shared_memory(
        gl.float16, [BH, LATENT], gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    )
    qr_s = gl.allocate_shared_memory(
        gl.bfloat16, [BH, ROPE], gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    )
    qf_s = gl.allocate_shared_memory(
        gl.float32, [BH, 4], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    )

    la, ro, sx, score_ids = _chunk_ids(indices, row, topk, n, c0, c0 < c1)
    _issue(kv, la, ro, sx, num_slots, lat_s.index(0), rope_s.index(0), sc_s.index(0))
    la, ro, sx, next_score_ids = _chunk_ids(indices, row, topk, n, c0 + 1, c0 + 1 < c1)
    _stage_query(q, row, h0, heads, q_s, qr_s, qf_s, Q_MODE, BH)

    m = gl.full([BH], float("-inf"), gl.float32, ROWS)
    den = gl.zeros([BH, CHUNK], gl.float32, MMA)
    acc0 = gl.zeros([BH, GROUP], gl.float32, MMA)
    acc1 = gl.zeros([BH, GROUP], gl.float32, MMA)
    acc2 = gl.zeros([BH, GROUP], gl.float32, MMA)
    acc3 = gl.zeros([BH, GROUP], gl.float32, MMA)
    unit0 = 1.0
    unit1 = 1.0
    unit2 = 1.0
    unit3 = 1.0
    for c in range(c0, c1):
        st = (c - c0) % STAGES
        nx = (c - c0 + 1) % STAGES
        gl.thread_barrier()  # every warp is done with the stage the next chunk goes to
        _issue(kv, la, ro, sx, num_slots, lat_s.index(nx), rope_s.index(nx), sc_s.index(nx))
        live = _live(score_ids, num_slots)
        score_ids = next_score_ids
        la, ro, sx, next_score_ids = _chunk_ids(indices, row, topk, n, c + 2, c + 2 < c1)
        async_copy.wait_group(1)  # this chunk's copies (the next chunk's may be in flight)
        gl.thread_barrier()  # everyone's
        lat = lat_s.index(st)
        sc = sc_s.index(st)
        sco = _scores(q_s, qr_s, qf_s, lat, rope_s.index(st), sc, BH)
        sco = gl.where(gl.expand_dims(live, 0), sco * sm_scale, float("-inf"))
        m_new, alpha, p, den = _softmax_step(sco, m, den, 1)
        pa = gl.convert_layout(p.to(gl.float16), _operand(0, W))  # the one exchange between warps
        new0 = _unit(sc, unit0, 0)
        new1 = _unit(sc, unit1, 1)
        new2 = _unit(sc, unit2, 2)
        new3 = _unit(sc, unit3, 3)
        acc0 = _values(acc0, unit0, new0, pa, lat, sc, alpha, 0)
        acc1 = _values(acc1, unit1, new1, pa, lat, sc, alpha, 1)
        acc2 = _values(acc2, unit2, new2, pa, lat, sc, alpha, 2)
        acc3 = _values(acc3, unit3, new3, pa, lat, sc, alpha, 3)
        unit0, unit1, unit2, unit3 = new0, new1, new2, new3
        m = m_new
    async_copy.wait_group(0)

    lse, den_safe = _finish(m, den, 1)
    h = h0 + gl.arange(0, BH, layout=ROWS)
    slot = (row.to(gl.int64) * splits + s) * heads + h
    gl.store(part_lse + slot, lse)
    at_row = slot * LATENT
    _store_group(acc0, unit0, den_safe, part_out, at_row, 0, PARTIAL_BF16)
    _store_group(acc1, unit1, den_safe, part_out, at_row, 1, PARTIAL_BF16)
    _store_group(acc2, unit2, den_safe, part_out, at_row, 2, PARTIAL_BF16)
    _store_group(acc3, unit3, den_safe, part_out, at_row, 3, PARTIAL_BF16)
