"""Gluon: sparse MLA decode for 64-head blocks, heads along wgmma's M, the records converted once into shared
memory by a converter warpgroup.

Same job, arguments, partials and direct finish as ``mla_decode_wgmma`` (one program: one query row, 64 heads,
one split's 64-candidate chunks under the balanced policy of ``mla_decode``). The shape is FlashMLA's: three
warpgroups (``gl.warp_specialize``), each record read and converted once per program and every product a
64-row wgmma, so one operand read from shared memory serves 64 heads:

* the converter (a worker) asks L2 for a chunk's records two chunks ahead (bulk prefetches), gathers them
  into registers (32-bit words) before waiting for a free stage, converts the E4M3 codes to bf16 with the
  group scale folded in (exact: a power of two times a code with 3 mantissa bits; see ``KEY_SHIFT``), copies
  the bf16 rope by ``cp.async``, and stores both into one of two stages in the tensor cores' swizzled layout
  with the candidates' liveness, then hands the stage over (mbarrier ``full``);
* two consumers (the program's warpgroup and a worker): consumer C computes the scores of candidates
  [32 C, 32 C + 32), S = Q K^T in one accumulation (A = the bf16 query, B = the stage's keys, both in shared
  memory; the rope in the same chain); the two exchange their row maxima, then their bf16 probabilities
  through shared memory (in the stage's rope buffer, dead by then), so both run the same online softmax;
  consumer C accumulates output columns [256 C, 256 C + 256): O += P V with A = both halves' probabilities
  and B = the stage's codes of latent groups 2C and 2C + 1; then frees the stage (mbarrier ``empty``, one
  arrival per consumer).

bf16 operands with the scales folded in (not float16 with the scales kept apart, as the 16- and 32-head
programs): every key, value and query value is exact in bf16, so the scores need no per-group scaling and the
probabilities no units; they round to bf16 (8 bits) before the value product, as FlashMLA's do. Query modes
as ``mla_decode_mma`` (the quantized query dequantized exactly into bf16: modes 1 and 2 give the same bits);
skipped candidates never read (zero-filled, masked to -inf).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

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
    _live,
    _program_chunks,
    _query_latent,
    _query_rope,
    _records,
    _rows_layout,
)
from csf_kernels.mla.kernels.gluon_decode_wgmma import SIGNATURE, _direct_rows, _direct_weights, _store_rows
from csf_kernels.runtime.pdl import gluon_await_predecessor

__all__ = ["SIGNATURE", "mla_decode_wide"]

MULTIPLE_OF = {"heads": 64, "topk": 64}
BH: gl.constexpr = gl.constexpr(64)  # heads per program: wgmma's M
GROUPS: gl.constexpr = gl.constexpr(LATENT // GROUP)
HALF_CHUNK: gl.constexpr = gl.constexpr(CHUNK // 2)  # candidates whose scores a consumer computes
# The stored keys (and the query's rope) are the true values times 2**-64 (so that one bf16 product converts a
# code, see _bf16_pairs); the scores and the output are scaled back by KEY_SHIFT in float32, exactly.
KEY_SHIFT: gl.constexpr = gl.constexpr(18446744073709551616.0)  # 2**64


# ------------------------------------------------------------------------------------------- layouts


@gluon.constexpr_function
def _scores_acc():
    """A consumer's half of S [64 heads, 32 candidates]: heads along M over the warpgroup's 4 warps."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF_CHUNK, 16])


