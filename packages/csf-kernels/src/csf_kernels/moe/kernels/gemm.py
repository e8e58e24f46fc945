"""Triton: the grouped expert GEMM of a fused MoE layer, W4A16 (MXFP4 or NVFP4 weights, bf16 activations).

One program computes ``BN`` weight rows (FC1: ``BN`` gate rows and the matching ``BN`` up rows) for one
block of ``BM`` routes of one expert (from ``moe_align``), as ``acc[BN, BM] += W[BN, BK] @ X[BM, BK]^T``:
the weights are the MMA's A operand (the swap-AB form, so decode with a handful of routes per expert
still fills M), dequantized in registers to bf16, one K step per inline tile (4 scale columns: K = 128
for MXFP4, 64 for NVFP4).

The scale bytes of a step come from one of two sources (``SRC``); everything after them is shared code,
so outputs are bit-identical across sources:

* 0, native: the scale plane ``[E, R, C]`` (a model's own plane, or a CSF plane expanded into scratch);
* 1, inline: the tile records of the inline CSF form (docs/csf-format.md section 5), decoded here.

FP4 x scale products are exact in bf16 (E8M0: a power of two; E4M3: 3 + 2 significant bits), so the
tensor cores see the exact dequantized weights; NVFP4's per-expert global scale multiplies the fp32
accumulator. FC1 applies bias and the activation (SiLU-and-mul, or gpt-oss's clamped SwiGLU) and stores
bf16 ``[pairs, N]``; FC2 adds its bias and stores bf16 ``[pairs, H]`` for the combine step.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.moe.fp4_words import BIT_POSITIONS, PANEL_ROWS
from csf_kernels.record.triton import (
    MODE_RAW,
    exception_capacity,
    header_count,
    header_mode,
    header_origin,
    header_raw_index,
    record_at,
    record_header,
    row_block_of,
    row_slot,
    selector_words,
)
from csf_kernels.runtime.pdl import await_predecessor

_BIT_POSITIONS = tl.constexpr(BIT_POSITIONS)
_PANEL_ROWS = tl.constexpr(PANEL_ROWS)  # rows of a block of K-step tiles (fp4_words)

SIGNATURE = {
    "x": "*bf16",
    "w": "*u8",
    "scales": "*u8",
    "wide": "*u8",  # MXFP4, decode program: 1 where a 64-row tile's scales need two multiplies (moe.wide_row_tiles)
    "base_ref": "*u8",
    "base_delta": "*u8",
    "records": "*u8",
    "raw": "*u8",
    "tail": "*u8",
    "tail_raw": "*u8",
    "gscale": "*fp32",
    "bias": "*fp32",
    "out": "*bf16",
    "part": "*fp32",
    "sorted_ids": "*i32",
    "block_expert": "*i32",
    "meta": "*i32",
    "pairs": "i32",
    "x_row_div": "i32",
    "n_out": "i32",
    "K": "i32",
    "C": "i32",
    "row_group": "i32",
    "blocks_per_group": "i32",
    "full_tiles": "i32",
    "S": "i32",  # inline: record bytes of full tiles
    "S_TAIL": "i32",  # inline: record bytes of the tail tile (0: none)
    "TC": "i32",  # inline: columns of the tail tile
    "steps_per_split": "i32",
    "FMT": "constexpr",  # 0 MXFP4 (E8M0 per 32), 1 NVFP4 (E4M3 per 16)
    "SRC": "constexpr",  # 0 native plane, 1 inline records
    "FC1": "constexpr",
    "ACT": "constexpr",  # FC1 only: 0 SiLU-and-mul, 1 gpt-oss clamped SwiGLU
    "HAS_BIAS": "constexpr",
    "HAS_GSCALE": "constexpr",
    "DB": "constexpr",  # inline: bits per row-base delta
    "ASM": "constexpr",  # PTX weight conversion (0 only for Triton's CPU interpreter)
    "PREFETCH": "constexpr",  # load step t + 1's weight words before converting step t's (sweeps only)
    "SPLIT": "constexpr",  # split K over grid z: store float32 partials [splits, pairs, R], no epilogue
    "BM": "constexpr",
    "BN": "constexpr",
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}

# integer arguments the program is compiled to assume divisible (pointers: 16 bytes); the runtime checks
# them at bind. K % 32: the weight row stride (K // 32) * 16 bytes is then provably 16-byte aligned.
MULTIPLE_OF = {"K": 32, "n_out": 16, "S": 16, "S_TAIL": 16}

SWIGLU_ALPHA = tl.constexpr(1.702)
SWIGLU_LIMIT = tl.constexpr(7.0)
EXC_UNROLL = tl.constexpr(4)  # inline exception entries loaded per round


@triton.jit
def _e2m1_f32(code):
    """E2M1 codes (int32, 0..15) -> float32: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives."""
    m = code & 7
    bits = tl.where(m >= 2, (((m >> 1) + 126) << 23) | ((m & 1) << 22), tl.where(m == 1, 126 << 23, 0))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _placed_code(word, i: tl.constexpr):
    """E2M1 code (0..15) of weight ``i`` of a GEMM word: its bits gathered from csf_kernels.moe.fp4_words'
    ``BIT_POSITIONS[i]``."""
    bits: tl.constexpr = _BIT_POSITIONS[i]
    code = (word >> bits[0]) & 1
    code |= ((word >> bits[1]) & 1) << 1
    code |= ((word >> bits[2]) & 1) << 2
    return code | (((word >> bits[3]) & 1) << 3)


@triton.jit
def _scale_f32(s, FMT: tl.constexpr):
    """Scale bytes (int32) -> float32: E8M0 2**(s - 127) (0xFF: NaN), or E4M3."""
    if FMT == 0:
        bits = tl.where(s == 0, 0x00400000, tl.where(s == 255, 0x7FC00000, s << 23))
        return bits.to(tl.float32, bitcast=True)
    else:
        return s.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _row_setup(rows, valid, e, R, row_group, blocks_per_group, base_ref, base_delta, DB: tl.constexpr):
    """Per weight row: its inline row block, slot, and row base (reference + delta)."""
    within = rows % row_group
    rb = (e * (R // row_group) + rows // row_group) * blocks_per_group + within // 128
    rb = tl.where(valid, rb, 0)
    slot = row_slot(within % 128)
    ref = tl.load(base_ref + rb, mask=valid, other=0).to(tl.int32)
    if DB == 4:
        d = tl.load(base_delta + rb * 64 + slot // 2, mask=valid, other=0).to(tl.int32)
        d = (d >> ((slot & 1) * 4)) & 15
    else:
        d = tl.load(base_delta + rb * 128 + slot, mask=valid, other=0).to(tl.int32)
    return rb, slot, ref + d


@triton.jit
def _inline_ahead(records, tail, rb, slot, valid, t, h, steps, full_tiles, S, S_TAIL, TC):
    """Loads for step ``t`` (header ``h``, already loaded) ahead of its decode: the rows' selector words,
    and step ``t + 1``'s header. Masked past the last step."""
    lo, hi = selector_words(records, tail, rb, slot, valid & (t < steps), t, h, full_tiles, S, S_TAIL, TC)
    return lo, hi, record_header(records, tail, rb, t + 1, steps, full_tiles, S, S_TAIL)


