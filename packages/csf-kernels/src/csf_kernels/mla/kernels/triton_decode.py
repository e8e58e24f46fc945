"""Triton: sparse MLA decode over FP8 KV records (csf_kernels.mla.layout), split over the top-k list.

One program takes one query row, ``BH`` heads and one split of the row's live candidates. Candidates
come in chunks of 64; the balanced policy gives split ``s`` of ``splits`` the chunks
``[s * cps, (s + 1) * cps)`` with ``cps = ceil(live_chunks / splits)``, so a short row still spreads over
every split. Each split writes its normalised output and log-sum-exp; ``mla_merge`` combines the splits.
A candidate is skipped when its position is past the row's length, its index is negative, or it is not
below ``num_slots``: nothing is read outside the cache.

Operands (``F16``, chosen per head block by measurement, ``mla_specs``). Online softmax in float32
either way: the running maximum rescales the normaliser and the accumulator whenever it rises; the
rope part (bf16 in the record) is a bf16 product.
- bf16 (``F16`` 0; the 64-head wgmma programs): the latent as E4M3 -> bf16 times its group scale, both
  exact; the query as given (a loaded operand, which wgmma reads from shared memory).
- float16 (``F16`` 1; the 16- and 32-head mma.sync programs): an E4M3 code converts to float16 exactly,
  one instruction per two, in the MMA operand layout. A record's four power-of-two group scales split
  into its largest, ``k_top``, kept out of the operands, and the ratios 2**(e_g - e_top) in [0, 1]
  multiplied into the codes (exact while a record's groups lie within 2**15 of each other). Scores =
  (q16 . k16) * q_scale * k_top, the query as float16 times a power of two per head (mode 0: the bf16
  values with the absmax brought to [2**14, 2**15), exact; modes 1 and 2: the query's own E4M3 codes
  and group scales); the value product (p * k_top / unit) as float16 . k16 with the accumulator counted
  in units of the chunk's largest k_top (rescaled exactly when the unit changes, while successive
  chunks' units lie within 2**100 of each other), so the probabilities lie in [0, 1] (11 significant
  bits down to 2**-14) and the MMA accumulates in place. A computed (not loaded) query would be wgmma's
  register operand, 64 x 512 per warpgroup, and spill: the reason the 64-head programs keep bf16 (float16
  measures slower even with the query staged through memory; ``docs/archive/perf-log.md``, "The Gluon
  program for 16 and 32 heads").

With one split per row (``DIRECT``) the program finishes the output itself with the merge's own helpers
(``mla_finish``): the same bits as the float32-partial merge, without the partials' round trip.

The query (``Q_MODE``): 0, bf16 as given; 1, bf16 quantized here the way the cache quantizes a record
(E4M3 latent per 128 with a power-of-two scale from the absmax's bits); 2, already packed as 656-byte
records (``csf_attention.pack_query``). Modes 1 and 2 give bit-identical outputs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.mla import layout as mla_layout
from csf_kernels.mla.kernels.finish import finished, keys_lse, reference_max, split_weight, weighted

SIGNATURE = {
    "q": "*bf16",  # [rows, heads, 576] bf16, or [rows, heads, 656] packed records (Q_MODE 2)
    "kv": "*u8",  # [num_slots, 656] records
    "indices": "*i32",  # [rows, topk]
    "lengths": "*i32",  # [rows]
    "part_out": "*fp32",  # [rows * splits, heads, 512], float32 or bf16 (PARTIAL_BF16)
    "part_lse": "*fp32",  # [rows * splits, heads]
    "attn_sink": "*fp32",  # [heads] (DIRECT and HAS_SINK)
    "out": "*bf16",  # [rows, heads, 512] (DIRECT)
    "lse_out": "*fp32",  # [rows, heads] (DIRECT and WRITE_LSE)
    "num_slots": "i64",
    "sm_scale": "fp32",
    "heads": "i32",
    "topk": "i32",
    "splits": "i32",  # = grid dimension 1
    "BH": "constexpr",
    "PARTIAL_BF16": "constexpr",
    "Q_MODE": "constexpr",
    "DIRECT": "constexpr",  # one split: finish here as mla_merge would (same instructions), no partials
    "HAS_SINK": "constexpr",
    "WRITE_LSE": "constexpr",
    "F16": "constexpr",  # float16 operands (1) or bf16 (0)
    "REGROUP": "constexpr",  # an identity split/join after the latent's conversion (see _latent)
}
MULTIPLE_OF = {"heads": 16, "topk": 64}  # compiled in as divisible (checked at bind)

LATENT = tl.constexpr(mla_layout.LATENT)
ROPE = tl.constexpr(mla_layout.ROPE)
CHUNK = tl.constexpr(mla_layout.CHUNK)
GROUP = tl.constexpr(mla_layout.GROUP)
GROUPS = tl.constexpr(mla_layout.GROUPS)
RECORD = tl.constexpr(mla_layout.RECORD_BYTES)
SCALE_AT = tl.constexpr(mla_layout.SCALE_OFFSET)
ROPE_AT = tl.constexpr(mla_layout.ROPE_OFFSET)
QDIM = tl.constexpr(mla_layout.HEAD_DIM)


@triton.jit
def _pow2(e):
    """2**e as float32 for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _exponent(x):
    """The binary exponent of positive normal float32 ``x``."""
    return ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _relative(codes, scales, live, N: tl.constexpr):
    """E4M3 codes (float16 [N, 512]) with their group scales (float32 [N, 4], powers of two) as float16
    relative to each row's largest scale, and that scale (float32 [N]; 0 where not ``live``). Times
    2**(e_g - e_top) the codes stay exact while a row's group scales lie within 2**15 of each other
    (beyond, the small groups keep fewer bits)."""
    top = tl.max(scales, 1)
    rel = tl.where(live[:, None], scales / tl.where(live, top, 1.0)[:, None], 0.0)  # powers of two in [0, 1]
    lat = tl.reshape(codes, [N, GROUPS, GROUP]) * rel.to(tl.float16)[:, :, None]
    return tl.reshape(lat, [N, LATENT]), tl.where(live, top, 0.0)


