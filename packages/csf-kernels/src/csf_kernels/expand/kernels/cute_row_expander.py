"""CuTe DSL: expand inline CSF tiles into the native scale plane through a shared-memory image of whole rows
(build time only: imports cutlass).

Why this shape: the Triton expansion writes each thread's decoded words straight to global memory, so rows of 18 or
160 bytes leave partial 32-byte sectors that the L2 merges (its write traffic, not DRAM, limits it;
``docs/archive/perf-log.md``, "Scale expansion, DS4.1-TP4 layer"). Here a CTA decodes every tile of one 128-row
block (or of one 128-column group of it) into shared memory laid out like the plane itself, then copies the image
out with 16-byte stores by consecutive threads: whole sectors, one pass.

One CTA of 128 threads per (run of row blocks, column group, routed expert); for each row block of its run:

1. stage: the group's full-tile records (contiguous in ``records``) and the block's tail record are copied into
   shared memory with 16-byte ``cp.async`` copies (the next block's while this one is copied out);
2. decode: warp ``w`` takes the group's tiles ``w, w + 4, ...``; lane ``g`` owns quad ``g`` (slots ``4 g ..
   4 g + 3``, format section 5) and writes its four words ``base + o + field`` (or its raw tile's 16 bytes)
   into the image, then (after a warp barrier) the warp's lanes take the tile's exception entries and patch
   their bytes; every thread decodes one slot of the tail tile, whose exceptions follow a CTA barrier; rows
   past the row group are skipped;
3. copy out: after a CTA barrier, 16-byte chunks of the image go to the plane.

Two image layouts (chosen by the host, see :func:`csf_kernels.expand.specs.row_image_layout`):

* ``padded`` (``cols % 16 == 0``): each row's ``L`` bytes of the group at pitch ``L + 4`` (a 4-byte pad keeps
  a warp's 32 row writes off one bank); every row's chunk in the plane is 16-byte aligned;
* ``flat`` (one column group holds the whole row, tail tile included): rows at pitch ``cols``, so the block's
  rows are one contiguous run of the plane; the image starts ``mis = (row0 * cols) % 16`` bytes into shared
  memory so that image and plane chunks line up; the run's partial first and last chunks are written bytewise.

``GT`` (full tiles per column group: 8 or 32) and the image store width (4 bytes, or 2 for rows of an even
column count) are compile-time, with the shared memory they need; the record sizes, columns and counts are
run-time scalars, and per-thread row offsets and bases are computed once, so a tile costs a header and a
selector load and a few instructions per word. Headers are trusted as far as the codec validates them, but no
field can make the kernel read or write out of bounds: selectors a record cannot hold read garbage inside the
staging buffer, raw indices past the raw array write zeros, and exception positions past the tile, rows past
the row group and entry counts past the record's capacity are skipped.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint8, Uint16, Uint32, Uint64
from cutlass.cute.nvgpu import cpasync

from csf_codec.tile_layout import slot_to_row
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

__all__ = [
    "GROUP_TILES",
    "STORES",
    "THREADS",
    "WIDE_GROUP_TILES",
    "InlineRowExpander",
    "RowImageExpander",
    "image_bytes",
    "record_stage_bytes",
]

THREADS = 128
GROUP_TILES = (8, 32)  # full tiles per column group: narrow planes (up to 35 columns) and wide ones
WIDE_GROUP_TILES = (
    32  # this module's CTA-wide expander; 8-tile groups: csf_kernels.expand.kernels.cute_narrow_row_expander
)
STORES = (4, 2)  # bytes per image store of a decoded word: rows of 4k columns, or of even columns


def image_bytes(group_tiles: int) -> int:
    """Shared memory for the image: 128 rows at pitch ``4 GT + 4`` (padded; flat rows are at most ``4 GT + 3``
    bytes) plus the flat layout's up to 15 bytes of misalignment."""
    return 128 * (4 * group_tiles + 4) + CHUNK_BYTES


def record_stage_bytes(group_tiles: int, max_record_bytes: int, max_tail_bytes: int) -> int:
    return group_tiles * max_record_bytes + max_tail_bytes


class RowImageExpander:
    """The launch both row-image expanders share: one argument list (see :class:`InlineRowExpander`), the grid
    (row-block runs x column groups x routed experts) and ``THREADS`` threads a CTA; each subclass's ``kernel``
    takes the same arguments but the last two."""

    @cute.jit
    def __call__(
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
        block_runs: Int32,
        stream: cuda.CUstream,
    ):
        self.kernel(
            base_ref,
            base_delta,
            records,
            tail,
            raw,
            tail_raw,
            out,
            expert_ids,
            blocks_per_expert,
            blocks_per_group,
            row_group,
            rows_per_expert,
            cols,
            full_tiles,
            record_words,
            tail_words,
            num_experts,
            groups,
            flat,
            blocks_per_cta,
        ).launch(
            grid=(block_runs, groups, cute.size(expert_ids, mode=[0])),
            block=(THREADS, 1, 1),
            stream=stream,
        )