@triton.jit
def _inline_scales(
    records, raw, tail, tail_raw, rb, slot, base, valid, t, h, lo, hi, full_tiles, C, S, S_TAIL, TC,
    NEUTRAL: tl.constexpr,
):  # fmt: skip
    """Scale bytes [BN, 4] of column tile ``t`` for rows (slot, base) of row block ``rb`` (one block per
    program: the host checks), decoded from the tile's record: its header ``h`` and the rows' selector
    words ``lo``, ``hi`` come loaded a step ahead."""
    c = tl.arange(0, 4)[None, :]
    is_tail = t >= full_tiles
    tcx = tl.where(is_tail, TC, 4)
    rec, sbytes = record_at(records, tail, rb, t, full_tiles, S, S_TAIL)
    mode = header_mode(h)
    is_raw = mode == MODE_RAW
    w = tl.where(is_raw, 1, 1 << mode)
    origin = header_origin(h)
    bit = slot * tcx * w  # the slot's tcx fields: tcx * w contiguous bits from here
    x = ((hi.to(tl.uint32).to(tl.int64) << 32) | lo.to(tl.uint32).to(tl.int64)) >> (bit & 31).to(tl.int64)
    field = ((x[:, None] >> (c * w).to(tl.int64)) & ((1 << w) - 1)).to(tl.int32)
    val = base[:, None] + origin + field
    live = valid[:, None] & (c < tcx) & (t * 4 + c < C)
    if is_raw:
        raw_base = tl.where(is_tail, tail_raw, raw)
        rv = tl.load(raw_base + header_raw_index(h) * (128 * tcx) + slot[:, None] * tcx + c, mask=live, other=0)
        val = rv.to(tl.int32)
    else:  # exceptions: ascending (position, value) pairs after the selectors
        count = header_count(h)
        sb = 16 * tcx * w
        cap = exception_capacity(sbytes, sb)
        pos_here = slot[:, None] * tcx + c
        positions = (rec + sb).to(tl.pointer_type(tl.int16))  # u16 at an even offset of an aligned record
        # EXC_UNROLL entries per round, their loads independent: most tiles hold fewer, so one round trip
        for i0 in range(0, count, EXC_UNROLL):
            for u in tl.static_range(EXC_UNROLL):
                ok = i0 + u < count
                p = tl.load(positions + i0 + u, mask=ok, other=0).to(tl.int32) & 0xFFFF
                v = tl.load(rec + sb + 2 * cap + i0 + u, mask=ok, other=0).to(tl.int32)
                val = tl.where((pos_here == p) & ok, v, val)
    return tl.where(live, val, NEUTRAL)