@gluon.constexpr_function
def _values_acc():
    """O [64 heads, 128 columns] per latent group."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GROUP, 16])


@gluon.constexpr_function
def _word_layout():
    """A chunk's [64 candidates, 32] words (a group's 128 key bytes) over the converter's 4 warps: 8 lanes per
    record, 2 words (8 bytes) per thread in each half of the record's group (words [2 t, 2 t + 2) and
    [16 + 2 t, 16 + 2 t + 2) for lane t), 16 records per pass. Halves, so that each lane's converted bf16 fall in
    one 128-byte swizzle row per store (see ``_pair_layout``)."""
    return _copy_layout(2, 4)


@gluon.constexpr_function
def _pair_layout():
    """A group's converted codes as [64, 64] words of two bf16: the word layout's rows, 4 contiguous words (16
    bytes) per thread in each half (``_bf16_pairs`` doubles each run). A store's 8 lanes of one record write 8
    distinct 16-byte units of one 128-byte row of the swizzled buffer: no bank conflict (with 16 contiguous
    words per lane, the two halves of each lane's 32 bytes went to the same banks of two rows: two-way)."""
    return _copy_layout(4, 4)


@gluon.constexpr_function
def _rope_layout():
    """A chunk's rope [64, 64] bf16 for cp.async: 16 bytes per copy, 8 lanes per record (128 bytes)."""
    return _copy_layout(8, 4)


@gluon.constexpr_function
def _words_view():
    """128-byte-swizzled shared memory seen as 32-bit words: the swizzle moves 16-byte units within 128-byte
    rows whatever the element type, so a [64, 128] (or [64, 64]) bf16 operand buffer stored as [64, 64] (or
    [64, 32]) words of this layout holds the same bytes in the same places."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)


# ------------------------------------------------------------------------------------------- converter


@gluon.jit
def _bf16_pairs(words, factor):
    """Words of 4 E4M3 codes -> [.., 2 x] words of two bf16 each, times ``factor`` (bf16x2 bits, one per row):
    byte 2t + e of a word is bf16 e of pair t. A code's bits moved into a bf16's (the sign in place, exponent and
    mantissa four places down) are the code times 2**-120, subnormals included; one exact bf16 product applies
    the factor (the group scale times 2**56, so the stored values are the keys times 2**-64: see ``KEY_SHIFT``)."""
    lo, hi = gl.inline_asm_elementwise(
        """{
        .reg .b32 a, b, s, t;
        prmt.b32 a, $2, 0, 0x1404;
        prmt.b32 b, $2, 0, 0x3424;
        shr.u32 s, a, 4;
        and.b32 t, a, 0x80008000;
        lop3.b32 a, t, s, 0x07f007f0, 0xf8;
        shr.u32 s, b, 4;
        and.b32 t, b, 0x80008000;
        lop3.b32 b, t, s, 0x07f007f0, 0xf8;
        mul.rn.bf16x2 $0, a, $3;
        mul.rn.bf16x2 $1, b, $3;
        }""",
        "=r,=r,r,r",
        [words, gl.expand_dims(factor, 1) + gl.zeros_like(words)],
        dtype=(gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )
    pairs = gl.reshape(gl.join(lo, hi), [words.shape[0], 2 * words.shape[1]])
    return gl.convert_layout(pairs, _pair_layout(), assert_trivial=True)


@gluon.jit
def _factor(scale):
    """bf16x2 bits of scale * 2**56 (exact: a power of two in bf16's range for scales up to 2**71)."""
    f = (scale * 72057594037927936.0).to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    return f | (f << 16)


@gluon.jit
def _prefetch(kv, ids, num_slots):
    """Ask L2 for whole records (656 bytes each, one bulk prefetch per record; dead ids: nothing), so their
    gather a chunk later finds them there."""
    rec, live = _records(ids, num_slots)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], 656; mov.b32 $0, 0; }",
        "=r,l,r",
        [kv + rec, live.to(gl.int32)],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _gather_words(kv, rec, live, at: gl.constexpr):
    """32 words of each record from byte ``at`` on (zero for dead candidates: nothing read). Words, not bytes:
    bytes would take a register each."""
    w = gl.arange(0, 32, layout=gl.SliceLayout(0, _word_layout()))
    words = (kv + rec + at).to(gl.pointer_type(gl.int32))
    return gl.load(gl.expand_dims(words, 1) + gl.expand_dims(w, 0), mask=gl.expand_dims(live, 1), other=0)


@gluon.jit
def _gather(kv, ids, num_slots):
    """A chunk's key codes into registers as words, and each record's four group scales as conversion factors
    (zero for dead candidates)."""
    rec, live = _records(ids, num_slots)
    scales = (kv + rec + SCALE_AT).to(gl.pointer_type(gl.float32))
    k0 = _gather_words(kv, rec, live, 0 * GROUP)
    k1 = _gather_words(kv, rec, live, 1 * GROUP)
    k2 = _gather_words(kv, rec, live, 2 * GROUP)
    k3 = _gather_words(kv, rec, live, 3 * GROUP)
    f0 = _factor(gl.load(scales + 0, mask=live, other=0.0))
    f1 = _factor(gl.load(scales + 1, mask=live, other=0.0))
    f2 = _factor(gl.load(scales + 2, mask=live, other=0.0))
    f3 = _factor(gl.load(scales + 3, mask=live, other=0.0))
    return k0, k1, k2, k3, f0, f1, f2, f3


