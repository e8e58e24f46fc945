"""The engine's inline scale source: producer warps that decode engine records (``docs/csf-format.md`` §6) into
the scale slots of the GEMM's ring (``docs/moe-engine.md`` §4.3), byte for byte what a native scale panel's TMA
copy puts there. Traced inline into :class:`~csf_kernels.moe.kernels.engine_gemm.GroupedFp4Gemm`; its torch twin
is :mod:`csf_kernels.moe.engine_record_panel`.

Records are dealt round-robin over the CTA's walk to the program's decoder warps (one warp a scheduler: a lone
warp's decoding shares one scheduler with two consumer warps, and each wgmma waits for its warpgroup's slowest
warp); each warp has its own staging slots, offset table and decoded tile, and fills its records' ring stages.
Per unit (route block, 128-row tile) of expert ``e`` a warp reads row block ``rb = e * tiles_m + tm`` of the
plane's records:

* the block's record lengths (one byte a record), once, prefix-summed across the warp into absolute 16-byte
  offsets in shared memory (``block_start[rb]`` plus the exclusive sum): no record's address waits on another;
* each lane's quad of row bases (``base_ref`` plus the quad's 4 deltas: one u16 of ``base_delta`` for MXFP4's
  nibbles, one u32 for NVFP4's bytes), packed one byte a slot;
* per record dealt to it, in order: one ``cp.async.bulk`` of its ``L`` bytes into a staging slot
  (``RECORD_SLOTS`` of them a warp: that many records in flight), then lane ``l`` builds slots
  ``4 l .. 4 l + 3`` (four column bytes each) from the header, its selector bits and the bases; a record with
  exceptions goes through a slot-order tile in shared memory where the lanes scatter the entries (entry ``i`` on
  lane ``i % 32``; an escape's byte index is a ballot count) and read their words back; a raw record's words are
  its bytes.

Then it fills its records' scale slots in row order: a record is 128 rows x 4 scale columns, so MXFP4 (two columns a
64-K step) writes two consecutive stages from one decode (the tail record of ``C % 4 = 2`` columns one), NVFP4
(four columns a step) one. For each stage it waits for the stage to be empty, stores its four rows (rows
``16 w + q``, ``+ 8``, ``+ 64``, ``+ 72`` of lane ``l = 8 w + q``: a u16 a row for MXFP4, a u32 for NVFP4), zero
for rows past the expert's (as the TMA's out-of-bounds fill), and every lane arrives on the stage's full barrier
(whose count the GEMM raises by 32). Blocks of experts outside ``[0, E)`` read no record and write zeros.

Records are trusted: the codec checks them at load (:func:`csf_codec.engine_records.decode_engine_records`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, Uint64
from cutlass._mlir.dialects import llvm

from csf_codec.engine_record_layout import (
    BELOW_CODES,
    CODE_SHIFT,
    COUNT_MASK,
    COUNT_SHIFT,
    ESCAPE_CODE,
    MODE_RAW,
    ORIGIN_SHIFT,
    POSITION_MASK,
    RECORD_ALIGN,
    raw_units,
)
from csf_codec.tile_layout import TILE_COLS
from csf_kernels.moe.engine_specs import INLINE_MAX_COL_TILES as MAX_COL_TILES
from csf_kernels.moe.kernels.engine_producer import ring_phase, ring_slot
from csf_kernels.moe.kernels.engine_record_lanes import (
    RECORD_SLOTS,
    above_value,
    below_value,
    entries_byte,
    entry_byte,
    entry_shift,
    escapes_byte,
    first_dealt,
    quad_selector_byte,
    slot_row,
    spread_bits,
    spread_nibbles,
    spread_pairs,
    tile_byte,
)
from csf_kernels.moe.kernels.engine_work import UnitWork

__all__ = [
    "DECODER_ARRIVALS",
    "MAX_COL_TILES",
    "OFFSET_TABLE",
    "RECORD_BYTES",
    "RecordDecoderWarp",
    "decoder_bytes",
]

RECORD_BYTES = RECORD_ALIGN * raw_units(TILE_COLS)  # the worst case, a raw record: 528
DECODER_ARRIVALS = 32  # a stage's full barrier waits for every lane of the decoder warp
OFFSETS = MAX_COL_TILES + 1  # a row block's record offsets and its end
OFFSET_TABLE = 2 * OFFSETS  # two halves: the unit's and the next unit's
LENGTH_CHUNKS = (MAX_COL_TILES + 31) // 32  # registers a lane holds a block's record lengths in

_BULK_G2S = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];"


def _bulk_copy(dst: Int32, src: Int64, size: Int32, bar: Int32) -> None:
    llvm.inline_asm(
        None,
        [Int32(dst).ir_value(), Int64(src).ir_value(), Int32(size).ir_value(), Int32(bar).ir_value()],
        _BULK_G2S,
        "r,l,r,r,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def decoder_bytes(warps: int) -> int:
    """Shared memory of ``warps`` decoder warps: each one's staging slots, decoded tile, offset table and staging
    barriers, and alignment."""
    return warps * (RECORD_SLOTS * RECORD_BYTES + 512 + 4 * OFFSET_TABLE + 8 * RECORD_SLOTS) + 3 * 128


@cute.jit
def _tile_cols(j, full, cols):
    """Record ``j``'s scale columns: a full tile's, or the tail's past the ``full`` ones of a unit's ``cols``."""
    tc = Int32(TILE_COLS)
    if j >= full:
        tc = cols - full * TILE_COLS
    return tc


@cute.jit
def _producer_state(stages: cutlass.Constexpr, count):
    """The ring's producer state after ``count`` stages (the producer's phase starts at 1). ``count`` never goes
    negative: its unsigned remainder and quotient by the constant cost no signed fix-ups."""
    c = Uint32(count)
    return cutlass.pipeline.PipelineState(stages, count, Int32(c % stages), Int32(1 ^ ((c // stages) & 1)))


class RecordDecoderWarp:
    """A decoder warp of one program: ``nvfp4`` picks the slot format (MXFP4: two scale bytes a row a step,
    NVFP4: four), ``stages`` the ring's depth, ``warps`` how many decoder warps the records are dealt to, ``work``
    the program's :class:`~csf_kernels.moe.kernels.engine_work.UnitWork` (``None``: unsplit)."""

    def __init__(self, nvfp4: bool, stages: int, warps: int, work: UnitWork | None = None):
        self.nvfp4 = nvfp4
        self.stages = stages
        self.warps = warps
        self.slots = RECORD_SLOTS
        ring_slot(0, RECORD_SLOTS)  # refuses a slot count that is not a power of two
        self.steps_per_record = 1 if nvfp4 else 2
        self.work = UnitWork(False) if work is None else work

    @cute.jit
    def run(
        self, ring, s_s, bars, s_rec, s_tile, s_offs, base_ref, base_delta, block_start, record_units, body,
        block_expert, units, tiles_m, k_steps, rows, experts, rank, split_steps,
    ):  # fmt: skip
        """The warp's whole life: every unit this CTA walks, in the producers' order (a split unit decodes its K
        range's records, from the row block's offset table at its first record), decoding the records dealt to
        ``rank`` (:func:`~csf_kernels.moe.kernels.engine_record_lanes.first_dealt`).
        Records stream across units: while a unit decodes, the next unit's lengths, start and bases are loaded (used
        only at its first copy), and the warp's first records of the next unit are copied behind its last of this
        one, so a unit starts with its records in flight and no global read between it and its first decode.
        ``bars``, ``s_rec``, ``s_tile`` and ``s_offs`` are this warp's own."""
        lane = cute.arch.lane_idx()
        deal = self.warps
        taken = Int32(0)  # records this warp has waited for
        issued = Int32(0)  # records whose copy has started: with ``taken``, the staging ring's positions
        cols = k_steps * (4 if self.nvfp4 else 2)
        tiles = (cols + TILE_COLS - 1) // TILE_COLS  # a row block's records (all of K)
        full = cols // TILE_COLS
        words = cute.make_rmem_tensor((4,), Uint32)
        lengths = cute.make_rmem_tensor((LENGTH_CHUNKS,), Int32)  # a unit's record lengths, 32 records a register
        stride = cute.arch.grid_dim()[0]
        u = cute.arch.block_idx()[0]
        rb, tm, j0, n, steps = self._unit_records(block_expert, u, units, tiles_m, k_steps, split_steps, experts)
        seq = Int32(0)  # records of the units walked before this one (every decoder warp counts them all)
        stage0 = Int32(0)  # ring stages filled before this unit
        warm = Int32(0)  # the unit's table is in ``s_offs`` half ``half`` and this warp's first records are in flight
        cursor = Int32(0)  # the next record this warp copies, counted from this unit's first (past ``n``: the
        # next unit's)
        half = Int32(0)
        ref = Uint32(0)
        delta = Uint32(0)
        while u < units:
            tail_rows = rows - tm * 128 <= 64  # the tile's rows 64..127 lie past the expert's
            nxt = u + stride
            rb_next, tm_next, j0_next, n_next, steps_next = self._unit_records(
                block_expert, nxt, units, tiles_m, k_steps, split_steps, experts
            )
            first = first_dealt(rank, seq, deal)
            if rb >= 0:
                if warm == 0:  # a cold start: the unit's table, bases and first records now
                    self._load(lengths, record_units, rb, tiles, lane)
                    self._offsets(s_offs, half, lengths, Int32(block_start[rb]), tiles, lane)
                    ref, delta = self._base_words(base_ref, base_delta, rb, lane)
                    cursor = first
                    for _ in cutlass.range(self.slots, unroll=1):
                        if cursor < n:
                            to = ring_slot(issued, self.slots)
                            self._issue(bars, s_rec, s_offs, half, body, j0 + cursor, to, lane)
                            issued += 1
                            cursor += deal
                bases = self._bases(ref, delta)
                start_next = Int32(0)
                if rb_next >= 0:  # loads that land under this unit's records
                    self._load(lengths, record_units, rb_next, tiles, lane)
                    start_next = Int32(block_start[rb_next])
                    ref, delta = self._base_words(base_ref, base_delta, rb_next, lane)
                next_table = Int32(0)  # the next unit's offsets are in table half ``1 - half``
                for i in cutlass.range(first, n, deal, unroll=1):
                    slot = ring_slot(taken, self.slots)
                    cute.arch.mbarrier_wait(bars + slot, ring_phase(taken, self.slots))
                    tc = _tile_cols(j0 + i, full, cols)
                    self._decode(words, s_rec, s_tile, slot, tc, bases, lane)
                    cute.arch.sync_warp()  # every lane is done with the staging slot
                    taken += 1
                    if cursor < n:  # the record a staging slot's lead ahead: this unit's, then the next's
                        to = ring_slot(issued, self.slots)
                        self._issue(bars, s_rec, s_offs, half, body, j0 + cursor, to, lane)
                        issued += 1
                        cursor += deal
                    elif (rb_next >= 0) & (cursor < n + n_next):
                        if next_table == 0:
                            self._offsets(s_offs, 1 - half, lengths, start_next, tiles, lane)
                            next_table = Int32(1)
                        to = ring_slot(issued, self.slots)
                        self._issue(bars, s_rec, s_offs, 1 - half, body, j0_next + cursor - n, to, lane)
                        issued += 1
                        cursor += deal
                    self._fill_record(ring, s_s, words, stage0, i, tc, tail_rows, lane, Uint32(0xFFFFFFFF))
                # warm: this warp's first records of the next unit are in flight (the last of a unit may deal it
                # none of this unit's records: then nothing was copied ahead, and it starts the next one cold)
                warm = next_table
                cursor = cursor - n
            else:
                for i in cutlass.range(first, n, deal, unroll=1):
                    tc = _tile_cols(j0 + i, full, cols)
                    self._fill_record(ring, s_s, words, stage0, i, tc, tail_rows, lane, Uint32(0))
                warm = Int32(0)
            half = 1 - half
            seq += n
            stage0 += steps
            u = nxt
            rb = rb_next
            tm = tm_next
            j0 = j0_next
            n = n_next
            steps = steps_next

    @cute.jit
    def _unit_records(self, block_expert, u, units, tiles_m, k_steps, split_steps, experts):
        """Unit ``u``'s row block of records (``-1`` where it has none: past the units, or an invalid expert's block),
        its row tile, its first record, its records and its K steps (a split starts at a whole record: the launch checks
        it)."""
        rb = Int32(-1)
        tm = Int32(0)
        j0 = Int32(0)
        n = Int32(0)
        steps = Int32(0)
        if u < units:
            b, tm_u, _, k0, steps_u = self.work.unit(u, tiles_m, k_steps, split_steps)
            tm = tm_u
            steps = steps_u
            j0 = k0 // self.steps_per_record
            n = (k0 + steps + self.steps_per_record - 1) // self.steps_per_record - j0
            e = block_expert[b]
            if e >= 0 and e < experts:
                rb = e * tiles_m + tm
        return rb, tm, j0, n, steps

    @cute.jit
    def _load(self, lengths, record_units, rb, tiles, lane):
        """``lengths[c]``: record ``32 c + lane``'s length in 16-byte units (0 past the block's records)."""
        for c in cutlass.range_constexpr(LENGTH_CHUNKS):
            t = c * 32 + lane
            n = Int32(0)
            if t < tiles:
                n = Int32(record_units[rb, t])
            lengths[c] = n

    @cute.jit
    def _offsets(self, s_offs, half, lengths, start, tiles, lane):
        """Table half ``half``, ``s_offs[j]``: record ``j``'s offset in ``body`` in 16-byte units (``j = tiles``: the
        block's end), the exclusive sum of ``lengths`` from ``start``."""
        at = half * OFFSETS
        carry = Int32(0)
        for c in cutlass.range_constexpr(LENGTH_CHUNKS):
            if c * 32 < tiles:
                t = c * 32 + lane
                n = lengths[c]
                incl = n
                for d in cutlass.range_constexpr(5):
                    v = cute.arch.shuffle_sync_up(incl, 1 << d)
                    if lane >= (1 << d):
                        incl = incl + v
                if t < tiles:
                    s_offs[at + t] = start + carry + incl - n
                carry = carry + cute.arch.shuffle_sync(incl, 31)
        if lane == 0:
            s_offs[at + tiles] = start + carry
        cute.arch.sync_warp()

    @cute.jit
    def _base_words(self, base_ref, base_delta, rb, lane):
        """The loads behind the lane's row bases: the block's reference and the lane's quad of deltas."""
        ref = Uint32(base_ref[rb])
        delta = Uint32(0)
        if cutlass.const_expr(self.nvfp4):  # a byte a slot
            delta = Uint32(cute.recast_tensor(base_delta, cutlass.Uint32)[rb, lane])
        else:  # a nibble a slot
            delta = Uint32(cute.recast_tensor(base_delta, cutlass.Uint16)[rb, lane])
        return ref, delta

    @cute.jit
    def _bases(self, ref, delta):
        """The row bases of the lane's slots ``4 l .. 4 l + 3``, one byte each (slot ``4 l + i`` in byte ``i``)."""
        bases = Uint32(0)
        if cutlass.const_expr(self.nvfp4):
            bases = delta + ref * Uint32(0x01010101)
        else:
            bases = spread_nibbles(delta) + ref * Uint32(0x01010101)
        return bases

    @cute.jit
    def _issue(self, bars, s_rec, s_offs, half, body, j, slot, lane):
        """Lane 0 starts record ``j``'s copy (offset table half ``half``) into staging slot ``slot``."""
        if lane == 0:
            start = s_offs[half * OFFSETS + j]
            size = (s_offs[half * OFFSETS + j + 1] - start) * RECORD_ALIGN
            bar = bars + slot
            cute.arch.fence_proxy("async.shared", space="cta")  # the lanes' reads of the slot come first
            cute.arch.mbarrier_arrive_and_expect_tx(bar, size)
            src = body.iterator.toint() + Int64(start) * RECORD_ALIGN
            dst = (s_rec.iterator + slot * RECORD_BYTES).toint()
            _bulk_copy(dst, src, size, bar.toint())

    @cute.jit
    def _decode(self, words, s_rec, s_tile, slot, tc, bases, lane):
        """``words[i]``: the four column bytes of slot ``4 l + i`` (column ``c`` in byte ``c``) of the record in
        staging slot ``slot``, a tile of ``tc`` columns."""
        rec32 = cute.recast_tensor(s_rec, cutlass.Uint32)  # (RECORD_BYTES / 4, slots)
        h = Uint32(rec32[0, slot])
        mode = Int32(h & 3)
        if mode == MODE_RAW:  # the tile's native bytes in position order from byte 4
            if tc == TILE_COLS:
                for i in cutlass.range_constexpr(4):
                    words[i] = rec32[1 + 4 * lane + i, slot]
            else:  # two columns a slot
                for i in cutlass.range_constexpr(4):
                    words[i] = (Uint32(rec32[1 + 2 * lane + i // 2, slot]) >> (16 * (i % 2))) & 0xFFFF
        else:
            w = Int32(1) << mode
            origin = Int32((h >> ORIGIN_SHIFT) & 0xFF)
            origin = origin - ((origin & 0x80) << 1)
            count = Int32((h >> COUNT_SHIFT) & COUNT_MASK)
            if tc == TILE_COLS:  # a full tile: the quad's 16 w selector bits are one aligned u16, u32 or u64
                if mode == 0:  # w = 1: 4 bits a slot
                    bits = Uint32(cute.recast_tensor(s_rec, cutlass.Uint16)[2 + lane, slot])
                    for i in cutlass.range_constexpr(4):
                        words[i] = spread_bits(bits >> (4 * i)) + self._low_end(bases, origin, i)
                elif mode == 1:  # w = 2: 8 bits a slot
                    bits = Uint32(rec32[1 + lane, slot])
                    for i in cutlass.range_constexpr(4):
                        words[i] = spread_pairs(bits >> (8 * i)) + self._low_end(bases, origin, i)
                else:  # w = 4: 16 bits a slot
                    for i in cutlass.range_constexpr(4):
                        bits = Uint32(rec32[1 + 2 * lane + i // 2, slot]) >> (16 * (i % 2))
                        words[i] = spread_nibbles(bits) + self._low_end(bases, origin, i)
            else:
                # the quad's 4 tc w selector bits start at byte 4 + l tc w / 2, aligned to 1, 2 or 4: two aligned
                # words
                at = quad_selector_byte(lane, tc, w)
                sel = (Uint64(rec32[(at >> 2) + 1, slot]) << 32) | Uint64(rec32[at >> 2, slot])
                sel = sel >> Uint64((at & 3) * 8)
                mask = (Uint32(1) << Uint32(w)) - 1
                for i in cutlass.range_constexpr(4):
                    group = Uint32(sel >> Uint64(i * tc * w))
                    fields = Uint32(0)
                    for c in cutlass.range_constexpr(4):
                        fields = fields | (((group >> Uint32(c * w)) & mask) << (8 * c))
                    words[i] = fields + self._low_end(bases, origin, i)
            if count > 0:
                self._exceptions(words, s_rec, s_tile, slot, tc, w, count, lane)

    @cute.jit
    def _low_end(self, bases, origin, i: cutlass.Constexpr):
        """Slot ``4 l + i``'s window low end in each of its four column bytes (a field adds to it)."""
        lo = Int32((bases >> (8 * i)) & 0xFF) + origin
        return Uint32(lo) * Uint32(0x01010101)

    @cute.jit
    def _exceptions(self, words, s_rec, s_tile, slot, tc, w, count, lane):
        """Overwrite the record's exceptions: the words go to the slot-order tile, lane ``l`` patches entries
        ``l + 32 k`` (an exception's field is 0, so its byte holds the window's low end), the words come back."""
        rec8 = cute.recast_tensor(s_rec, cutlass.Uint8)
        tile8 = cute.recast_tensor(s_tile, cutlass.Uint8)
        for i in cutlass.range_constexpr(4):
            s_tile[4 * lane + i] = words[i]
        cute.arch.sync_warp()
        entries = entries_byte(tc, w)
        escapes = escapes_byte(entries, count)
        escaped = Int32(0)
        for first in cutlass.range(0, count, 32, unroll=1):
            i = first + lane
            at = cutlass.min(entry_byte(entries, i), RECORD_BYTES - 2)  # lanes past the count read in bounds
            pair = Int32(rec8[at, slot]) | (Int32(rec8[at + 1, slot]) << 8)
            entry = (pair >> entry_shift(i)) & 0xFFF
            code = entry >> CODE_SHIFT
            is_escape = Int32(0)
            if i < count and code == ESCAPE_CODE:
                is_escape = Int32(1)
            ballot = Uint32(cute.arch.vote_ballot_sync(is_escape != 0))
            rank = Int32(cute.arch.popc(ballot & ((Uint32(1) << Uint32(lane)) - 1)))
            if i < count:
                idx = tile_byte(entry & POSITION_MASK, tc)
                lo = Int32(tile8[idx])
                v = above_value(lo, code, w)
                if code < BELOW_CODES:
                    v = below_value(lo, code)
                if code == ESCAPE_CODE:
                    v = Int32(rec8[escapes + escaped + rank, slot])
                tile8[idx] = cutlass.Uint8(v)
            escaped = escaped + Int32(cute.arch.popc(ballot))
        cute.arch.sync_warp()
        for i in cutlass.range_constexpr(4):
            words[i] = s_tile[4 * lane + i]

    @cute.jit
    def _fill_record(self, ring, s_s, words, stage0, j, tc, tail_rows, lane, keep):
        """The unit's record ``j`` (counted from its first)'s ring stages, the unit's first being ring stage
        ``stage0`` (MXFP4: one a two-column step, NVFP4: one), from the lane's words masked by ``keep``."""
        steps = Int32(1)
        if cutlass.const_expr(not self.nvfp4):
            steps = tc // 2
        for h in cutlass.range(steps, unroll=1):
            state = _producer_state(self.stages, stage0 + j * self.steps_per_record + h)
            self._fill(ring, state, s_s, words, h, tail_rows, lane, keep)

    @cute.jit
    def _fill(self, ring, state, s_s, words, h, tail_rows, lane, keep):
        """Stage ``state``'s scale slots from the lane's words (MXFP4: columns ``2 h``, ``2 h + 1``), ``keep``
        masking them (0: zeros), then the lane's arrival on the stage's full barrier."""
        ring.sync_object_empty.wait(state.index, state.phase)
        for i in cutlass.range_constexpr(4):
            row = slot_row(lane, i)
            v = words[i] & keep
            if cutlass.const_expr(i >= 2):
                if tail_rows:
                    v = Uint32(0)
            if cutlass.const_expr(self.nvfp4):
                s_s[(row, 0, 0, state.index)] = v
            else:
                s16 = cute.recast_tensor(s_s, cutlass.Uint16)
                s16[(row, 0, 0, state.index)] = cutlass.Uint16((v >> (16 * h)) & 0xFFFF)
        cute.arch.mbarrier_arrive(ring.producer_get_barrier(state))