@triton.jit
def _native_scales(scales_e, rows, valid, t, C, NEUTRAL: tl.constexpr):
    col = t * 4 + tl.arange(0, 4)[None, :]
    live = valid[:, None] & (col < C)
    s = tl.load(scales_e + rows[:, None] * C + col, mask=live, other=NEUTRAL)
    return s.to(tl.int32)


# E2M1 -> bf16 in registers, one 32-bit word (eight weights in the layout of csf_kernels.moe.fp4_words) per
# call: each weight's four bits placed where a bf16 keeps them (the weight times 2**-126, exactly: zero
# exponents land on bf16 subnormals), then per pair one bf16x2 multiply by the block scale times 2**126,
# or where that factor would overflow bf16 (E8M0 bytes 129..254, E4M3 scales) by 2**126 and then by the
# scale. Either way the weight's product with its scale is rounded once, as a multiply of the exact bf16
# weight by the scale rounds it. Outputs $0..$7: weights 0..7; $8 the word; $9 the factor or the scale
# (bf16). 9 instructions place a word's weights (22 with the byte lookups before), 4 or 8 multiply.
_PLACE = """
and.b32 p0, $8, 0x81C081C0;
shl.b32 t, $8, 4;
and.b32 p1, t, 0x81C081C0;
shf.l.wrap.b32 t, $8, $8, 10;
and.b32 p2, t, 0x81C081C0;
shr.b32 t, $8, 2;
and.b32 t, t, 0x01000100;
shl.b32 p3, $8, 6;
lop3.b32 p3, p3, t, 0x80C080C0, 0xEC;"""  # pair 3: (word << 6 & mask) | (word >> 2 & 0x01000100)
_TWO_POW_126 = "0x7E807E80"  # bf16x2


def _word_asm(multiplies: int) -> str:
    scale = "".join(f"\nmul.rn.bf16x2 p{k}, p{k}, u;" for k in range(4)) if multiplies == 2 else ""
    return (
        "{\n.reg .b32 p0, p1, p2, p3, t, f, u;\nmov.b32 f, {$9, $9};"
        + (f"\nmov.b32 u, {_TWO_POW_126};" if multiplies == 2 else "")
        + _PLACE
        + scale
        + "".join(f"\nmul.rn.bf16x2 p{k}, p{k}, f;" for k in range(4))
        + "".join(f"\nmov.b32 {{${2 * k}, ${2 * k + 1}}}, p{k};" for k in range(4))
        + "\n}"
    )


# $9: bf16 2**(s - 1) for E8M0 bytes s <= 128 or 255 (``placed_factor``); any scale with the second form
E2M1_WORD_ASM_ONE_MULTIPLY = tl.constexpr(_word_asm(1))
E2M1_WORD_ASM = tl.constexpr(_word_asm(2))


