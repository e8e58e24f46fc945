"""Gluon: the split-K decode GEMM of the fused MoE layer, weights dequantized in registers.

Same job, arguments and results as ``moe_gemm`` with its split-K decode tiles (``SPLIT``: float32 partials
``[splits, pairs, R]``, finished by ``moe_finish`` / ``moe_combine``): one program computes ``BN`` (64)
weight rows for one block of ``BM`` routes of one expert, over its K split (mma.sync: 8 or 16 routes; wgmma,
``WG``: 16, 32 or 64, below; the catalog: ``moe_heuristics.decode_config_for``). Partials need no gate/up pairing,
so FC1 runs as a GEMM over all its 2N rows (``n_out`` = R): twice the programs of half the registers.
What differs is how the tensor cores are fed. ``moe_gemm`` hands Triton a dequantized tile in the
order it was loaded, and Triton moves it into the MMA's operand layout through shared memory, behind CTA
barriers. Here every layout is explicit (Gluon), chosen so that nothing moves:

* ``mma.sync`` m16n8k16 with both operands in registers, each warp 16 weight rows: warps never wait on
  each other (no barrier, no shared memory);
* the K order inside a step is relabelled identically for both operands (a dot product does not care),
  so that each thread's operand fragments hold K positions that are contiguous in memory: thread ``t`` of
  a quad holds the step's K range ``[32t, 32t + 32)`` (NVFP4: ``[16t, 16t + 16)``), that is 16 (8) bytes
  of FP4 per row and one scale byte per row, and 64 (32) bytes of each route's activations;
* the relabelling is a permute + reshape of each thread's registers, which ``convert_layout(...,
  assert_trivial=True)`` proves moves no data (the build fails otherwise).

The FP4 words are prepared for this program (csf_kernels.moe.fp4_words: bits permuted for the conversion, and
each 64-row block's K steps stored as row-major tiles, so a program's step is one contiguous 4 KB run); scale
planes and inline records are read in their stored order.
Scale bytes come from the native plane (``SRC`` 0) or the inline tile records (``SRC`` 1, decoded as
``moe_gemm`` decodes them, written again with explicit layouts: Gluon cannot call Triton functions), and
the product path is shared, so outputs are bit-identical across sources.

``STAGES`` > 1 keeps the operands of that many K steps in flight without holding them in registers: each
step's weight words are copied into shared memory by ``cp.async`` (each thread copies the words it will
read back itself) together with the block's activations (copied once per program, read by every warp:
one CTA barrier per step), ``STAGES - 1`` steps ahead; ``AHEAD`` loads the native scale bytes one step
early (two registers). Loading the next step's weight words into registers instead gains nothing (it costs
registers); the staged form gains at 128 and more tokens (``docs/perf-notes.md``, "Operands are staged through
shared memory, 3 stages deep").

``WG`` runs the same A fragments (the relabelled weights, bit for bit the mma.sync operand) through
``wgmma`` m64nBMk16 with the block's activations as the shared-memory B operand: each step the program
stores the next step's activations, relabelled into the weights' K order (4-byte stores: the relabelling
moves pairs of K positions), into the other of two operand buffers, so one CTA barrier per step orders
them. ``XR`` (``moe_specs.GemmConfig.relabelled``): the activations are stored in that order already
(``csf_kernels.moe.relabel``: the layer relabels FC1's input, the FC1 finish writes FC2's so, rows padded to whole
K steps), so each stage's activations are copied by ``cp.async`` straight into the operand, with the weight
words: no register pass, no 4-byte stores, no second operand buffer. That form pays from 5 routes per expert
on (``moe_heuristics.decode_config_for``; ``docs/perf-notes.md``, "The tile follows the routes per expert"): the
activations do not sit in every warp's registers, so a block can hold all of an expert's routes and each
weight is converted once. ``BN`` 128 (two warpgroups on 8 warps sharing the operand buffers; native scales
only) is a sweep variant, not in the catalog: it measures no faster.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from csf_kernels.moe.fp4_words import PANEL_ROWS
from csf_kernels.moe.kernels.fc1_finish_gluon import FIN_STEPS, fc1_finish_to_shared
from csf_kernels.moe.kernels.gemm import E2M1_WORD_ASM, E2M1_WORD_ASM_ONE_MULTIPLY
from csf_kernels.moe.kernels.gemm import SIGNATURE as _GEMM_SIGNATURE
from csf_kernels.record.gluon import (
    HEADER_BYTES,
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
    selector_header_origin,
    selector_words,
)
from csf_kernels.runtime.pdl import gluon_await_predecessor

# the runtime arguments of moe_gemm, in its order (one launch builder serves both); fewer constants
SIGNATURE = {n: t for n, t in _GEMM_SIGNATURE.items() if t != "constexpr"} | {
    "num_experts": "i32",  # ROUTED: the range of valid route ids
    # FIN: FC1's float32 partials [fin_splits, pairs, 2K], its bias and global scales (K = FC2's K = FC1's N)
    "fin_part": "*fp32",
    "fin_bias": "*fp32",
    "fin_gscale": "*fp32",
    "fin_splits": "i32",
    "FMT": "constexpr",  # 0 MXFP4 (E8M0 per 32), 1 NVFP4 (E4M3 per 16)
    "SRC": "constexpr",  # 0 native plane, 1 inline records
    "DB": "constexpr",  # inline: bits per row-base delta
    "BM": "constexpr",  # routes per block: 8 or 16 (mma.sync: one or two n8 MMA tiles); 16, 32 or 64 (wgmma)
    "BN": "constexpr",  # weight rows per program, 16 per warp: 64 on 4 warps (wgmma, native scales: or 128 on 8)
    "STAGES": "constexpr",  # K steps of operands in flight through shared memory (1: into registers per step)
    "AHEAD": "constexpr",  # 1: a step's native scale bytes loaded one step before it
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
    "WG": "constexpr",  # 0: mma.sync, activations in registers; 1: wgmma, activations in shared memory
    "XR": "constexpr",  # wgmma: 1, the activations are stored relabelled (copied by cp.async into the operand)
    # 1: a few-token call without an alignment (moe_heuristics.ROUTED_TOKENS), block b is route b (``block_expert``: the
    # route ids, int64 with IDS64): programs of routes outside [0, num_experts) exit
    "ROUTED": "constexpr",
    "IDS64": "constexpr",
    # a routed FC2 that finishes FC1 itself (moe_fc1_finish_gluon: 1 SiLU-and-mul, 2 clamped SwiGLU; 0: reads
    # the finished activations ``x``): no kernel between the GEMMs, and its first weight steps are copied before
    # it waits for FC1 (weights and route ids are the call's inputs, not FC1's outputs)
    "FIN": "constexpr",
    "FIN_BIAS": "constexpr",
    "FIN_GSCALE": "constexpr",
    # 1: a routed FC1 whose predecessor is a chained expansion waiting last (csf_kernels.expand.launch): its route ids,
    # weights and activations were final before that expansion started, so it copies its first weight steps
    # before it waits, as FIN does; only the scales (the expansion's output) wait
    "EARLY": "constexpr",
}
MULTIPLE_OF = {"K": 32, "n_out": 16, "S": 16, "S_TAIL": 16}
EXC_UNROLL = gl.constexpr(4)  # inline exception entries loaded per round
_PANEL_ROWS = gl.constexpr(PANEL_ROWS)  # rows of a block of K-step tiles (fp4_words)


# ------------------------------------------------------------------------------------------- layouts
# Q: 32-bit weight words per thread, row and K step (MXFP4: 4 = 32 weights = one scale block; NVFP4: 2).
# Weight words are [64 rows, 4 quad lanes t, Q]; rows 16w + g (+ 8 in a second register), as the MMA's
# A fragment wants them; activations [16 routes, 32 Q] with the thread's 8Q contiguous K values in registers.


@gluon.constexpr_function
def _mma_layout(BM, WG, BN):
    # wgmma's accumulator and A fragments per warp are mma.sync's: warp w holds rows 16w .. 16w + 15 (128
    # rows: two warpgroups of 64)
    if WG:
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BN // 16, 1], instr_shape=[16, BM, 16])
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def _warp_bits(BN):
    # log2 of the warps (16 rows each)
    return (BN // 16).bit_length() - 1


@gluon.constexpr_function
def _word_layout(Q, BN):
    q_bits = [[0, 0, 1 << i] for i in range(Q.bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=[*q_bits, [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16 << i, 0, 0] for i in range(_warp_bits(BN))],
        block_bases=[],
        shape=[BN, 4, Q],
    )


@gluon.constexpr_function
def _word_stages_layout():
    # [64 rows, 4 t, Q] per stage, unswizzled: a warp's 16-byte accesses cover 512 contiguous bytes (no conflicts)
    return gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])


@gluon.constexpr_function
def _fin_stages_layout():
    # FIN's [FIN_STEPS, BM, BK] activations: each step swizzled as _act_stages_layout's [BM, BK] stages
    return gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[2, 1, 0])


@gluon.constexpr_function
def _act_stages_layout():
    # [BM routes, BK] bf16 per stage; 16-byte chunks XOR-swizzled by route, so the eight routes a warp's
    # lanes read at once fall in different banks
    return gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])


@gluon.constexpr_function
def _act_copy_layout(BM, BK, BN):
    # [BM, BK] bf16: 8 contiguous values (16 bytes) per thread, a warp's lanes along K then routes (NVFP4's
    # 8-route steps are half as many copies as threads: two threads copy the same bytes, harmlessly)
    return gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [BN // 16, 1], [1, 0])


@gluon.constexpr_function
def _act_operand_layout(BM, BK):
    # wgmma: the relabelled [BM, BK] activations, K contiguous (wgmma's B, read through a transposed view)
    return gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)


@gluon.constexpr_function
def _act_layout(Q, BM, BN):
    k_bits = [[0, 1 << i] for i in range((8 * Q).bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=k_bits + [[8 << i, 0] for i in range((BM // 8).bit_length() - 1)],  # routes past the first 8
        lane_bases=[[0, 8 * Q], [0, 16 * Q], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[0, 0]] * _warp_bits(BN),  # every warp multiplies the same routes
        block_bases=[],
        shape=[BM, 32 * Q],
    )


@gluon.jit
def _scale_bf16(s, FMT: gl.constexpr):
    """Scale bytes (int32) -> bf16, exactly (E8M0 2**(s - 127), 0xFF NaN; or E4M3)."""
    if FMT == 0:
        bits = gl.where(s == 0, 0x0040, gl.where(s == 255, 0x7FC0, s << 7))
        return bits.to(gl.int16).to(gl.bfloat16, bitcast=True)
    else:
        return s.to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32).to(gl.bfloat16)


@gluon.jit
def _placed_factor(s):
    """bf16 2**(s - 1) from E8M0 bytes ``s`` (int32): the scale times the placement's 2**126 (see
    moe_gemm's conversion), exact for s <= 128 (255: NaN); larger bytes need the two-multiply form."""
    bits = gl.where(s == 255, 0x7FC0, (s + 126) << 7)
    return bits.to(gl.int16).to(gl.bfloat16, bitcast=True)


