"""CuTe DSL: the row-image expansion of narrow planes, one warp per 128-row block (build time only: imports
cutlass).

Narrow planes (at most 8 full tiles and a tail, e.g. DS4.1-TP4's W2 of 18 columns: 2304 bytes per row block)
give a CTA-wide expander (:mod:`csf_kernels.expand.kernels.cute_row_expander`) too little work per block: four warps
share one tile each, and the per-block setup, three CTA barriers and the copy-out dominate. Here each warp owns
a block: it stages the block's records, base deltas and tail record into its own shared-memory region
(``cp.async``), decodes every tile (lane ``g`` owns quad ``g``, format section 5) and the tail (lane ``g``
owns slots ``4 g .. 4 g + 3``) into its own image of the rows, patches exceptions, and copies the image out
in 16-byte chunks, with warp barriers only. A CTA's four warps take the blocks of its run in turn (warp ``w``:
blocks ``w, w + 4, ...``) and fetch their next block's records during the copy-out.

The image layouts, the arguments and the bounds rules are those of the CTA-wide expander (``GT`` = 8: column
groups of 8 full tiles, the tail tile in the last); the grid is (runs of ``blocks_per_cta`` row blocks, column
groups, routed experts). Planes of 16-byte multiple columns wider than 8 tiles (W13: 160 columns, 5 groups)
are imaged in groups of 32-byte row segments: whole sectors.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint8, Uint16, Uint32, Uint64
from cutlass.cute.nvgpu import cpasync

from csf_codec.tile_layout import slot_to_row
from csf_kernels.expand.kernels.cute_row_expander import (
    STORES,
    THREADS,
    RowImageExpander,
    image_bytes,
    record_stage_bytes,
)
from csf_kernels.record.cute import (
    CHUNK_BYTES,
    HEADER_BYTES,
    exception_capacity,
    header_count,
    header_mode,
    header_raw_index,
    quad_words,
    selector_origin,
    selector_origin_word,
    spread_fields,
)

__all__ = ["NARROW_GROUP_TILES", "WARPS", "NarrowRowExpander", "warp_region_words"]

NARROW_GROUP_TILES = 8
WARPS = THREADS // 32
_DELTA_ROW = 128


def warp_region_words(max_record_bytes: int, max_tail_bytes: int) -> tuple[int, int]:
    """(staging words, image words) of one warp's shared-memory region: the records, the tail record and the
    base-delta row; the image of 128 rows of at most 35 columns."""
    stage = record_stage_bytes(NARROW_GROUP_TILES, max_record_bytes, max_tail_bytes) + _DELTA_ROW
    return stage // 4, image_bytes(NARROW_GROUP_TILES) // 4


class NarrowRowExpander(RowImageExpander):
    """One warp per row block; arguments as :class:`~csf_kernels.expand.kernels.cute_row_expander.InlineRowExpander`."""

    def __init__(self, delta_bits: int, max_record_bytes: int, max_tail_bytes: int, store: int):
        if delta_bits not in (4, 8):
            raise ValueError(f"base deltas are 4 or 8 bits wide; got {delta_bits}")
        if store not in STORES:
            raise ValueError(f"image words are stored {STORES} bytes at a time; got {store}")
        for what, n in (("record", max_record_bytes), ("tail record", max_tail_bytes)):
            if n % CHUNK_BYTES or n <= 0:
                raise ValueError(f"the largest {what} must be a positive multiple of 16 bytes; got {n}")
        if max_record_bytes + max_tail_bytes < 64 * 4:
            raise ValueError("the record staging buffer cannot hold a tile's widest selectors")
        self.delta_bits = delta_bits
        self.max_record_bytes = max_record_bytes
        self.max_tail_bytes = max_tail_bytes
        self.store = store

    def shared_bytes(self) -> int:
        stage, image = warp_region_words(self.max_record_bytes, self.max_tail_bytes)
        return 4 * WARPS * (stage + image)

    @cute.kernel
    def kernel(
        self,
        base_ref: cute.Tensor,
        base_delta: cute.Tensor,
        records: cute.Tensor,
        tail: cute.Tensor,
        raw: cute.Tensor,
        tail_raw: cute.Tensor,
        out: cute.Tensor,
        expert_ids: cute.Tensor,
        blocks_per_expert: Int32,
        blocks_per_group: Int32,
        row_group: Int32,
        rows_per_expert: Int32,
        cols: Int32,
        full_tiles: Int32,
        record_words: Int32,
        tail_words: Int32,
        num_experts: Int32,
        groups: Int32,
        flat: Int32,
        blocks_per_cta: Int32,
    ):
        db = self.delta_bits
        tid, _, _ = cute.arch.thread_idx()
        bx, grp, bz = cute.arch.block_idx()
        warp = tid >> 5
        lane = tid & 31

        stage_words, image_words = warp_region_words(self.max_record_bytes, self.max_tail_bytes)
        smem = cutlass.memory.SmemAllocator()
        s_rec = smem.allocate_tensor(Uint32, cute.make_layout((WARPS * stage_words,)), byte_alignment=16)
        s_rec16 = cute.recast_tensor(s_rec, Uint16)
        s_rec8 = cute.recast_tensor(s_rec, Uint8)
        s_img32 = smem.allocate_tensor(Uint32, cute.make_layout((WARPS * image_words,)), byte_alignment=16)
        s_img16 = cute.recast_tensor(s_img32, Uint16)
        s_img8 = cute.recast_tensor(s_img32, Uint8)
        # this warp's regions (word offsets), and within its staging region the tail record and the deltas
        rw0 = warp * stage_words
        iw0 = warp * image_words
        tail_w0 = rw0 + NARROW_GROUP_TILES * self.max_record_bytes // 4
        delta_w0 = tail_w0 + self.max_tail_bytes // 4
        delta_chunks = db  # 16 * db bytes

        copy_atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Uint32, num_bits_per_copy=128
        )
        rec_chunks = cute.zipped_divide(records, (4,))
        tail_chunks = cute.zipped_divide(tail, (4,))
        s_chunks = cute.zipped_divide(s_rec, (4,))
        delta_words = cute.recast_tensor(base_delta, Uint32)  # [RB, 4 db] words, rows contiguous
        delta_rows = cute.zipped_divide(
            cute.make_tensor(delta_words.iterator, cute.make_layout(cute.size(delta_words))), (4,)
        )
        out8 = cute.recast_tensor(out, Uint8)
        out_chunks = cute.zipped_divide(out, (4,))
        img_chunks = cute.zipped_divide(s_img32, (4,))
        raw_rows = cute.size(raw, mode=[0])
        tail_raw_bytes = cute.size(tail_raw, mode=[0])

        e = Int32(expert_ids[bz])
        blk_first = bx * blocks_per_cta + warp
        blk_end = cutlass.min(blocks_per_expert, bx * blocks_per_cta + blocks_per_cta)
        if e >= 0 and e < num_experts and blk_first < blk_end:
            # column group grp: full tiles t0 .. t0 + ntiles - 1, and the tail tile in the last group
            t0 = grp * NARROW_GROUP_TILES
            ntiles = cutlass.max(Int32(0), cutlass.min(Int32(NARROW_GROUP_TILES), full_tiles - t0))
            tc = Int32(0)
            if grp == groups - 1:
                tc = cols - 4 * full_tiles
            row_bytes = cutlass.min(Int32(4 * NARROW_GROUP_TILES), cols - 4 * t0)
            pitch = row_bytes + 4
            if flat != 0:
                pitch = cols
            chunks = ntiles * (record_words >> 2)
            tail_chunks_n = Int32(0)  # tail chunks per block: none outside the last group or without a tail
            if tc > 0:
                tail_chunks_n = tail_words >> 2
            group_index = blk_first // blocks_per_group
            within = blk_first - group_index * blocks_per_group

            rb0 = e * blocks_per_expert + blk_first
            for i in range(lane, chunks, 32):
                cute.copy(
                    copy_atom,
                    rec_chunks[None, (rb0 * full_tiles + t0) * (record_words >> 2) + i],
                    s_chunks[None, rw0 // 4 + i],
                )
            for i in range(lane, tail_chunks_n, 32):
                cute.copy(copy_atom, tail_chunks[None, rb0 * tail_chunks_n + i], s_chunks[None, tail_w0 // 4 + i])
            if lane < delta_chunks:
                cute.copy(copy_atom, delta_rows[None, rb0 * delta_chunks + lane], s_chunks[None, delta_w0 // 4 + lane])
            cute.arch.cp_async_commit_group()
            ref = Int32(base_ref[rb0])
            caps = [exception_capacity(4 * record_words, (64 << m)) for m in range(3)]
            quad_rows = [slot_to_row(4 * lane + k) for k in range(4)]
            per_row = cutlass.max(Int32(1), row_bytes >> 4)
            r_step = 32 // per_row
            r_first = lane // per_row
            j_chunk = lane - r_first * per_row

            for blk in range(blk_first, blk_end, WARPS):
                rb = e * blocks_per_expert + blk
                row0 = e * rows_per_expert + group_index * row_group + within * 128
                valid = cutlass.min(Int32(128), row_group - within * 128)
                mis = Int32(0)
                if flat != 0:
                    mis = (row0 * cols) & 15
                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_warp()  # the block's records landed; the previous image is copied out

                if cutlass.const_expr(db == 4):
                    deltas = Uint32(s_rec16[2 * delta_w0 + lane])
                else:
                    deltas = Uint32(s_rec[delta_w0 + lane])
                bases = []
                slots = []  # image index (words, or halves) of the quad's rows at tile 0
                live = []
                for k in cutlass.range_constexpr(4):
                    bases.append(Uint32((ref + Int32((deltas >> (db * k)) & ((1 << db) - 1))) & 0xFF) * 0x01010101)
                    slots.append((4 * iw0 + mis + quad_rows[k] * pitch) // self.store)
                    live.append(quad_rows[k] < valid)

                for t in range(ntiles):
                    rec0 = rw0 + t * record_words
                    h = Uint32(s_rec[rec0 + record_words - 1])
                    mode = header_mode(h)
                    ow = selector_origin_word(h)
                    w0 = Uint32(0)
                    w1 = Uint32(0)
                    w2 = Uint32(0)
                    w3 = Uint32(0)
                    if mode == 3:
                        idx = header_raw_index(h)
                        if idx < raw_rows:
                            frag = cute.make_rmem_tensor((4,), Uint32)
                            cute.autovec_copy(cute.zipped_divide(raw[idx, None], (4,))[None, lane], frag)
                            w0 = frag[0]
                            w1 = frag[1]
                            w2 = frag[2]
                            w3 = frag[3]
                    elif mode == 0:
                        sel = Uint32(s_rec16[2 * rec0 + lane])
                        w0, w1, w2, w3 = quad_words(
                            bases, ow, [((sel >> (4 * k)) & 0xF) * 0x00204081 & 0x01010101 for k in range(4)]
                        )
                    elif mode == 1:
                        sel = Uint32(s_rec[rec0 + lane])
                        w0, w1, w2, w3 = quad_words(
                            bases, ow, [spread_fields((sel >> (8 * k)) & 0xFF, 2) for k in range(4)]
                        )
                    else:
                        lo = Uint32(s_rec[rec0 + 2 * lane])
                        hi = Uint32(s_rec[rec0 + 2 * lane + 1])
                        halves = (lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16)
                        w0, w1, w2, w3 = quad_words(bases, ow, [spread_fields(x, 4) for x in halves])
                    res = [w0, w1, w2, w3]
                    for k in cutlass.range_constexpr(4):
                        if live[k]:
                            if cutlass.const_expr(self.store == 4):
                                s_img32[slots[k] + t] = res[k]
                            else:
                                s_img16[slots[k] + 2 * t] = Uint16(res[k] & 0xFFFF)
                                s_img16[slots[k] + 2 * t + 1] = Uint16(res[k] >> 16)

                # exceptions of all the block's full tiles in one pass, so the lanes are busy: lane l < ntiles
                # describes tile l (header, capped entry count), a prefix sum gives each tile's first entry,
                # and lane j of a round finds its entry's tile by a 3-step search over those starts
                cute.arch.sync_warp()  # every tile's words are stored before lanes patch their bytes
                tile_h = Uint32(0)
                tile_n = Int32(0)
                tile_cap = Int32(0)
                if lane < ntiles:
                    tile_h = Uint32(s_rec[rw0 + lane * record_words + record_words - 1])
                    tile_mode = header_mode(tile_h)
                    if tile_mode != 3:
                        tile_cap = caps[2]
                        if tile_mode == 0:
                            tile_cap = caps[0]
                        elif tile_mode == 1:
                            tile_cap = caps[1]
                        tile_n = cutlass.max(Int32(0), cutlass.min(header_count(tile_h), tile_cap))
                incl = tile_n
                for d in cutlass.range_constexpr(3):
                    up = cute.arch.shuffle_sync_up(incl, 1 << d)
                    if lane >= (1 << d):
                        incl = incl + up
                total = cute.arch.shuffle_sync(incl, NARROW_GROUP_TILES - 1)
                first = incl - tile_n  # lanes past the tiles: total
                for base in range(0, total, 32):
                    j = base + lane
                    t = Int32(0)
                    for s in cutlass.range_constexpr(3):
                        cand = t + (4 >> s)
                        if cute.arch.shuffle_sync(first, cand) <= j:
                            t = cand
                    start = cute.arch.shuffle_sync(first, t)
                    h = cute.arch.shuffle_sync(tile_h, t)
                    cap = cute.arch.shuffle_sync(tile_cap, t)
                    if j < total:
                        k = j - start
                        sel_bytes = 64 << header_mode(h)
                        rec0 = rw0 + t * record_words
                        pos = Int32(s_rec16[2 * rec0 + (sel_bytes >> 1) + k])
                        r = slot_to_row(pos >> 2)
                        if pos < 512 and r < valid:
                            val = s_rec8[4 * rec0 + sel_bytes + 2 * cap + k]
                            s_img8[4 * iw0 + mis + r * pitch + 4 * t + (pos & 3)] = val

                if tc > 0:
                    # lane g: slots 4 g .. 4 g + 3, position p = slot * tc + col; a slot's tc fields are tc * w
                    # consecutive bits, read through a 64-bit window of two record words
                    h = Uint32(s_rec[tail_w0 + tail_words - 1])
                    mode = header_mode(h)
                    width = Int32(1) << mode
                    fits = 4 * tail_words >= 16 * tc * width + HEADER_BYTES
                    idx = header_raw_index(h)
                    raw_ok = idx < tail_raw_bytes // (128 * tc)  # the index, not its byte offset (may wrap)
                    origin = selector_origin(h)
                    for s in cutlass.range_constexpr(4):
                        slot = 4 * lane + s
                        r = slot_to_row(slot)
                        if r < valid:
                            if cutlass.const_expr(db == 4):
                                delta = Int32((deltas >> (4 * s)) & 15)
                            else:
                                delta = Int32((deltas >> (8 * s)) & 0xFF)
                            base = ref + delta + origin
                            bit = slot * tc * width
                            lo = Uint64(s_rec[tail_w0 + (bit >> 5)])
                            hi = Uint64(s_rec[tail_w0 + (bit >> 5) + 1])
                            window = ((hi << 32) | lo) >> Uint64(bit & 31)
                            for c in cutlass.range_constexpr(3):
                                if c < tc:
                                    val = Int32(0)
                                    if mode == 3:
                                        if raw_ok:
                                            val = Int32(tail_raw[idx * (128 * tc) + slot * tc + c])
                                    elif fits:
                                        field = Int32((window >> Uint64(c * width)) & Uint64((1 << width) - 1))
                                        val = (base + field) & 0xFF
                                    s_img8[4 * iw0 + mis + r * pitch + 4 * ntiles + c] = Uint8(val)
                    cute.arch.sync_warp()
                    if mode != 3:
                        sel_bytes = 16 * tc * width
                        cap = exception_capacity(4 * tail_words, sel_bytes)
                        for j in range(lane, cutlass.min(header_count(h), cap), 32):
                            pos = Int32(s_rec16[2 * tail_w0 + (sel_bytes >> 1) + j])
                            if pos < 128 * tc:
                                slot = pos // tc
                                r = slot_to_row(slot)
                                if r < valid:
                                    val = s_rec8[4 * tail_w0 + sel_bytes + 2 * cap + j]
                                    s_img8[4 * iw0 + mis + r * pitch + 4 * ntiles + pos - slot * tc] = val
                cute.arch.sync_warp()  # the image is complete; the staging region is free

                # fetch the warp's next block while this one is copied out
                if blk + WARPS < blk_end:
                    nrb = rb + WARPS
                    for i in range(lane, chunks, 32):
                        cute.copy(
                            copy_atom,
                            rec_chunks[None, (nrb * full_tiles + t0) * (record_words >> 2) + i],
                            s_chunks[None, rw0 // 4 + i],
                        )
                    for i in range(lane, tail_chunks_n, 32):
                        cute.copy(
                            copy_atom, tail_chunks[None, nrb * tail_chunks_n + i], s_chunks[None, tail_w0 // 4 + i]
                        )
                    if lane < delta_chunks:
                        cute.copy(
                            copy_atom, delta_rows[None, nrb * delta_chunks + lane], s_chunks[None, delta_w0 // 4 + lane]
                        )
                    cute.arch.cp_async_commit_group()
                    ref = Int32(base_ref[nrb])

                if flat != 0:
                    n = valid * cols
                    chunk0 = (row0 * cols - mis) >> 4
                    for i in range(lane, (mis + n + 15) >> 4, 32):
                        lo16 = i * 16
                        if lo16 >= mis and lo16 + 16 <= mis + n:
                            frag = cute.make_rmem_tensor((4,), Uint32)
                            cute.autovec_copy(img_chunks[None, iw0 // 4 + i], frag)
                            cute.autovec_copy(frag, out_chunks[None, chunk0 + i])
                        else:
                            for b in cutlass.range_constexpr(16):
                                if lo16 + b >= mis and lo16 + b < mis + n:
                                    out8[(chunk0 + i) * 16 + b] = s_img8[4 * iw0 + lo16 + b]
                else:
                    if r_first < r_step:
                        first = ((row0 + r_first) * cols + 4 * t0 + 16 * j_chunk) >> 4
                        for r in range(r_first, valid, r_step):
                            src = iw0 + ((r * pitch + 16 * j_chunk) >> 2)
                            frag = cute.make_rmem_tensor((4,), Uint32)
                            for c in cutlass.range_constexpr(4):
                                frag[c] = s_img32[src + c]
                            cute.autovec_copy(frag, out_chunks[None, first + ((r - r_first) * cols >> 4)])

                for _ in cutlass.range_constexpr(WARPS):  # the warp's next block is WARPS blocks on
                    within = within + 1
                    if within == blocks_per_group:
                        within = Int32(0)
                        group_index = group_index + 1