@triton.jit
def _scale_bf16(s, FMT: tl.constexpr):
    """Scale bytes (int32) -> bf16, exactly (E8M0 2**(s - 127), 0xFF NaN; or E4M3)."""
    if FMT == 0:
        bits = tl.where(s == 0, 0x0040, tl.where(s == 255, 0x7FC0, s << 7))
        return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return _scale_f32(s, FMT).to(tl.bfloat16)


@triton.jit
def _weight_words(w_e, rows, valid, t, K, R, FMT: tl.constexpr):
    """Packed FP4 weights [BN, W] of rows ``rows`` (of the expert's ``R``) for K step ``t`` as 32-bit words
    of eight weights (zeros past K: masked, never read), stored in panel order (csf_kernels.moe.fp4_words: each
    64-row block's K steps as [rows, W words] tiles). Words, not bytes, so that a pipelined copy through
    shared memory is read back with wide loads."""
    W: tl.constexpr = 16 if FMT == 0 else 8  # words per K step
    j = tl.arange(0, W)[None, :]
    m = valid[:, None] & (t * W + j < K // 8)
    row_words = (K // 32) * 4  # = K // 8 (K % 32 == 0, checked at bind), written so it is provably 16-aligned
    # offsets within the expert fit 32 bits; per row, loop-invariant: the row's start in a whole step, the
    # step stride, and what a narrower last step changes
    block = rows // _PANEL_ROWS
    r64 = rows % _PANEL_ROWS
    start = block * (_PANEL_ROWS * row_words) + r64 * W
    stride = tl.minimum(R - block * _PANEL_ROWS, _PANEL_ROWS) * W
    tail = row_words - row_words // W * W  # words a row in a last, narrower step (0: none)
    base = start + t * stride + tl.where(t * W + tail == row_words, r64 * (tail - W), 0)
    w32 = w_e.to(tl.pointer_type(tl.int32))
    return tl.load(w32 + base[:, None] + j, mask=m, other=0)


@triton.jit
def _weights(b, s, FMT: tl.constexpr, BN: tl.constexpr, ASM: tl.constexpr):
    """bf16 [BN, BK] weights from words ``b`` [BN, W] and scale bytes ``s`` [BN, 4].

    ``ASM``: the packed PTX conversion; otherwise float32 arithmetic (the same exact values; Triton's
    CPU interpreter cannot run PTX)."""
    W: tl.constexpr = 16 if FMT == 0 else 8
    WPS: tl.constexpr = W // 4  # words per scale block: 4 (32 weights, MXFP4) or 2 (16, NVFP4)
    if ASM:
        sw = tl.reshape(tl.broadcast_to(_scale_bf16(s, FMT)[:, :, None], [BN, 4, WPS]), [BN, W])
        bf16 = tl.bfloat16
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            E2M1_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [b, sw], [bf16] * 8, True, 1
        )
    else:
        sf = tl.reshape(tl.broadcast_to(_scale_f32(s, FMT)[:, :, None], [BN, 4, WPS]), [BN, W])
        o0 = (_e2m1_f32(_placed_code(b, 0)) * sf).to(tl.bfloat16)
        o1 = (_e2m1_f32(_placed_code(b, 1)) * sf).to(tl.bfloat16)
        o2 = (_e2m1_f32(_placed_code(b, 2)) * sf).to(tl.bfloat16)
        o3 = (_e2m1_f32(_placed_code(b, 3)) * sf).to(tl.bfloat16)
        o4 = (_e2m1_f32(_placed_code(b, 4)) * sf).to(tl.bfloat16)
        o5 = (_e2m1_f32(_placed_code(b, 5)) * sf).to(tl.bfloat16)
        o6 = (_e2m1_f32(_placed_code(b, 6)) * sf).to(tl.bfloat16)
        o7 = (_e2m1_f32(_placed_code(b, 7)) * sf).to(tl.bfloat16)
    # [BN, W, 2, 2, 2] with element (a, b, c) = weight 4a + 2b + c of its word: K in natural order
    x = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
    return tl.reshape(x, [BN, W * 8])


@triton.jit
def _tile_scales(
    SRC: tl.constexpr,
    scales_e,
    rows,
    valid,
    rb,
    slot,
    base,
    t,
    h,
    lo,
    hi,
    C,
    records,
    raw,
    tail,
    tail_raw,
    full_tiles,
    S,
    S_TAIL,
    TC,
    NEUTRAL: tl.constexpr,
):
    if SRC == 0:
        return _native_scales(scales_e, rows, valid, t, C, NEUTRAL)
    else:
        return _inline_scales(
            records, raw, tail, tail_raw, rb, slot, base, valid, t, h, lo, hi, full_tiles, C, S, S_TAIL, TC, NEUTRAL
        )


@triton.jit
def moe_gemm(
    x,
    w,
    scales,
    wide,
    base_ref,
    base_delta,
    records,
    raw,
    tail,
    tail_raw,
    gscale,
    bias,
    out,
    part,
    sorted_ids,
    block_expert,
    meta,
    pairs,
    x_row_div,
    n_out,
    K,
    C,
    row_group,
    blocks_per_group,
    full_tiles,
    S,
    S_TAIL,
    TC,
    steps_per_split,
    FMT: tl.constexpr,
    SRC: tl.constexpr,
    FC1: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_GSCALE: tl.constexpr,
    DB: tl.constexpr,
    ASM: tl.constexpr,
    PREFETCH: tl.constexpr,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    PDL: tl.constexpr,
):
    await_predecessor(PDL)
    BK: tl.constexpr = 128 if FMT == 0 else 64
    NEUTRAL: tl.constexpr = 127 if FMT == 0 else 0x38  # scale 1.0 where K or rows are masked
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_b >= tl.load(meta):
        return
    e = tl.load(block_expert + pid_b)
    route = tl.load(sorted_ids + pid_b * BM + tl.arange(0, BM))
    live_m = route < pairs
    a_row = tl.where(live_m, route // x_row_div, 0).to(tl.int64)
    R = 2 * n_out if FC1 else n_out
    n = pid_n * BN + tl.arange(0, BN)
    valid = n < n_out
    rows_a = tl.where(valid, n, 0)
    rows_b = rows_a + n_out
    w_e = w + e.to(tl.int64) * R * ((K // 32) * 16)
    scales_e = scales + e.to(tl.int64) * R * C
    if SRC == 1:
        _, slot_a, base_a = _row_setup(rows_a, valid, e, R, row_group, blocks_per_group, base_ref, base_delta, DB)
        rb_a = row_block_of(e, pid_n * BN, R, row_group, blocks_per_group)
        if FC1:
            _, slot_b, base_b = _row_setup(rows_b, valid, e, R, row_group, blocks_per_group, base_ref, base_delta, DB)
            rb_b = row_block_of(e, n_out + pid_n * BN, R, row_group, blocks_per_group)
    else:  # unused: the native source reads the plane
        rb_a, slot_a, base_a = 0, rows_a, rows_a
        rb_b, slot_b, base_b = 0, rows_b, rows_b
    acc_a = tl.zeros([BN, BM], dtype=tl.float32)
    acc_b = tl.zeros([BN, BM], dtype=tl.float32)
    kk = tl.arange(0, BK)
    steps = (K + BK - 1) // BK
    t0 = 0
    if SPLIT:
        t0 = tl.program_id(2) * steps_per_split
        steps = tl.minimum(steps, t0 + steps_per_split)
    if PREFETCH:  # the next step's weight words are in flight while this step converts and multiplies
        b_a = _weight_words(w_e, rows_a, valid, t0, K, R, FMT)
        if FC1:
            b_b = _weight_words(w_e, rows_b, valid, t0, K, R, FMT)
    # inline: a step's record header is loaded two steps ahead and its selector words one step ahead, so
    # neither waits on a load when the step's scales are decoded (native: unused placeholders)
    h_a, lo_a, hi_a, h_a_next = 0, rows_a, rows_a, 0
    h_b, lo_b, hi_b, h_b_next = 0, rows_b, rows_b, 0
    if SRC == 1:
        h_a = record_header(records, tail, rb_a, t0, steps, full_tiles, S, S_TAIL)
        lo_a, hi_a, h_a_next = _inline_ahead(records, tail, rb_a, slot_a, valid, t0, h_a, steps, full_tiles, S,
                                             S_TAIL, TC)  # fmt: skip
        if FC1:
            h_b = record_header(records, tail, rb_b, t0, steps, full_tiles, S, S_TAIL)
            lo_b, hi_b, h_b_next = _inline_ahead(records, tail, rb_b, slot_b, valid, t0, h_b, steps, full_tiles, S,
                                                 S_TAIL, TC)  # fmt: skip
    for t in range(t0, steps):
        if PREFETCH:
            nb_a = _weight_words(w_e, rows_a, valid & (t + 1 < steps), t + 1, K, R, FMT)
            if FC1:
                nb_b = _weight_words(w_e, rows_b, valid & (t + 1 < steps), t + 1, K, R, FMT)
        else:
            b_a = _weight_words(w_e, rows_a, valid, t, K, R, FMT)
            if FC1:
                b_b = _weight_words(w_e, rows_b, valid, t, K, R, FMT)
        k = t * BK + kk
        xt = tl.load(x + a_row[None, :] * K + k[:, None], mask=live_m[None, :] & (k[:, None] < K), other=0.0)
        s_a = _tile_scales(SRC, scales_e, rows_a, valid, rb_a, slot_a, base_a, t, h_a, lo_a, hi_a, C, records, raw,
                           tail, tail_raw, full_tiles, S, S_TAIL, TC, NEUTRAL)  # fmt: skip
        if FC1:
            s_b = _tile_scales(SRC, scales_e, rows_b, valid, rb_b, slot_b, base_b, t, h_b, lo_b, hi_b, C, records,
                               raw, tail, tail_raw, full_tiles, S, S_TAIL, TC, NEUTRAL)  # fmt: skip
        if SRC == 1:  # the next step's selectors (its header is here) and the header after it
            h_a = h_a_next
            lo_a, hi_a, h_a_next = _inline_ahead(records, tail, rb_a, slot_a, valid, t + 1, h_a, steps, full_tiles,
                                                 S, S_TAIL, TC)  # fmt: skip
            if FC1:
                h_b = h_b_next
                lo_b, hi_b, h_b_next = _inline_ahead(records, tail, rb_b, slot_b, valid, t + 1, h_b, steps,
                                                     full_tiles, S, S_TAIL, TC)  # fmt: skip
        acc_a = tl.dot(_weights(b_a, s_a, FMT, BN, ASM), xt, acc_a)
        if FC1:
            acc_b = tl.dot(_weights(b_b, s_b, FMT, BN, ASM), xt, acc_b)
        if PREFETCH:
            b_a = nb_a
            if FC1:
                b_b = nb_b
    if SPLIT:  # float32 partials, reduced in a fixed order by the finishing kernel (deterministic)
        p_row = (tl.program_id(2) * pairs + tl.where(live_m, route, 0)).to(tl.int64) * R
        pm = valid[:, None] & live_m[None, :]
        tl.store(part + p_row[None, :] + rows_a[:, None], acc_a, mask=pm)
        if FC1:
            tl.store(part + p_row[None, :] + rows_b[:, None], acc_b, mask=pm)
        return
    if HAS_GSCALE:
        g = tl.load(gscale + e)
        acc_a = acc_a * g
        acc_b = acc_b * g
    if HAS_BIAS:
        acc_a += tl.load(bias + e.to(tl.int64) * R + rows_a, mask=valid, other=0.0)[:, None]
        if FC1:
            acc_b += tl.load(bias + e.to(tl.int64) * R + rows_b, mask=valid, other=0.0)[:, None]
    if FC1:
        if ACT == 0:
            y = acc_a / (1.0 + tl.exp(-acc_a)) * acc_b
        else:
            gate = tl.minimum(acc_a, SWIGLU_LIMIT)
            up = tl.minimum(tl.maximum(acc_b, -SWIGLU_LIMIT), SWIGLU_LIMIT)
            y = gate / (1.0 + tl.exp(-SWIGLU_ALPHA * gate)) * (up + 1.0)
    else:
        y = acc_a
    o_row = tl.where(live_m, route, 0).to(tl.int64)
    tl.store(out + o_row[None, :] * n_out + n[:, None], y.to(tl.bfloat16), mask=valid[:, None] & live_m[None, :])