class InlineRowExpander(RowImageExpander):
    """The row-image expansion for ``GT`` full tiles per column group and one base-delta width.

    Arguments of the compiled function, in order (tensors compact row-major, 16-byte aligned):
    ``base_ref`` u8 [RB], ``base_delta`` u8 [RB, 16 * delta bits], ``records`` u32 [NR] (the records' bytes),
    ``tail`` u32 [NT] (tail records' bytes; any 16 bytes without a tail), ``raw`` u32 [NRAW, 128],
    ``tail_raw`` u8 [NTR], ``out`` u32 [NO] (the plane's bytes), ``expert_ids`` i32 [NE]; then int32 scalars
    ``blocks_per_expert``, ``blocks_per_group``, ``row_group``, ``rows_per_expert``, ``cols``, ``full_tiles``,
    ``record_words`` (S / 4), ``tail_words`` (S_tail / 4), ``num_experts``, ``groups``, ``flat``; the stream.
    Grid: (row blocks per expert x column groups, routed experts).
    """

    def __init__(self, group_tiles: int, delta_bits: int, max_record_bytes: int, max_tail_bytes: int, store: int):
        if group_tiles != WIDE_GROUP_TILES:  # narrow planes: NarrowRowExpander
            raise ValueError(f"the CTA-wide expander takes groups of {WIDE_GROUP_TILES} full tiles; got {group_tiles}")
        if delta_bits not in (4, 8):
            raise ValueError(f"base deltas are 4 or 8 bits wide; got {delta_bits}")
        if store not in STORES:
            raise ValueError(f"image words are stored {STORES} bytes at a time; got {store}")
        for what, n in (("record", max_record_bytes), ("tail record", max_tail_bytes)):
            if n % CHUNK_BYTES or n <= 0:
                raise ValueError(f"the largest {what} must be a positive multiple of 16 bytes; got {n}")
        # a lying header may ask for 4-bit selectors (256 bytes) in any record: the reads stay in the staging
        # buffer (garbage, never out of bounds) when the last tile's record plus 256 bytes fit it
        if max_record_bytes + max_tail_bytes < 64 * 4:
            raise ValueError("the record staging buffer cannot hold a tile's widest selectors")
        self.group_tiles = group_tiles
        self.delta_bits = delta_bits
        self.max_record_bytes = max_record_bytes
        self.max_tail_bytes = max_tail_bytes
        self.store = store

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
        gt = self.group_tiles
        db = self.delta_bits
        tid, _, _ = cute.arch.thread_idx()
        bx, grp, bz = cute.arch.block_idx()
        warp = tid >> 5
        lane = tid & 31

        smem = cutlass.memory.SmemAllocator()
        rec_words = record_stage_bytes(gt, self.max_record_bytes, self.max_tail_bytes) // 4
        s_rec = smem.allocate_tensor(Uint32, cute.make_layout((rec_words,)), byte_alignment=16)
        s_rec16 = cute.recast_tensor(s_rec, Uint16)
        s_rec8 = cute.recast_tensor(s_rec, Uint8)
        s_img32 = smem.allocate_tensor(Uint32, cute.make_layout((image_bytes(gt) // 4,)), byte_alignment=16)
        s_img16 = cute.recast_tensor(s_img32, Uint16)
        s_img8 = cute.recast_tensor(s_img32, Uint8)
        tail_word0 = gt * self.max_record_bytes // 4  # the tail record's first word in s_rec

        copy_atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Uint32, num_bits_per_copy=128
        )
        rec_chunks = cute.zipped_divide(records, (4,))
        tail_chunks = cute.zipped_divide(tail, (4,))
        s_chunks = cute.zipped_divide(s_rec, (4,))
        out8 = cute.recast_tensor(out, Uint8)
        out_chunks = cute.zipped_divide(out, (4,))
        img_chunks = cute.zipped_divide(s_img32, (4,))
        raw_rows = cute.size(raw, mode=[0])
        tail_raw_bytes = cute.size(tail_raw, mode=[0])

        e = Int32(expert_ids[bz])
        if e >= 0 and e < num_experts:  # ids outside [0, E) are graph padding: nothing to write
            # this CTA: column group grp, row blocks blk0 .. blk_end - 1 of expert e
            t0 = grp * gt
            ntiles = cutlass.max(Int32(0), cutlass.min(Int32(gt), full_tiles - t0))
            tc = cols - 4 * full_tiles
            has_tail = Int32(0)
            if tc > 0 and grp == groups - 1:
                has_tail = Int32(1)
            row_bytes = cutlass.min(Int32(4 * gt), cols - 4 * t0)  # this group's bytes of a row (padded)
            pitch = row_bytes + 4
            if flat != 0:
                pitch = cols
            chunks = ntiles * (record_words >> 2)
            tail_chunks_n = (tail_words >> 2) * has_tail
            blk0 = bx * blocks_per_cta
            blk_end = cutlass.min(blocks_per_expert, blk0 + blocks_per_cta)
            group_index = blk0 // blocks_per_group
            within = blk0 - group_index * blocks_per_group

            # stage block blk0's records (16-byte cp.async copies); later blocks are staged while the
            # previous one is copied out
            rb0 = e * blocks_per_expert + blk0
            for i in range(tid, chunks, THREADS):
                cute.copy(
                    copy_atom, rec_chunks[None, (rb0 * full_tiles + t0) * (record_words >> 2) + i], s_chunks[None, i]
                )
            for i in range(tid, tail_chunks_n, THREADS):
                cute.copy(
                    copy_atom, tail_chunks[None, rb0 * (tail_words >> 2) + i], s_chunks[None, tail_word0 // 4 + i]
                )
            cute.arch.cp_async_commit_group()

            for blk in range(blk0, blk_end):
                rb = e * blocks_per_expert + blk
                row0 = e * rows_per_expert + group_index * row_group + within * 128
                valid = cutlass.min(Int32(128), row_group - within * 128)
                mis = Int32(0)
                if flat != 0:
                    mis = (row0 * cols) & 15

                # lane g owns quad g of every tile: its four rows' bases (byte-replicated) and image
                # offsets (slot 4 g + k -> row 64 half + 16 warp + quad + 8 pair, format section 5)
                ref = Int32(base_ref[rb])
                if cutlass.const_expr(db == 4):
                    deltas = Uint32(cute.recast_tensor(base_delta, Uint16)[rb, lane])
                else:
                    deltas = Uint32(cute.recast_tensor(base_delta, Uint32)[rb, lane])
                bases = []
                offsets = []
                live = []
                for k in cutlass.range_constexpr(4):
                    r = slot_to_row(4 * lane + k)
                    bases.append(Uint32((ref + Int32((deltas >> (db * k)) & ((1 << db) - 1))) & 0xFF) * 0x01010101)
                    offsets.append(mis + r * pitch)
                    live.append(r < valid)
                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_threads()  # records landed; the previous block's image is copied out

                # 2. selectors and raw tiles -> image, then the tile's exceptions (warp-synchronous)
                for t in range(warp, ntiles, 4):
                    rec0 = t * record_words
                    h = Uint32(s_rec[rec0 + record_words - 1])
                    mode = header_mode(h)
                    # the origin (int8, header bits 8-15) replicated into four bytes; real rows never
                    # carry across bytes (the window stays inside the byte range)
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
                    elif mode == 0:  # 1-bit fields: a quad's 16 in one u16; 4 bits -> 4 bytes by one multiply
                        sel = Uint32(s_rec16[2 * rec0 + lane])
                        w0, w1, w2, w3 = quad_words(
                            bases, ow, [((sel >> (4 * k)) & 0xF) * 0x00204081 & 0x01010101 for k in range(4)]
                        )
                    elif mode == 1:  # 2-bit fields: one u32
                        sel = Uint32(s_rec[rec0 + lane])
                        w0, w1, w2, w3 = quad_words(
                            bases, ow, [spread_fields((sel >> (8 * k)) & 0xFF, 2) for k in range(4)]
                        )
                    else:  # 4-bit fields: two u32
                        lo = Uint32(s_rec[rec0 + 2 * lane])
                        hi = Uint32(s_rec[rec0 + 2 * lane + 1])
                        halves = (lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16)
                        w0, w1, w2, w3 = quad_words(bases, ow, [spread_fields(x, 4) for x in halves])
                    res = [w0, w1, w2, w3]
                    for k in cutlass.range_constexpr(4):
                        if live[k]:
                            off = offsets[k] + 4 * t
                            if cutlass.const_expr(self.store == 4):
                                s_img32[off >> 2] = res[k]
                            else:
                                s_img16[off >> 1] = Uint16(res[k] & 0xFFFF)
                                s_img16[(off >> 1) + 1] = Uint16(res[k] >> 16)
                    count = header_count(h)
                    if mode != 3 and count > 0:
                        sel_bytes = 64 << mode
                        cap = exception_capacity(4 * record_words, sel_bytes)
                        cute.arch.sync_warp()  # the words above are stored before lanes patch their bytes
                        for j in range(lane, cutlass.min(count, cap), 32):
                            pos = Int32(s_rec16[2 * rec0 + (sel_bytes >> 1) + j])
                            slot = pos >> 2
                            r = slot_to_row(slot)
                            if pos < 512 and r < valid:
                                val = s_rec8[4 * rec0 + sel_bytes + 2 * cap + j]
                                s_img8[mis + r * pitch + 4 * t + (pos & 3)] = val

                if has_tail != 0:
                    # one slot per thread, position p = slot * tc + col: its tc fields are tc * w
                    # consecutive bits, read through a 64-bit window of two record words
                    slot = tid
                    r = slot_to_row(slot)
                    h = Uint32(s_rec[tail_word0 + tail_words - 1])
                    mode = header_mode(h)
                    if r < valid:
                        if cutlass.const_expr(db == 4):
                            delta = (Int32(base_delta[rb, slot >> 1]) >> (4 * (slot & 1))) & 15
                        else:
                            delta = Int32(base_delta[rb, slot])
                        base = ref + delta + (selector_origin(h))
                        width = Int32(1) << mode
                        fits = 4 * tail_words >= 16 * tc * width + HEADER_BYTES
                        bit = slot * tc * width
                        lo = Uint64(s_rec[tail_word0 + (bit >> 5)])
                        hi = Uint64(s_rec[tail_word0 + (bit >> 5) + 1])
                        window = ((hi << 32) | lo) >> Uint64(bit & 31)
                        idx = header_raw_index(h)
                        raw_ok = idx < tail_raw_bytes // (128 * tc)  # the index, not its byte offset, which may wrap
                        for c in cutlass.range_constexpr(3):
                            if c < tc:
                                val = Int32(0)
                                if mode == 3:
                                    if raw_ok:
                                        val = Int32(tail_raw[idx * (128 * tc) + slot * tc + c])
                                elif fits:
                                    field = Int32((window >> Uint64(c * width)) & Uint64((1 << width) - 1))
                                    val = (base + field) & 0xFF
                                s_img8[mis + r * pitch + 4 * ntiles + c] = Uint8(val)
                    cute.arch.sync_threads()
                    if warp == 0:
                        if mode != 3:
                            sel_bytes = 16 * tc * (Int32(1) << mode)
                            cap = exception_capacity(4 * tail_words, sel_bytes)
                            for j in range(lane, cutlass.min(header_count(h), cap), 32):
                                pos = Int32(s_rec16[2 * tail_word0 + (sel_bytes >> 1) + j])
                                if pos < 128 * tc:
                                    slot = pos // tc
                                    r = slot_to_row(slot)
                                    if r < valid:
                                        val = s_rec8[4 * tail_word0 + sel_bytes + 2 * cap + j]
                                        s_img8[mis + r * pitch + 4 * ntiles + pos - slot * tc] = val
                cute.arch.sync_threads()  # the image is complete; the record buffer is free

                # stage the next block's records while this one is copied out
                if blk + 1 < blk_end:
                    nrb = rb + 1
                    for i in range(tid, chunks, THREADS):
                        cute.copy(
                            copy_atom,
                            rec_chunks[None, (nrb * full_tiles + t0) * (record_words >> 2) + i],
                            s_chunks[None, i],
                        )
                    for i in range(tid, tail_chunks_n, THREADS):
                        cute.copy(
                            copy_atom,
                            tail_chunks[None, nrb * (tail_words >> 2) + i],
                            s_chunks[None, tail_word0 // 4 + i],
                        )
                    cute.arch.cp_async_commit_group()

                # 4. copy out, 16 bytes per thread and step
                if flat != 0:
                    n = valid * cols
                    chunk0 = (row0 * cols - mis) >> 4
                    for i in range(tid, (mis + n + 15) >> 4, THREADS):
                        lo16 = i * 16
                        if lo16 >= mis and lo16 + 16 <= mis + n:
                            frag = cute.make_rmem_tensor((4,), Uint32)
                            cute.autovec_copy(img_chunks[None, i], frag)
                            cute.autovec_copy(frag, out_chunks[None, chunk0 + i])
                        else:
                            for b in cutlass.range_constexpr(16):
                                if lo16 + b >= mis and lo16 + b < mis + n:
                                    out8[(chunk0 + i) * 16 + b] = s_img8[lo16 + b]
                else:
                    # thread -> (row r0 + k rstep, chunk j of the row)
                    per_row = row_bytes >> 4
                    rstep = THREADS // per_row
                    r0 = tid // per_row
                    j = tid - r0 * per_row
                    if r0 < rstep:
                        first = ((row0 + r0) * cols + 4 * t0 + 16 * j) >> 4
                        for r in range(r0, valid, rstep):
                            src = (r * pitch + 16 * j) >> 2
                            frag = cute.make_rmem_tensor((4,), Uint32)
                            for c in cutlass.range_constexpr(4):
                                frag[c] = s_img32[src + c]
                            cute.autovec_copy(frag, out_chunks[None, first + ((r - r0) * cols >> 4)])

                within = within + 1
                if within == blocks_per_group:
                    within = Int32(0)
                    group_index = group_index + 1