@gluon.jit
def _operand(words, scale, FMT: gl.constexpr, MULS: gl.constexpr, MMA: gl.constexpr):
    """bf16 A operand [BN, 32Q] from weight words [BN, 4, Q] and their scale bytes [BN, 4] (one per thread
    and row), in the relabelled K order (see the module docstring). ``MULS``: multiplies per weight pair,
    1 (E8M0 planes without bytes 129..254) or 2."""
    Q: gl.constexpr = 4 if FMT == 0 else 2
    if MULS == 1:
        sw = gl.broadcast(gl.expand_dims(_placed_factor(scale), 2), words)[0]
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            E2M1_WORD_ASM_ONE_MULTIPLY, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, sw], [gl.bfloat16] * 8, True, 1
        )
    else:
        sw = gl.broadcast(gl.expand_dims(_scale_bf16(scale, FMT), 2), words)[0]
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            E2M1_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, sw], [gl.bfloat16] * 8, True, 1
        )
    # [64, t, q, i2, i1, i0] with weight i = 4 i2 + 2 i1 + i0 of word (t, q) (join adds the minor dimension:
    # the innermost joins pair weights 4 apart) -> logical K (q, i2, i1, t, i0)
    v = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
    v = gl.reshape(gl.permute(v, [0, 2, 3, 4, 1, 5]), [words.shape[0], 32 * Q])
    return gl.convert_layout(v, gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2),
                             assert_trivial=True)  # fmt: skip