@gluon.jit
def _copy_rope(kv, ids, num_slots, rope):
    """cp.async a chunk's rope (bf16, stored as is) into its stage (dead candidates: zero-filled)."""
    RL: gl.constexpr = _rope_layout()
    rec, live = _records(gl.convert_layout(ids, gl.SliceLayout(1, RL)), num_slots)
    r = gl.arange(0, ROPE, layout=gl.SliceLayout(0, RL))
    ropes = (kv + rec + ROPE_AT).to(gl.pointer_type(gl.bfloat16))
    async_copy.async_copy_global_to_shared(rope, gl.expand_dims(ropes, 1) + gl.expand_dims(r, 0),
                                           mask=gl.expand_dims(live, 1))  # fmt: skip
    async_copy.commit_group()


@gluon.jit
def _store_keys(keys_s, words, factor, k):
    """A group's codes times their factors as bf16 into operand buffer ``k`` (seen as words)."""
    keys_s.index(k)._reinterpret(gl.int32, [CHUNK, GROUP // 2], _words_view()).store(_bf16_pairs(words, factor))


@gluon.jit
def _converter(kv, indices, lengths, num_slots, heads, topk, splits, keys_s, rope_s, live_s, full, empty):
    """The converter warpgroup: each chunk's records prefetched into L2 two chunks ahead and gathered into
    registers before the wait for a free stage, converted and stored with the candidates' liveness into that
    stage (the rope by cp.async), then handed to the consumers."""
    row, _h0, _s, n, c0, c1 = _program_chunks(lengths, heads, topk, splits, BH)
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _word_layout()))
    ids = _ids(indices, row, topk, n, c0, c0 < c1, rows)
    ids_next = _ids(indices, row, topk, n, c0 + 1, c0 + 1 < c1, rows)
    _prefetch(kv, ids, num_slots)
    _prefetch(kv, ids_next, num_slots)
    for c in range(c0, c1):
        i = c - c0
        st = i % STAGES
        k0, k1, k2, k3, f0, f1, f2, f3 = _gather(kv, ids, num_slots)
        ahead = _ids(indices, row, topk, n, c + 2, c + 2 < c1, rows)
        _prefetch(kv, ahead, num_slots)
        mbarrier.wait(empty.index(st), ((i // STAGES) & 1) ^ 1)  # both consumers are done with this stage
        _copy_rope(kv, ids, num_slots, rope_s.index(st))
        _store_keys(keys_s, k0, f0, GROUPS * st + 0)
        _store_keys(keys_s, k1, f1, GROUPS * st + 1)
        _store_keys(keys_s, k2, f2, GROUPS * st + 2)
        _store_keys(keys_s, k3, f3, GROUPS * st + 3)
        live_s.index(st).store(_live(ids, num_slots).to(gl.int32))
        async_copy.wait_group(0)  # the rope's copies
        fence_async_shared()  # the stores before the tensor cores read them
        gl.thread_barrier()  # every converter warp's
        mbarrier.arrive(full.index(st))
        ids = ids_next
        ids_next = ahead


# ------------------------------------------------------------------------------------------- consumers


@gluon.jit
def _stage_query(q, row, h0, heads, q_s, qr_s, Q_MODE: gl.constexpr, C: gl.constexpr):
    """Consumer ``C``'s share of the query of heads [h0, h0 + 64) as the scores' A operands in shared memory,
    in bf16 (exact in every query mode): latent groups 2C and 2C + 1 (rows [64 g, 64 g + 64) of ``q_s``), and
    the rope (``qr_s``) from consumer 0."""
    lat, factor = _query_latent(q, row, h0, heads, 2 * C, 2, Q_MODE, BH)  # float16 [64, 256] times factor [64, 2]
    x = gl.reshape(lat.to(gl.float32), [BH, 2, GROUP])
    x = x * gl.expand_dims(gl.convert_layout(factor, gl.SliceLayout(2, x.type.layout)), 2)
    groups = gl.permute(x.to(gl.bfloat16), [1, 0, 2])  # [2, 64, 128]
    q_s.slice(2 * C * BH, 2 * BH).store(gl.reshape(groups, [2 * BH, GROUP]))
    if C == 0:  # the rope times 2**-64, as the keys are stored (exact above 2**-69)
        RL: gl.constexpr = _rows_layout(8, 4)
        rope = _query_rope(q, row, h0, heads, gl.arange(0, ROPE, layout=gl.SliceLayout(0, RL)), RL, Q_MODE, BH)
        qr_s.store((rope.to(gl.float32) * (1.0 / KEY_SHIFT)).to(gl.bfloat16))


@gluon.jit
def _scores(keys_s, rope_s, q_s, qr_s, st, C: gl.constexpr):
    """Candidates [32 C, 32 C + 32) of S [64 heads, 64] of stage ``st``, before ``sm_scale``: one chain over
    the latent groups and the rope (issued; awaited by the caller)."""
    s = gl.zeros([BH, HALF_CHUNK], gl.float32, _scores_acc())
    keys = rope_s.index(st).slice(C * HALF_CHUNK, HALF_CHUNK).permute([1, 0])
    s = warpgroup_mma(qr_s, keys, s, use_acc=False, is_async=True)
    for g in gl.static_range(GROUPS):
        keys = keys_s.index(GROUPS * st + g).slice(C * HALF_CHUNK, HALF_CHUNK).permute([1, 0])
        s = warpgroup_mma(q_s.slice(g * BH, BH), keys, s, is_async=True)
    return s


@gluon.jit
def _probabilities(rope_s, st):
    """Stage ``st``'s probabilities [2 halves, 64 heads, 32 candidates] (bf16), the values' A operands: in the
    stage's rope buffer, dead once both consumers' scores are done (the converter refills it only after both
    free the stage)."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, HALF_CHUNK], gl.bfloat16)
    return rope_s.index(st)._reinterpret(gl.bfloat16, [2, BH, HALF_CHUNK], layout)


@gluon.jit
def _exchange(x_s, bars, x, k, other, phase):
    """Store ``x`` [64] at slot ``k`` and announce it; wait for slot ``other`` (the other consumer's) and load it."""
    x_s.index(k).store(x)
    gl.thread_barrier()
    mbarrier.arrive(bars.index(k))
    mbarrier.wait(bars.index(other), phase)
    return x_s.index(other).load(x.type.layout)


@gluon.jit
def _emit_group(o, den_safe, w, total, part_out, out, at_head, g: gl.constexpr, PARTIAL_BF16: gl.constexpr,
                DIRECT: gl.constexpr):  # fmt: skip
    """Group ``g``'s normalised rows [64 heads, 128], stored from the accumulator's layout."""
    OL: gl.constexpr = o.type.layout
    o = o * gl.expand_dims(KEY_SHIFT / den_safe, 1)
    col = g * GROUP + gl.arange(0, GROUP, layout=gl.SliceLayout(0, OL))
    at = gl.expand_dims(gl.convert_layout(at_head, gl.SliceLayout(1, OL)), 1) + gl.expand_dims(col, 0)
    if DIRECT:
        _direct_rows(o, w, total, out, at)
    else:
        _store_rows(o, part_out, at, PARTIAL_BF16)


@gluon.jit
def _consumer(q, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads, topk,
              splits, keys_s, rope_s, live_s, q_s, qr_s, x_s, full, empty, ready, xmax, xp, xden,
              PARTIAL_BF16: gl.constexpr, Q_MODE: gl.constexpr, DIRECT: gl.constexpr, HAS_SINK: gl.constexpr,
              WRITE_LSE: gl.constexpr, C: gl.constexpr):  # fmt: skip
    """Consumer ``C``: the scores of candidates [32 C, 32 C + 32) of every chunk; the row maxima and then the
    probabilities exchanged with the other consumer through shared memory (both then hold the same maxima, bit
    for bit: a maximum does not depend on order); output columns [256 C, 256 C + 256) from both halves'
    probabilities. The normalisers (each consumer sums its candidates') are added once, at the end."""
    SACC: gl.constexpr = _scores_acc()
    OACC: gl.constexpr = _values_acc()
    HEADS: gl.constexpr = gl.SliceLayout(1, SACC)
    G0: gl.constexpr = 2 * C
    G1: gl.constexpr = 2 * C + 1
    row, h0, s, _n, c0, c1 = _program_chunks(lengths, heads, topk, splits, BH)
    _stage_query(q, row, h0, heads, q_s, qr_s, Q_MODE, C)
    fence_async_shared()  # the query's stores before the tensor cores read them
    gl.thread_barrier()
    mbarrier.arrive(ready)
    mbarrier.wait(ready, 0)  # both consumers' shares of the query are stored

    m = gl.full([BH], float("-inf"), gl.float32, HEADS)
    den = gl.zeros([BH], gl.float32, HEADS)
    acc0 = gl.zeros([BH, GROUP], gl.float32, OACC)
    acc1 = gl.zeros([BH, GROUP], gl.float32, OACC)
    for c in range(c0, c1):
        i = c - c0
        st = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(full.index(st), phase)
        sco = warpgroup_mma_wait(0, deps=[_scores(keys_s, rope_s, q_s, qr_s, st, C)])
        live = live_s.index(st).slice(C * HALF_CHUNK, HALF_CHUNK).load(gl.SliceLayout(0, SACC)) != 0
        sco = gl.where(gl.expand_dims(live, 0), sco * (sm_scale * KEY_SHIFT), float("-inf"))
        # _softmax_step's online maximum over both halves, the normaliser summed per chunk
        mine = gl.max(sco, 1)
        theirs = _exchange(x_s, xmax, mine, 2 * st + C, 2 * st + 1 - C, phase)  # (both consumers' scores are done)
        m_new = gl.maximum(m, gl.maximum(mine, theirs))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no live key yet: keep exp() finite
        alpha = gl.exp(m - m_ref)
        p = gl.exp(sco - gl.expand_dims(m_ref, 1))
        den = den * alpha + gl.sum(p, 1)
        probs = _probabilities(rope_s, st)
        probs.index(C).store(p.to(gl.bfloat16))
        fence_async_shared()  # the probabilities' stores before the tensor cores read them
        gl.thread_barrier()
        mbarrier.arrive(xp.index(2 * st + C))
        mbarrier.wait(xp.index(2 * st + 1 - C), phase)
        rescale = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, OACC)), 1)
        acc0 = warpgroup_mma(probs.index(0), keys_s.index(GROUPS * st + G0).slice(0, HALF_CHUNK), acc0 * rescale,
                             is_async=True)  # fmt: skip
        acc0 = warpgroup_mma(probs.index(1), keys_s.index(GROUPS * st + G0).slice(HALF_CHUNK, HALF_CHUNK), acc0,
                             is_async=True)  # fmt: skip
        acc1 = warpgroup_mma(probs.index(0), keys_s.index(GROUPS * st + G1).slice(0, HALF_CHUNK), acc1 * rescale,
                             is_async=True)  # fmt: skip
        acc1 = warpgroup_mma(probs.index(1), keys_s.index(GROUPS * st + G1).slice(HALF_CHUNK, HALF_CHUNK), acc1,
                             is_async=True)  # fmt: skip
        acc0, acc1 = warpgroup_mma_wait(0, deps=[acc0, acc1])
        gl.thread_barrier()  # every warp's reads of the stage are done
        mbarrier.arrive(empty.index(st))
        m = m_new

    theirs = _exchange(x_s, xden, den, 2 * STAGES + C, 2 * STAGES + 1 - C, 0)
    den = den + theirs  # addition commutes: both consumers hold the same sum, bit for bit
    lse, den_safe = _finish(m, gl.expand_dims(den, 1), 1)
    h = h0 + gl.arange(0, BH, layout=HEADS)
    slot = (row.to(gl.int64) * splits + s) * heads + h
    w = den_safe
    total = den_safe
    if DIRECT:
        w, total = _direct_weights(lse, attn_sink, lse_out, slot, h, HAS_SINK, WRITE_LSE and C == 0)
    elif C == 0:
        gl.store(part_lse + slot, lse)
    den_o = gl.convert_layout(den_safe, gl.SliceLayout(1, OACC))
    _emit_group(acc0, den_o, w, total, part_out, out, slot * LATENT, G0, PARTIAL_BF16, DIRECT)
    _emit_group(acc1, den_o, w, total, part_out, out, slot * LATENT, G1, PARTIAL_BF16, DIRECT)


@gluon.jit
def mla_decode_wide(
    q, kv, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads, topk, splits,
    BH: gl.constexpr, PARTIAL_BF16: gl.constexpr, Q_MODE: gl.constexpr, PDL: gl.constexpr, DIRECT: gl.constexpr,
    HAS_SINK: gl.constexpr, WRITE_LSE: gl.constexpr,
):  # fmt: skip
    gluon_await_predecessor(PDL)
    gl.static_assert(BH == 64, "64 heads per program: wgmma's M")
    gl.static_assert(gl.num_warps() == 4, "consumer 0 is the program's warpgroup")
    gl.static_assert(DIRECT == 1 or (HAS_SINK == 0 and WRITE_LSE == 0), "the sink and lse are the finisher's")
    keys_s = gl.allocate_shared_memory(  # [stage x group, 64 candidates, 128]: bf16 codes times their scales
        gl.bfloat16, [STAGES * GROUPS, CHUNK, GROUP], gl.NVMMASharedLayout.get_default_for([CHUNK, GROUP], gl.bfloat16)
    )
    rope_s = gl.allocate_shared_memory(
        gl.bfloat16, [STAGES, CHUNK, ROPE], gl.NVMMASharedLayout.get_default_for([CHUNK, ROPE], gl.bfloat16)
    )
    q_s = gl.allocate_shared_memory(  # [group x 64 heads, 128]
        gl.bfloat16, [GROUPS * BH, GROUP], gl.NVMMASharedLayout.get_default_for([BH, GROUP], gl.bfloat16)
    )
    qr_s = gl.allocate_shared_memory(
        gl.bfloat16, [BH, ROPE], gl.NVMMASharedLayout.get_default_for([BH, ROPE], gl.bfloat16)
    )
    live_s = gl.allocate_shared_memory(  # [stage, 64 candidates]: whether each names a record
        gl.int32, [STAGES, CHUNK], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    )
    x_s = gl.allocate_shared_memory(  # [stage x consumer (row maxima), then consumer (normalisers), 64 heads]
        gl.float32, [2 * STAGES + 2, BH], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    )
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    xmax = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())  # [stage x consumer]
    xp = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    xden = gl.allocate_shared_memory(gl.int64, [2 * STAGES + 2, 1], mbarrier.MBarrierLayout())  # slots 4, 5 used
    for b in gl.static_range(STAGES):
        mbarrier.init(full.index(b), count=1)
        mbarrier.init(empty.index(b), count=2)  # both consumers free a stage
    for b in gl.static_range(2 * STAGES):
        mbarrier.init(xmax.index(b), count=1)
        mbarrier.init(xp.index(b), count=1)
    for b in gl.static_range(2 * STAGES + 2):
        mbarrier.init(xden.index(b), count=1)
    mbarrier.init(ready, count=2)
    # (each partition's arguments written out: a concatenated tuple would lose the constexprs)
    gl.warp_specialize([
        (_consumer, (q, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads,
                     topk, splits, keys_s, rope_s, live_s, q_s, qr_s, x_s, full, empty, ready, xmax, xp, xden,
                     PARTIAL_BF16, Q_MODE, DIRECT,
                     HAS_SINK, WRITE_LSE, 0)),
        (_consumer, (q, indices, lengths, part_out, part_lse, attn_sink, out, lse_out, num_slots, sm_scale, heads,
                     topk, splits, keys_s, rope_s, live_s, q_s, qr_s, x_s, full, empty, ready, xmax, xp, xden,
                     PARTIAL_BF16, Q_MODE, DIRECT,
                     HAS_SINK, WRITE_LSE, 1)),
        (_converter, (kv, indices, lengths, num_slots, heads, topk, splits, keys_s, rope_s, live_s, full, empty)),
    ], [4, 4], [184, 120])  # fmt: skip
