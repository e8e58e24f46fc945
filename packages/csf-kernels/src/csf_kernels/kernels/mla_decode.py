"""Triton: sparse MLA decode over FP8 KV records (csf_kernels.mla_layout), split over the top-k list.

One program takes one query row, ``BH`` heads and one split of the row's live candidates. Candidates
come in chunks of 64; the balanced policy gives split ``s`` of ``splits`` the chunks
``[s * cps, (s + 1) * cps)`` with ``cps = ceil(live_chunks / splits)``, so a short row still spreads over
every split. Per chunk: gather the 64 records, dequantize the latent to bf16 (exact: E4M3 times a
power of two), scores = q_latent . k_latent + q_rope . k_rope (float32), then an online softmax whose
running maximum rescales both the normaliser and the accumulator whenever it rises. Each split writes its
normalised output and log-sum-exp; ``mla_merge`` combines the splits. A candidate is skipped when its
position is past the row's length, its index is negative, or it is not below ``num_slots``: nothing is
read outside the cache.

With one split per row (``DIRECT``) the program finishes the output itself with the merge's own helpers
(``mla_finish``): the same bits as the float32-partial merge, without the partials' round trip.

The query (``Q_MODE``): 0, bf16 as given; 1, bf16 quantized here the way the cache quantizes a record
(E4M3 latent per 128 with a power-of-two scale from the absmax's bits); 2, already packed as 656-byte
records (``csf_attention.pack_query``). Modes 1 and 2 give bit-identical outputs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .mla_finish import finished, keys_lse, reference_max, split_weight, weighted

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
}
MULTIPLE_OF = {"heads": 16, "topk": 64}  # compiled in as divisible (checked at bind)

LATENT = tl.constexpr(512)
ROPE = tl.constexpr(64)
CHUNK = tl.constexpr(64)
GROUP = tl.constexpr(128)
RECORD = tl.constexpr(656)
SCALE_AT = tl.constexpr(512)
ROPE_AT = tl.constexpr(528)
QDIM = tl.constexpr(576)


@triton.jit
def _records(rec, live, N: tl.constexpr):
    """Latent (bf16 [N, 512], exact) and rope (bf16 [N, 64]) of ``N`` records at ``rec`` (u8 pointers)."""
    d = tl.arange(0, LATENT)
    g = tl.arange(0, LATENT // GROUP)
    r = tl.arange(0, ROPE)
    lat8 = tl.load(rec[:, None] + d[None, :], mask=live[:, None], other=0)
    scales = (rec + SCALE_AT).to(tl.pointer_type(tl.float32))
    scale = tl.load(scales[:, None] + g[None, :], mask=live[:, None], other=0.0)
    # E4M3 -> bf16 is exact, and so is the product with a power-of-two scale
    lat = lat8.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    lat = tl.reshape(lat, [N, LATENT // GROUP, GROUP]) * scale.to(tl.bfloat16)[:, :, None]
    k = tl.reshape(lat, [N, LATENT])
    ropes = (rec + ROPE_AT).to(tl.pointer_type(tl.bfloat16))
    rope = tl.load(ropes[:, None] + r[None, :], mask=live[:, None], other=0.0)
    return k, rope


@triton.jit
def _quantized(x, N: tl.constexpr):
    """bf16 [N, 512] -> the same values quantized as a record's latent (E4M3 per 128, power-of-two
    scale 2**e: the smallest with absmax / 2**e <= 448, absmax floored at 1e-4), dequantized exactly."""
    g = tl.reshape(x.to(tl.float32), [N, LATENT // GROUP, GROUP])
    bits = tl.maximum(tl.max(tl.abs(g), 2), 1e-4).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)  # 448 = 1.75 * 2**8
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    scale = ((127 + e) << 23).to(tl.float32, bitcast=True)
    codes = (g * inv[:, :, None]).to(tl.float8e4nv)
    return tl.reshape(codes.to(tl.bfloat16) * scale.to(tl.bfloat16)[:, :, None], [N, LATENT])


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

    d = tl.arange(0, LATENT)
    if Q_MODE == 2:
        q_rec = q.to(tl.pointer_type(tl.uint8)) + (row.to(tl.int64) * heads + h) * RECORD
        q_lat, q_rope = _records(q_rec, h >= 0, BH)
    else:
        q_row = q + (row.to(tl.int64) * heads + h[:, None]) * QDIM
        q_lat = tl.load(q_row + d[None, :])
        q_rope = tl.load(q_row + LATENT + tl.arange(0, ROPE)[None, :])
        if Q_MODE == 1:
            q_lat = _quantized(q_lat, BH)
    m = tl.full([BH], float("-inf"), tl.float32)
    den = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, LATENT], tl.float32)
    j = tl.arange(0, CHUNK)
    for c in range(c0, c1):
        pos = c * CHUNK + j
        idx = tl.load(indices + row.to(tl.int64) * topk + pos, mask=pos < n, other=-1)
        live = (pos < n) & (idx >= 0) & (idx.to(tl.int64) < num_slots)
        rec = kv + tl.where(live, idx, 0).to(tl.int64) * RECORD
        k, rope = _records(rec, live, CHUNK)
        sc = tl.dot(q_lat, tl.trans(k)) + tl.dot(q_rope, tl.trans(rope))
        sc = tl.where(live[None, :], sc * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no live key yet: keep exp() finite
        alpha = tl.exp(m - m_ref)  # rescales what earlier chunks accumulated (0 before the first key)
        p = tl.exp(sc - m_ref[:, None])
        den = den * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), k)
        m = m_new

    has = den > 0
    lse = tl.where(has, m + tl.log(tl.where(has, den, 1.0)), float("-inf"))
    o = acc / tl.where(has, den, 1.0)[:, None]
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
        res = finished(weighted(w[:, None], o), total[:, None])
        tl.store(out + (row.to(tl.int64) * heads + h[:, None]) * LATENT + d[None, :], res.to(tl.bfloat16))
        if WRITE_LSE:
            tl.store(lse_out + row.to(tl.int64) * heads + h, keys_lse(w, m_fin))
    else:
        slot = row.to(tl.int64) * splits + s
        at = (slot * heads + h[:, None]) * LATENT + d[None, :]
        if PARTIAL_BF16:
            tl.store(part_out.to(tl.pointer_type(tl.bfloat16)) + at, o.to(tl.bfloat16))
        else:
            tl.store(part_out + at, o)
        tl.store(part_lse + slot * heads + h, lse)