@gluon.jit
def _logical_k(xt, FMT: gl.constexpr, BM: gl.constexpr):
    """wgmma: activations [BM routes, 32Q] in actual K order -> the same in the relabelled K order of the
    weights' A fragments (see ``_operand``), for the shared-memory B operand."""
    Q: gl.constexpr = 4 if FMT == 0 else 2
    return gl.reshape(gl.permute(gl.reshape(xt, [BM, 4, Q, 2, 2, 2]), [0, 2, 3, 4, 1, 5]), [BM, 32 * Q])


@gluon.jit
def _activations(xt, FMT: gl.constexpr, BM: gl.constexpr):
    """bf16 B operand [32Q, BM] from activations [BM routes, 32Q] (actual K order), relabelled as the weights."""
    Q: gl.constexpr = 4 if FMT == 0 else 2
    v = gl.permute(gl.reshape(xt, [BM, 4, Q, 2, 2, 2]), [2, 3, 4, 1, 5, 0])
    v = gl.reshape(v, [32 * Q, BM])
    return gl.convert_layout(v, gl.DotOperandLayout(operand_index=1, parent=_mma_layout(BM, 0, 64), k_width=2),
                             assert_trivial=True)  # fmt: skip


# ------------------------------------------------------------------------------------- scale sources


@gluon.jit
def _row_setup(rows, valid, e, R, row_group, blocks_per_group, base_ref, base_delta, DB: gl.constexpr):
    """Per weight row: its inline row block, slot, and row base (reference + delta)."""
    within = rows % row_group
    rb = (e * (R // row_group) + rows // row_group) * blocks_per_group + within // 128
    rb = gl.where(valid, rb, 0)
    slot = row_slot(within % 128)
    ref = gl.load(base_ref + rb, mask=valid, other=0).to(gl.int32)
    if DB == 4:
        d = gl.load(base_delta + rb * 64 + slot // 2, mask=valid, other=0).to(gl.int32)
        d = (d >> ((slot & 1) * 4)) & 15
    else:
        d = gl.load(base_delta + rb * 128 + slot, mask=valid, other=0).to(gl.int32)
    return slot, ref + d


@gluon.constexpr_function
def _fast_mode(FMT):
    # the selector mode the program decodes from loads made a step ahead: the one the encoder picks for nearly
    # every tile of the format (csf_codec.inline.CANDIDATE_WINDOWS: MXFP4 1-bit, NVFP4 4-bit selectors)
    return 0 if FMT == 0 else 2


@gluon.jit
def _exception_scan(val, pos, rec, selector_bytes, cap, first, count):
    """``val`` with the record's exceptions ``first`` .. ``count - 1`` applied where their position is ``pos``:
    ascending u16 positions after the selectors, then their value bytes."""
    positions = (rec + selector_bytes).to(gl.pointer_type(gl.int16))  # an even offset of an aligned record
    values = rec + selector_bytes + 2 * cap
    for i0 in range(first, count, EXC_UNROLL):
        for u in gl.static_range(EXC_UNROLL):
            ok = i0 + u < count
            p = gl.load(positions + i0 + u, mask=ok, other=0).to(gl.int32) & 0xFFFF
            v = gl.load(values + i0 + u, mask=ok, other=0).to(gl.int32)
            val = gl.where((pos == p) & ok, v, val)
    return val


@gluon.jit
def _fast_steps(steps, full_tiles, S, FMT: gl.constexpr):
    """The program's steps (a prefix) that :func:`_inline_ahead` loads for: its full tiles, where a record in the
    usual mode has room for the EXC_UNROLL exceptions loaded ahead (always, at the encoder's record sizes), so
    those loads stay inside the record whatever its header says; none where it has not."""
    SB: gl.constexpr = 64 << _fast_mode(FMT)  # selector bytes of a full tile
    return gl.where(exception_capacity(S, SB) >= EXC_UNROLL, gl.minimum(steps, full_tiles), 0)


@gluon.jit
def _inline_ahead(rec0, tail_h, slot, valid, t, fast_steps, steps, full_tiles, S, FMT: gl.constexpr):
    """Loads for step ``t`` ahead of its decode, where it is one of the ``fast_steps`` (:func:`_fast_steps`):
    each row's selector word and the record's first EXC_UNROLL exceptions (positions as two u16 pairs, values
    as four bytes of one word), read as if the tile were in the format's usual selector mode (:func:`_fast_mode`;
    its header, which says whether it is and how many exceptions count, is not waited for: the decode checks
    it); and step ``t + 1``'s header (``tail_h``: the tail tile's). ``rec0``: the row block's first record."""
    MODE: gl.constexpr = _fast_mode(FMT)
    SB: gl.constexpr = 64 << MODE
    ahead = t < fast_steps
    rec = rec0 + t * S
    # a row's four fields are 4w contiguous bits at 4w * slot: within one 32-bit word (w = 1, 2, 4)
    sel = gl.load(rec.to(gl.pointer_type(gl.int32)) + ((slot << (2 + MODE)) >> 5), mask=valid & ahead, other=0)
    positions = (rec + SB).to(gl.pointer_type(gl.int32))  # u16 pairs, 16-byte aligned
    p01 = gl.load(positions, mask=ahead, other=0)
    p23 = gl.load(positions + 1, mask=ahead, other=0)
    values = (rec + SB + 2 * exception_capacity(S, SB)).to(gl.pointer_type(gl.int16))  # an even offset
    v01 = gl.load(values, mask=ahead, other=0).to(gl.int32) & 0xFFFF
    v23 = gl.load(values + 1, mask=ahead, other=0).to(gl.int32) & 0xFFFF
    h_ptr = gl.where(t + 1 < full_tiles, rec + (S + S - HEADER_BYTES), tail_h).to(gl.pointer_type(gl.int32))
    return sel, p01, p23, v01 | (v23 << 16), gl.load(h_ptr, mask=t + 1 < steps, other=0)


@gluon.jit
def _exception(val, pos, count, i: gl.constexpr, p, v):
    """``val`` with entry ``i`` (position ``p``, value byte ``v``) applied where it is the record's."""
    return gl.where((pos == p) & (count > i), v & 0xFF, val)


@gluon.jit
def _inline_fast_scales(rec0, base, valid, pos, t, h, sel, p01, p23, v4, S, FMT: gl.constexpr,
                        NEUTRAL: gl.constexpr):  # fmt: skip
    """Scale bytes [64, 4] of tile ``t`` (header ``h``; a full tile in the format's usual mode) from the loads
    :func:`_inline_ahead` made: ``pos`` = 4 slot + column, each row's selector word ``sel``, the first four
    exceptions ``p01``, ``p23``, ``v4``; entries past those (rare) are loaded here."""
    MODE: gl.constexpr = _fast_mode(FMT)
    SB: gl.constexpr = 64 << MODE
    count = header_count(h)
    field = (gl.expand_dims(sel, 1) >> ((pos << MODE) & 31)) & ((1 << (1 << MODE)) - 1)
    val = gl.expand_dims(base, 1) + selector_header_origin(h) + field
    val = _exception(val, pos, count, 0, p01 & 0xFFFF, v4)
    val = _exception(val, pos, count, 1, p01 >> 16, v4 >> 8)
    val = _exception(val, pos, count, 2, p23 & 0xFFFF, v4 >> 16)
    val = _exception(val, pos, count, 3, p23 >> 16, v4 >> 24)
    if count > EXC_UNROLL:
        val = _exception_scan(val, pos, rec0 + t * S, SB, exception_capacity(S, SB), EXC_UNROLL, count)
    return gl.where(gl.expand_dims(valid, 1), val, NEUTRAL)


@gluon.jit
def _inline_scales(
    records, raw, tail, tail_raw, rb, slot, base, valid, c, t, h, lo, hi, full_tiles, C, S, S_TAIL, TC,
    NEUTRAL: gl.constexpr,
):  # fmt: skip
    """Scale bytes [64, 4] (columns ``c`` [1, 4]) of column tile ``t`` for rows (slot, base) of row block
    ``rb``, decoded from the tile's record: header ``h`` and the rows' selector words ``lo``, ``hi``."""
    is_tail = t >= full_tiles
    tcx = gl.where(is_tail, TC, 4)
    rec, sbytes = record_at(records, tail, rb, t, full_tiles, S, S_TAIL)
    mode = header_mode(h)
    is_raw = mode == MODE_RAW
    w = gl.where(is_raw, 1, 1 << mode)
    origin = header_origin(h)
    bit = slot * tcx * w  # the slot's tcx fields: tcx * w contiguous bits from here
    x = ((hi.to(gl.uint32).to(gl.int64) << 32) | lo.to(gl.uint32).to(gl.int64)) >> (bit & 31).to(gl.int64)
    field = ((gl.expand_dims(x, 1) >> (c * w).to(gl.int64)) & ((1 << w) - 1)).to(gl.int32)
    val = gl.expand_dims(base, 1) + origin + field
    live = gl.expand_dims(valid, 1) & (c < tcx) & (t * 4 + c < C)
    pos_here = gl.expand_dims(slot, 1) * tcx + c
    if is_raw:
        raw_base = gl.where(is_tail, tail_raw, raw)
        rv = gl.load(raw_base + header_raw_index(h) * (128 * tcx) + pos_here, mask=live, other=0)
        val = rv.to(gl.int32)
    else:  # exceptions: ascending (position, value) pairs after the selectors
        sb = 16 * tcx * w
        val = _exception_scan(val, pos_here, rec, sb, exception_capacity(sbytes, sb), 0, header_count(h))
    return gl.where(live, val, NEUTRAL)


@gluon.jit
def _native_scales(scales_e, rows, valid, c, t, C, NEUTRAL: gl.constexpr):
    col = t * 4 + c
    live = gl.expand_dims(valid, 1) & (col < C)
    return gl.load(scales_e + gl.expand_dims(rows, 1) * C + col, mask=live, other=NEUTRAL).to(gl.int32)


@gluon.jit
def _block_expert(block_expert, meta, pid_b, num_experts, ROUTED: gl.constexpr, IDS64: gl.constexpr):
    """Block ``pid_b``'s expert, or -1 for a block past the alignment's count (ROUTED: a route id outside [0, E),
    range-checked before any narrowing)."""
    if ROUTED:
        if IDS64:
            e64 = gl.load(block_expert.to(gl.pointer_type(gl.int64)) + pid_b)
            return gl.where((e64 >= 0) & (e64 < num_experts), e64, -1).to(gl.int32)
        e = gl.load(block_expert + pid_b)
        return gl.where((e >= 0) & (e < num_experts), e, -1)
    return gl.where(pid_b < gl.load(meta), gl.load(block_expert + pid_b), -1)


@gluon.jit
def _block_routes(sorted_ids, pid_b, pairs, BM: gl.constexpr, layout: gl.constexpr, ROUTED: gl.constexpr):
    """The block's BM route slots (the sentinel ``pairs`` where empty): ROUTED, route ``pid_b`` alone."""
    i = gl.arange(0, BM, layout=layout)
    if ROUTED:
        return gl.where(i == 0, pid_b, pairs)
    return gl.load(sorted_ids + pid_b * BM + i)


@gluon.jit
def _wide_rows(wide, e, pid_n, R, BN: gl.constexpr):
    """Whether any 64-row tile of the program's rows holds E8M0 bytes above 128 (csf_kernels.moe.launch.wide_row_tiles:
    flags per 64-row tile)."""
    tiles = gl.cdiv(R, 64)
    flag = gl.load(wide + e * tiles + pid_n * (BN // 64))
    for j in gl.static_range(1, BN // 64):
        tile = pid_n * (BN // 64) + j
        flag = flag | gl.load(wide + e * tiles + tile, mask=tile < tiles, other=0)
    return flag


@gluon.jit
def _word_pointers(w_e, rows, quad, q, valid, t, K, R, Q: gl.constexpr):
    """Pointers [64, 4, Q] to the weight words of rows ``rows`` (of the expert's ``R``) for K step ``t``,
    stored in panel order (csf_kernels.moe.fp4_words: each 64-row block's K steps as [rows, 4Q words] tiles, the
    last one narrower where the rows end mid-step), and their mask (false past K). The mask is a function of
    the quad lane alone (K % 32 == 0), so a thread's Q words stay one 16-byte access (a mask on the word
    index would split them: Triton cannot see K // 8 % 4 == 0)."""
    m = gl.expand_dims(gl.expand_dims(valid, 1), 2) & ((t * 4 + quad) * (8 * Q) < K)
    row_words = (K // 32) * 4  # = K // 8, written so it is provably 16-byte aligned (K % 32 == 0 at bind)
    # offsets within the expert fit 32 bits; per row, loop-invariant: the row's start in a whole step, the
    # step stride, and what a narrower last step changes
    block = rows // _PANEL_ROWS
    r64 = rows % _PANEL_ROWS
    start = block * (_PANEL_ROWS * row_words) + r64 * (4 * Q)
    stride = gl.minimum(R - block * _PANEL_ROWS, _PANEL_ROWS) * (4 * Q)
    tail = row_words - row_words // (4 * Q) * (4 * Q)  # words a row in a last, narrower step (0: none)
    base = start + t * stride + gl.where(t * (4 * Q) + tail == row_words, r64 * (tail - 4 * Q), 0)
    off = gl.expand_dims(gl.expand_dims(base, 1), 2) + quad * Q + q
    return w_e.to(gl.pointer_type(gl.int32)) + off, m


@gluon.jit
def _weight_words(w_e, rows, quad, q, valid, t, K, R, Q: gl.constexpr):
    """Weight words [64, 4, Q] of rows ``rows`` for K step ``t`` (zeros past K or past the last step)."""
    ptr, m = _word_pointers(w_e, rows, quad, q, valid, t, K, R, Q)
    return gl.load(ptr, mask=m, other=0)


@gluon.jit
def _step_activations(x, a_row, live_x, kx, t, K, BK: gl.constexpr):
    """Pointers [BM, BK] to the routes' activations of K step ``t`` and their mask (false past K, for
    padding routes)."""
    k = t * BK + kx
    return x + gl.expand_dims(a_row, 1) * K + gl.expand_dims(k, 0), gl.expand_dims(live_x, 1) & gl.expand_dims(k < K, 0)


@gluon.jit
def _issue_step(
    w_stage, x_s, i, w_e, rows, quad, q, valid, x, a_row_c, live_c, kc, t, steps, K, R, Q: gl.constexpr,
    WG: gl.constexpr, XR: gl.constexpr, FIN: gl.constexpr,
):  # fmt: skip
    """Start step ``t``'s copies as one cp.async group (none past the last step): the weight words, each
    thread its own (it reads them back itself), and (mma.sync) the activations, shared by the program's
    warps (wgmma: those go through registers into the relabelled operand, ``_k_steps``)."""
    ptr, m = _word_pointers(w_e, rows, quad, q, valid, t, K, R, Q)
    async_copy.async_copy_global_to_shared(w_stage, ptr, mask=m & (t < steps))
    if WG == 0 and FIN == 0:  # (FIN: the activations are in shared memory already)
        xp, xm = _step_activations(x, a_row_c, live_c, kc, t, K, 32 * Q)
        async_copy.async_copy_global_to_shared(x_s.index(i), xp, mask=xm & (t < steps))
    elif XR:  # the relabelled activations (rows of whole K steps) straight into the wgmma operand stage
        xp, xm = _step_activations(x, a_row_c, live_c, kc, t, gl.cdiv(K, 32 * Q) * (32 * Q), 32 * Q)
        async_copy.async_copy_global_to_shared(x_s.index(i), xp, mask=xm & (t < steps))
    async_copy.commit_group()


@gluon.jit
def _k_steps(
    acc, t0, steps, w_e, rows, quad, q, valid, c, x, K, R, C, scales_e, s_next, w_s, x_s, a_row_c, live_c, kc, a_row,
    live_x, kx, records, raw, tail, tail_raw, rb, slot, base, pos, rec0, tail_h, fast_steps, full_tiles, S, S_TAIL, TC,
    h, sel, p01, p23, v4, h_next, xb_s, x_next, b_next, FMT: gl.constexpr, SRC: gl.constexpr, BM: gl.constexpr,
    STAGES: gl.constexpr, AHEAD: gl.constexpr, MULS: gl.constexpr, WG: gl.constexpr, XR: gl.constexpr,
    FIN: gl.constexpr,
):  # fmt: skip
    """The program's K steps t0 .. steps - 1 into ``acc`` (the operands' first stages already issued when
    ``STAGES`` > 1; ``s_next``: step t0's scale bytes when ``AHEAD``), converting with ``MULS`` multiplies
    per weight pair. ``FIN``: the route's activations are ``x_s`` [FIN_STEPS, BM, BK], a step a stage. wgmma
    (``WG``): step t0's activations are in ``xb_s`` [0], step t0 + 1's in registers (``x_next``); each step
    stores the next one's into the other buffer (read by the next step's wgmma, after the barrier at its start)
    and loads the one after; unstaged, step t0's weight words are in ``b_next``."""
    Q: gl.constexpr = 4 if FMT == 0 else 2
    BK: gl.constexpr = 32 * Q
    NEUTRAL: gl.constexpr = 127 if FMT == 0 else 0x38
    BN: gl.constexpr = rows.shape[0]
    MMA: gl.constexpr = _mma_layout(BM, WG, BN)
    WL: gl.constexpr = _word_layout(Q, BN)
    XL: gl.constexpr = _act_layout(Q, BM, BN)
    for t in range(t0, steps):
        if STAGES > 1:
            async_copy.wait_group(STAGES - 2)  # this thread's copies of step t
            if XR:
                fence_async_shared()  # the copied operand before wgmma reads it
            gl.thread_barrier()  # everyone's; and everyone is done reading the stage refilled next
            i = (t - t0 + STAGES - 1) % STAGES
            _issue_step(w_s.index(i), x_s, i, w_e, rows, quad, q, valid, x, a_row_c, live_c, kc,
                        t + STAGES - 1, steps, K, R, Q, WG, XR, FIN)  # fmt: skip
            b = w_s.index((t - t0) % STAGES).load(WL)
            if FIN:  # the route's activations of the whole range (FC1's finish, in shared memory since the start)
                xt = x_s.index(t - t0).load(XL)
            elif WG == 0:
                xt = x_s.index((t - t0) % STAGES).load(XL)
        elif WG:  # weight words straight into registers, one step ahead
            gl.thread_barrier()  # everyone's operand stores of this step, and reads of the buffer refilled now
            b = b_next
            b_next = _weight_words(w_e, rows, quad, q, valid, t + 1, K, R, Q)
        else:
            b = _weight_words(w_e, rows, quad, q, valid, t, K, R, Q)
            xp, xm = _step_activations(x, a_row, live_x, kx, t, K, BK)
            xt = gl.load(xp, mask=xm, other=0.0)
        if WG and not XR:
            xb_s.index((t - t0 + 1) % 2).store(_logical_k(x_next, FMT, BM))
            fence_async_shared()  # before the next step's wgmma reads them (after its barrier)
            xp, xm = _step_activations(x, a_row_c, live_c, kc, t + 2, K, BK)
            x_next = gl.load(xp, mask=xm, other=0.0)
        if AHEAD == 1:
            s = s_next
            s_next = _native_scales(scales_e, rows, valid, c, t + 1, C, NEUTRAL)
        elif SRC == 0:
            s = _native_scales(scales_e, rows, valid, c, t, C, NEUTRAL)
        elif (t < fast_steps) & (header_mode(h) == _fast_mode(FMT)):  # decoded from the loads made a step ahead
            s = _inline_fast_scales(rec0, base, valid, pos, t, h, sel, p01, p23, v4, S, FMT, NEUTRAL)
        else:  # the tail tile, a raw one or another mode: loaded in its own step
            lo, hi = selector_words(records, tail, rb, slot, valid, t, h, full_tiles, S, S_TAIL, TC)
            s = _inline_scales(records, raw, tail, tail_raw, rb, slot, base, valid, c, t, h, lo, hi,
                               full_tiles, C, S, S_TAIL, TC, NEUTRAL)  # fmt: skip
        if SRC == 1:  # the next step's loads (its header is here) and the header after it
            h = h_next
            sel, p01, p23, v4, h_next = _inline_ahead(rec0, tail_h, slot, valid, t + 1, fast_steps, steps,
                                                      full_tiles, S, FMT)  # fmt: skip
        if XR:
            acc = warpgroup_mma(_operand(b, s, FMT, MULS, MMA), x_s.index((t - t0) % STAGES).permute([1, 0]), acc)
        elif WG:
            acc = warpgroup_mma(_operand(b, s, FMT, MULS, MMA), xb_s.index((t - t0) % 2).permute([1, 0]), acc)
        else:
            acc = mma_v2(_operand(b, s, FMT, MULS, MMA), _activations(xt, FMT, BM), acc)
    return acc


@gluon.jit
def moe_gemm_decode(
    x, w, scales, wide, base_ref, base_delta, records, raw, tail, tail_raw, gscale, bias, out, part, sorted_ids,
    block_expert, meta, pairs, x_row_div, n_out, K, C, row_group, blocks_per_group, full_tiles, S, S_TAIL, TC,
    steps_per_split, num_experts, fin_part, fin_bias, fin_gscale, fin_splits,
    FMT: gl.constexpr, SRC: gl.constexpr, DB: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, STAGES: gl.constexpr, AHEAD: gl.constexpr, PDL: gl.constexpr, WG: gl.constexpr,
    XR: gl.constexpr, ROUTED: gl.constexpr, IDS64: gl.constexpr, FIN: gl.constexpr, FIN_BIAS: gl.constexpr,
    FIN_GSCALE: gl.constexpr, EARLY: gl.constexpr,
):  # fmt: skip
    if FIN == 0 and EARLY == 0:  # (FIN, EARLY: after their first weight steps' copies, below)
        gluon_await_predecessor(PDL)
    gl.static_assert(FIN == 0 or (ROUTED == 1 and WG == 0 and STAGES > 1 and BM == 8),
                     "FC1's finish is fused into routed, staged mma.sync programs")  # fmt: skip
    gl.static_assert(EARLY == 0 or (ROUTED == 1 and WG == 0 and STAGES > 1 and SRC == 0 and FIN == 0),
                     "early copies are for routed, staged mma.sync programs reading a native plane")  # fmt: skip
    gl.static_assert(AHEAD == 0 or (AHEAD == 1 and SRC == 0), "AHEAD is for native scales")
    gl.static_assert(XR == 0 or (WG == 1 and STAGES > 1), "relabelled activations feed staged wgmma programs")
    gl.static_assert(BN == 64 or (BN == 128 and WG == 1 and SRC == 0),
                     "64 rows on 4 warps; 128 on 8 (two wgmma warpgroups, native scales: a program's inline "
                     "records must lie in one 128-row block)")  # fmt: skip
    gl.static_assert((WG == 0 and (BM == 8 or BM == 16)) or (WG == 1 and (BM == 16 or BM == 32 or BM == 64)),
                     "mma.sync blocks hold 8 or 16 routes, wgmma blocks 16, 32 or 64")  # fmt: skip
    Q: gl.constexpr = 4 if FMT == 0 else 2
    BK: gl.constexpr = 32 * Q
    NEUTRAL: gl.constexpr = 127 if FMT == 0 else 0x38  # scale 1.0 where K or rows are masked
    MMA: gl.constexpr = _mma_layout(BM, WG, BN)
    WL: gl.constexpr = _word_layout(Q, BN)
    SL: gl.constexpr = gl.SliceLayout(2, WL)  # [BN, 4]: scale bytes, one per thread and row
    XL: gl.constexpr = _act_layout(Q, BM, BN)
    pid_b = gl.program_id(0)
    pid_n = gl.program_id(1)
    e = _block_expert(block_expert, meta, pid_b, num_experts, ROUTED, IDS64)
    if e < 0:
        return
    R = n_out  # every row of the operand (FC1: gate and up), programs of 64 rows
    w_e = w + e.to(gl.int64) * R * ((K // 32) * 16)
    scales_e = scales + e.to(gl.int64) * R * C

    # rows of this program (weights, scales)
    n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, SL))
    valid = n < n_out
    rows = gl.where(valid, n, 0)
    c = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, SL)), 0)
    quad = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(0, WL))), 1), 0)
    q = gl.expand_dims(gl.expand_dims(gl.arange(0, Q, layout=gl.SliceLayout(0, gl.SliceLayout(0, WL))), 0), 0)
    # routes of the block (activations)
    route_x = _block_routes(sorted_ids, pid_b, pairs, BM, gl.SliceLayout(1, XL), ROUTED)
    live_x = route_x < pairs
    a_row = gl.where(live_x, route_x // x_row_div, 0).to(gl.int64)
    kx = gl.arange(0, BK, layout=gl.SliceLayout(0, XL))

    rb, slot, base, pos, rec0, tail_h = 0, 0, 0, 0, 0, 0  # placeholders where unused
    if SRC == 1:
        slot, base = _row_setup(rows, valid, e, R, row_group, blocks_per_group, base_ref, base_delta, DB)
        rb = row_block_of(e, pid_n * BN, R, row_group, blocks_per_group)
        pos = gl.expand_dims(slot, 1) * 4 + c  # a full tile's exception positions
        rec0 = records + rb * full_tiles * S  # the row block's first full tile's record
        tail_h = tail + rb * S_TAIL + S_TAIL - HEADER_BYTES  # the tail tile's header

    acc = gl.zeros([BN, BM], gl.float32, layout=MMA)
    steps = (K + BK - 1) // BK
    t0 = gl.program_id(2) * steps_per_split
    steps = gl.minimum(steps, t0 + steps_per_split)
    # inline: a step's record header is loaded two steps ahead, its selector words and first exceptions one step
    # ahead without waiting for its header (so the first step's loads are one round trip deep, as native's), and
    # a full tile's decode waits on no load (native: unused placeholders)
    h, sel, p01, p23, v4, h_next, fast_steps = 0, rows, 0, 0, 0, 0, 0
    if SRC == 1:
        fast_steps = _fast_steps(steps, full_tiles, S, FMT)
        h = record_header(records, tail, rb, t0, steps, full_tiles, S, S_TAIL)
        sel, p01, p23, v4, h_next = _inline_ahead(rec0, tail_h, slot, valid, t0, fast_steps, steps, full_tiles, S, FMT)
    w_s, x_s, xb_s, x_next, b_next, a_row_c, live_c, kc = 0, 0, 0, 0, 0, 0, 0, 0  # placeholders where unused
    if STAGES > 1 or WG:  # the block's activations copied by the program, 16 bytes per thread and copy
        XC: gl.constexpr = _act_copy_layout(BM, BK, BN)  # one 16-byte copy per thread and 8 routes
        rc = _block_routes(sorted_ids, pid_b, pairs, BM, gl.SliceLayout(1, XC), ROUTED)
        live_c = rc < pairs
        a_row_c = gl.where(live_c, rc // x_row_div, 0).to(gl.int64)
        kc = gl.arange(0, BK, layout=gl.SliceLayout(0, XC))
    if STAGES > 1:  # each step's operands copied STAGES - 1 steps ahead into shared memory (cp.async)
        w_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 4, Q], _word_stages_layout())
        if FIN:  # the route's activations of the program's K range, a step a stage, copied to every route row
            x_s = gl.allocate_shared_memory(gl.bfloat16, [FIN_STEPS, BM, BK], _fin_stages_layout())
        elif WG == 0:
            x_s = gl.allocate_shared_memory(x.dtype.element_ty, [STAGES, BM, BK], _act_stages_layout())
        if XR:
            x_s = gl.allocate_shared_memory(x.dtype.element_ty, [STAGES, BM, BK], _act_operand_layout(BM, BK))
        for j in gl.static_range(STAGES - 1):
            _issue_step(w_s.index(j), x_s, j, w_e, rows, quad, q, valid, x, a_row_c, live_c, kc, t0 + j,
                        steps, K, R, Q, WG, XR, FIN)  # fmt: skip
        if FIN or EARLY:  # FC1's outputs (FIN), the expanded scales (EARLY) from here on
            gluon_await_predecessor(PDL)
        if FIN:
            fc1_finish_to_shared(x_s, fin_part, fin_bias, fin_gscale, fin_splits, pid_b, pairs, e, t0, steps, K,
                                 FIN, FIN_BIAS, FIN_GSCALE, BM, BK, BN // 16)  # fmt: skip
            gl.thread_barrier()
            # read a step at a time as the unfused program reads its [BM, BK] stages (the same bytes: BM = 8 rows
            # swizzle alike as one stage or as a stage's rows in the whole buffer)
            x_s = x_s._reinterpret(gl.bfloat16, [FIN_STEPS, BM, BK], _act_stages_layout())
    elif WG:
        b_next = _weight_words(w_e, rows, quad, q, valid, t0, K, R, Q)
    if WG and not XR:  # step t0's activations into the first operand buffer, step t0 + 1's into registers
        xb_s = gl.allocate_shared_memory(x.dtype.element_ty, [2, BM, BK], _act_operand_layout(BM, BK))
        xp, xm = _step_activations(x, a_row_c, live_c, kc, t0, K, BK)
        xb_s.index(0).store(_logical_k(gl.load(xp, mask=xm, other=0.0), FMT, BM))
        fence_async_shared()
        xp, xm = _step_activations(x, a_row_c, live_c, kc, t0 + 1, K, BK)
        x_next = gl.load(xp, mask=xm, other=0.0)
    s_next = _native_scales(scales_e, rows, valid, c, t0, C, NEUTRAL) if AHEAD == 1 else 0
    # two loops, one per conversion, chosen once per program (a branch in the loop would hold both's registers)
    if FMT == 0 and _wide_rows(wide, e, pid_n, R, BN) == 0:  # no scale of 4 or more in these rows
        acc = _k_steps(acc, t0, steps, w_e, rows, quad, q, valid, c, x, K, R, C, scales_e, s_next, w_s, x_s, a_row_c,
                       live_c, kc, a_row, live_x, kx, records, raw, tail, tail_raw, rb, slot, base, pos, rec0, tail_h,
                       fast_steps, full_tiles, S, S_TAIL, TC, h, sel, p01, p23, v4, h_next, xb_s, x_next, b_next, FMT,
                       SRC, BM, STAGES, AHEAD, 1, WG, XR, FIN)  # fmt: skip
    else:
        acc = _k_steps(acc, t0, steps, w_e, rows, quad, q, valid, c, x, K, R, C, scales_e, s_next, w_s, x_s, a_row_c,
                       live_c, kc, a_row, live_x, kx, records, raw, tail, tail_raw, rb, slot, base, pos, rec0, tail_h,
                       fast_steps, full_tiles, S, S_TAIL, TC, h, sel, p01, p23, v4, h_next, xb_s, x_next, b_next, FMT,
                       SRC, BM, STAGES, AHEAD, 2, WG, XR, FIN)  # fmt: skip
    if STAGES > 1:
        async_copy.wait_group(0)

    # float32 partials [splits, pairs, R], reduced in a fixed order by the finishing kernel (deterministic)
    route = _block_routes(sorted_ids, pid_b, pairs, BM, gl.SliceLayout(0, MMA), ROUTED)
    live = route < pairs
    on = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
    p_row = (gl.program_id(2) * pairs + gl.where(live, route, 0)).to(gl.int64) * R
    pm = gl.expand_dims(on < n_out, 1) & gl.expand_dims(live, 0)
    gl.store(part + gl.expand_dims(p_row, 0) + gl.expand_dims(on, 1), acc, mask=pm)