@triton.jit
def _scaled(codes, scales, N: tl.constexpr):
    """bf16 [N, 512]: E4M3 codes (bf16) times their group scales (float32 [N, 4]), exact."""
    lat = tl.reshape(codes, [N, GROUPS, GROUP]) * scales.to(tl.bfloat16)[:, :, None]
    return tl.reshape(lat, [N, LATENT])


@triton.jit
def _latent(rec, live, N: tl.constexpr, F16: tl.constexpr, REGROUP: tl.constexpr = False):
    """The latent of ``N`` records at ``rec`` (u8 pointers): float16 as ``_relative`` gives it, or bf16
    scaled (``_scaled``, with a unit scale of 1).

    Without ``REGROUP`` Triton moves the conversion past the byte tile's layout changes, once per MMA
    operand, pairing bytes of different records with PRMTs for the value product's operand. An identity
    split and join after the conversion keeps it in one place (fewer SASS instructions per chunk); it measures
    faster on 4-warp programs and slower on 8-warp ones (``docs/archive/perf-log.md``, "The Gluon program for
    16 and 32 heads"), so the decode config chooses it."""
    d = tl.arange(0, LATENT)
    g = tl.arange(0, GROUPS)
    raw = tl.load(rec[:, None] + d[None, :], mask=live[:, None], other=0)
    scales = tl.load((rec + SCALE_AT).to(tl.pointer_type(tl.float32))[:, None] + g[None, :], mask=live[:, None],
                     other=0.0)  # fmt: skip
    codes = raw.to(tl.float8e4nv, bitcast=True)
    if F16:
        lat, top = _relative(codes.to(tl.float16), scales, live, N)
    else:
        lat = _scaled(codes.to(tl.bfloat16), scales, N)
        top = tl.full([N], 1.0, tl.float32)
    if REGROUP:
        lo, hi = tl.split(tl.reshape(lat, [N, LATENT // 2, 2]))
        lat = tl.reshape(tl.join(lo, hi), [N, LATENT])
    return lat, top


@triton.jit
def _rope(rec, live):
    r = tl.arange(0, ROPE)
    ropes = (rec + ROPE_AT).to(tl.pointer_type(tl.bfloat16))
    return tl.load(ropes[:, None] + r[None, :], mask=live[:, None], other=0.0)


@triton.jit
def _query(q_row, q_rec, h, Q_MODE: tl.constexpr, BH: tl.constexpr, F16: tl.constexpr):
    """The query latent of heads ``h`` as the operand type [BH, 512] and its power-of-two scale per head
    [BH] (1 for bf16)."""
    if Q_MODE == 2:
        lat, scale = _latent(q_rec, h >= 0, BH, F16)
    else:
        d = tl.arange(0, LATENT)
        x = tl.load(q_row[:, None] + d[None, :])
        scale = tl.full([BH], 1.0, tl.float32)
        if Q_MODE == 1:
            # the record's quantization per group: 2**e, the smallest power of two with
            # max(absmax, 1e-4) / 2**e <= 448; then as a record's latent
            xg = tl.reshape(x.to(tl.float32), [BH, GROUPS, GROUP])
            absmax = tl.maximum(tl.max(tl.abs(xg), 2), 1e-4)
            mantissa = absmax.to(tl.int32, bitcast=True) & 0x7FFFFF
            e = _exponent(absmax) - 8 + (mantissa > 0x600000).to(tl.int32)  # 448 = 1.75 * 2**8
            codes = tl.reshape((xg * _pow2(-e)[:, :, None]).to(tl.float8e4nv), [BH, LATENT])
            if F16:
                lat, scale = _relative(codes.to(tl.float16), _pow2(e), h >= 0, BH)
            else:
                lat = _scaled(codes.to(tl.bfloat16), _pow2(e), BH)
        elif F16:
            # bf16 times 2**-e with the absmax brought to [2**14, 2**15): every bf16 value within 2**29 of
            # it is a normal float16 (exact); an all-zero query keeps a finite exponent
            e = _exponent(tl.maximum(tl.max(tl.abs(x.to(tl.float32)), 1), 1e-30)) - 14
            lat = (x.to(tl.float32) * _pow2(-e)[:, None]).to(tl.float16)
            scale = _pow2(e)
        else:
            lat = x  # loaded, not computed: wgmma reads it from shared memory
    return lat, scale


@triton.jit
def _emit(o, row, h, s, splits, heads, part_out, out, w, total, PARTIAL_BF16: tl.constexpr,
          DIRECT: tl.constexpr):  # fmt: skip
    """Store the output (DIRECT: finished as the merge would) or the split's partial."""
    d = tl.arange(0, LATENT)
    if DIRECT:
        res = finished(weighted(w[:, None], o), total[:, None])
        tl.store(out + (row.to(tl.int64) * heads + h[:, None]) * LATENT + d[None, :], res.to(tl.bfloat16))
    else:
        at = ((row.to(tl.int64) * splits + s) * heads + h[:, None]) * LATENT + d[None, :]
        if PARTIAL_BF16:
            tl.store(part_out.to(tl.pointer_type(tl.bfloat16)) + at, o.to(tl.bfloat16))
        else:
            tl.store(part_out + at, o)


@triton.jit
def mla_decode(
    q,
    kv,
    indices,
    lengths,
    part_out,
    part_lse,
    attn_sink,
    out,
    lse_out,
    num_slots,
    sm_scale,
    heads,
    topk,
    splits,
    BH: tl.constexpr,  # heads per program
    PARTIAL_BF16: tl.constexpr,
    Q_MODE: tl.constexpr,  # 0 bf16, 1 bf16 quantized here, 2 packed records
    DIRECT: tl.constexpr,
    HAS_SINK: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    F16: tl.constexpr,
    REGROUP: tl.constexpr,
):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    head_blocks = heads // BH
    row = pid // head_blocks
    h = (pid % head_blocks) * BH + tl.arange(0, BH)
    n = tl.minimum(tl.maximum(tl.load(lengths + row), 0), topk)
    live_chunks = (n + CHUNK - 1) // CHUNK
    cps = (live_chunks + splits - 1) // splits
    c0 = s * cps
    c1 = tl.minimum(c0 + cps, live_chunks)

    q_heads = row.to(tl.int64) * heads + h
    q_rec = q.to(tl.pointer_type(tl.uint8)) + q_heads * RECORD  # Q_MODE 2
    q_row = q + q_heads * QDIM  # Q_MODE 0 and 1
    q_lat, q_scale = _query(q_row, q_rec, h, Q_MODE, BH, F16)
    if Q_MODE == 2:
        q_rope = _rope(q_rec, h >= 0)
    else:
        q_rope = tl.load(q_row[:, None] + LATENT + tl.arange(0, ROPE)[None, :])

    m = tl.full([BH], float("-inf"), tl.float32)
    den = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, LATENT], tl.float32)
    unit = 1.0  # the accumulator's unit (float16 operands): a power of two
    j = tl.arange(0, CHUNK)
    for c in range(c0, c1):
        pos = c * CHUNK + j
        idx = tl.load(indices + row.to(tl.int64) * topk + pos, mask=pos < n, other=-1)
        live = (pos < n) & (idx >= 0) & (idx.to(tl.int64) < num_slots)
        rec = kv + tl.where(live, idx, 0).to(tl.int64) * RECORD
        k, k_top = _latent(rec, live, CHUNK, F16, REGROUP)
        sc = tl.dot(q_lat, tl.trans(k))
        if F16:
            sc = sc * (q_scale[:, None] * k_top[None, :])  # powers of two: exact
        sc += tl.dot(q_rope, tl.trans(_rope(rec, live)))
        sc = tl.where(live[None, :], sc * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no live key yet: keep exp() finite
        alpha = tl.exp(m - m_ref)  # rescales what earlier chunks accumulated (0 before the first key)
        p = tl.exp(sc - m_ref[:, None])
        den = den * alpha + tl.sum(p, 1)
        if F16:
            # values k16 * k_top: the accumulator counts in units of the chunk's largest k_top, so the
            # float16 probabilities p * k_top / unit lie in [0, 1]
            chunk_top = tl.max(k_top, 0)
            unit_new = tl.where(chunk_top > 0, chunk_top, unit)  # a chunk without live keys keeps the unit
            acc = tl.dot(
                (p * (k_top / unit_new)[None, :]).to(tl.float16), k, acc * (alpha * (unit / unit_new))[:, None]
            )
            unit = unit_new
        else:
            acc = tl.dot(p.to(tl.bfloat16), k, acc * alpha[:, None])
        m = m_new

    has = den > 0
    lse = tl.where(has, m + tl.log(tl.where(has, den, 1.0)), float("-inf"))
    den_safe = tl.where(has, den, 1.0)[:, None]
    w = lse
    total = lse
    if DIRECT:  # the merge of this one split, by the merge's own helpers
        m_all = lse
        if HAS_SINK:
            sink = tl.load(attn_sink + h)
            m_all = tl.maximum(m_all, sink)
        m_fin = reference_max(m_all)
        w = split_weight(lse, m_fin)
        total = w
        if HAS_SINK:
            total = w + tl.exp(sink - m_fin)
        if WRITE_LSE:
            tl.store(lse_out + row.to(tl.int64) * heads + h, keys_lse(w, m_fin))
    else:
        tl.store(part_lse + (row.to(tl.int64) * splits + s) * heads + h, lse)
    _emit(acc * unit / den_safe, row, h, s, splits, heads, part_out, out, w, total, PARTIAL_BF16, DIRECT)
