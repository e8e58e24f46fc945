"""CuTe DSL: the row-block expansion of one plane shape, 128-row blocks imaged in shared memory (build time only:
imports cutlass).

The row-image expanders (``cute_row_expander``, ``cute_narrow_row_expander``) take the column count, tile count and
image pitch at run time, which makes them issue-bound: loops of run-time length, live-row predicates, 16-bit image
stores and per-block address arithmetic fill their instruction stream. Here the plane's column count is compile-time
(the catalog builds one program per plane shape), so a warp's walk over its tiles is unrolled four tiles at a time,
every image offset is a constant plus the lane's row offset, rows of 16-byte multiple width are imaged with one
16-byte store per row and four tiles, and rows past the row group are imaged like any other (never copied out)
instead of being predicated away.

Two forms, by the plane's shape (:func:`~csf_kernels.expand.specs.row_block_group_tiles`):

* whole rows (at most 8 full tiles and a tail, or wider rows no group size divides; DS4.1-TP4's W2): one warp
  per row block, with its own image; no CTA barrier;
* column groups (rows wider than 8 tiles; W13's 160 columns: five groups of 8 tiles; gpt-oss's 90: two of 11, the
  second with the tail): one warp per group, the CTA's warps imaging the block's whole rows together so the copy-out
  stores whole 128-byte lines (per-warp 32-byte row segments keep the L2 busy: ``docs/perf-notes.md``, "One warp per
  row block where a block's rows fit its image"), with a CTA barrier before and after each image. Splitting rows
  that are not 16-byte multiples halves the serial decode a warp does per block, which bounds a few-expert
  expansion's latency.

For each block a warp stages its records, tail record and base deltas into its own shared-memory region
(``cp.async``), decodes the full tiles four at a time (lane ``g`` owns quad ``g``, format section 5), patches
the four tiles' exceptions with eight lanes per tile, decodes the tail tile (lane ``g`` owns slots
``4 g .. 4 g + 3``) and copies the image out in 16-byte chunks. Every global round trip of the next block is
issued ahead of its use: its expert id an item earlier, its reference byte during this block's decode, its
records a whole item ahead where two items' fit the staging region (else during the copy-out); divisions are
multiplications by host-computed multipliers.

Headers are trusted only as far as the codec validates them: no field makes the kernel read or write outside
its buffers (selectors a record cannot hold read garbage inside the staging region, raw indices past the raw
array decode as zeros, exception positions past the tile and entry counts past the record's capacity are
skipped); garbage in, garbage bytes out, never an out-of-bounds access.

Dependent launches (``pdl``, a run-time argument): 0 launches plainly; 1 and 2 launch as a programmatic dependent
launch, which lets the program start while its stream's previous kernel finishes, and let the next kernel start
as soon as every CTA has begun. 1 waits for the previous kernel (``griddepcontrol.wait``) before it reads anything:
safe after any kernel. 2 waits only before it exits, so it runs beside its predecessor: only for a predecessor
launched with 1 whose work it neither reads nor writes (that predecessor started its dependents after its own
wait, so everything before it has completed). A kernel waiting for a 2 then also waits for the 1 before it.
Plus 4: the next kernel is let in only as this one's CTAs finish their work, not as they start.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint16, Uint32, Uint64
from cutlass.cute.nvgpu import cpasync

from csf_codec.tile_layout import slot_to_row
from csf_kernels.expand.specs import ROW_BLOCK_MAX_COLS as MAX_COLS
from csf_kernels.expand.specs import row_block_covers, row_block_group_tiles, row_block_groups, row_block_warps
from csf_kernels.record.cute import (
    CHUNK_BYTES,
    HEADER_BYTES,
    header_count,
    header_mode,
    header_raw_index,
    quad_words,
    selector_origin,
    selector_origin_word,
    spread_fields,
)

__all__ = ["MAX_COLS", "RowBlockExpander"]
_DELTA_ROW = 128  # staging bytes of a block's base-delta row (16 * delta bits <= 128); a region holds two
_COPY_UNROLL = 4  # 16-byte chunks a lane has in flight while copying the image out


@cute.jit
def _divide(x, magic):
    """``x // d`` for 0 <= x < 2**15 without a division, given ``magic`` = ceil(2**31 / d), or 0 for d = 1 (the
    host's :func:`csf_kernels.expand.launch.division_magic`)."""
    q = Int32((Int64(x) * Int64(magic)) >> 31)
    if magic == 0:
        q = x
    return q


@cute.jit
def _capacity(caps, mode):
    """Mode ``mode``'s exception capacity from the host's packed capacities (:func:`csf_kernels.expand.launch.
    exception_caps`: a byte per mode, raw tiles' 0)."""
    return Int32(Uint32(caps) >> Uint32(mode << 3)) & 0xFF


class RowBlockExpander:
    """Expansion of planes of ``cols`` scale columns (even, at most :data:`MAX_COLS`:
    :func:`~csf_kernels.expand.specs.row_block_covers`), one warp per item: a
    128-row block's column group of ``group_tiles`` full tiles (whole rows, tail included, unless
    :func:`~csf_kernels.expand.specs.row_block_group_tiles` splits them).

    Arguments of the compiled function, in order (tensors compact row-major, 16-byte aligned): ``base_ref`` u8
    [RB], ``base_delta`` u8 [RB, 16 * delta bits], ``records`` u32 [NR], ``tail`` u32 [NT] (any 16 bytes without
    a tail), ``raw`` u32 [NRAW, 128], ``tail_raw`` u8 [NTR], ``out`` u32 [NO] (the plane's bytes), ``expert_ids``
    i32 [NE]; then int32 scalars ``blocks_per_expert``, ``blocks_per_group``, ``row_group``, ``rows_per_expert``,
    ``record_words`` (S / 4), ``tail_words`` (S_tail / 4), ``bpe_magic`` and ``bpg_magic`` (the multipliers that
    divide by blocks per expert and per group), ``num_experts``, ``ctas``, ``pdl`` (above); the stream. Grid: (ctas).
    """

    def __init__(self, cols: int, delta_bits: int, max_record_bytes: int, max_tail_bytes: int):
        if not row_block_covers(cols, 16):
            raise ValueError(f"the row-block expander takes an even column count up to {MAX_COLS} (past 160: rows "
                             f"that split into column groups); got {cols}")  # fmt: skip
        if delta_bits not in (4, 8):
            raise ValueError(f"base deltas are 4 or 8 bits wide; got {delta_bits}")
        for what, n in (("record", max_record_bytes), ("tail record", max_tail_bytes)):
            if n % CHUNK_BYTES or n <= 0:
                raise ValueError(f"the largest {what} must be a positive multiple of 16 bytes; got {n}")
        # a lying header may ask for 4-bit selectors (256 bytes) in the last tile's record: the reads stay in
        # the staging region (garbage, never out of bounds) when the region holds 256 bytes past that record
        if max_tail_bytes > 32 * CHUNK_BYTES:  # the tail record's chunks are staged one per lane
            raise ValueError(f"a tail record of {max_tail_bytes} bytes exceeds a warp's 32 staging copies")
        if max_record_bytes + _DELTA_ROW < 64 * 4:
            raise ValueError("the record staging region cannot hold a tile's widest selectors")
        self.cols = cols
        self.full = cols // 4
        self.delta_bits = delta_bits
        self.max_record_bytes = max_record_bytes
        self.max_tail_bytes = max_tail_bytes
        self.group_tiles = row_block_group_tiles(cols)
        self.groups = row_block_groups(cols)
        # column groups: a CTA of one warp per group images whole rows together (whole-line stores)
        self.shared = self.groups > 1
        self.pitch = cols  # image bytes per row
        self.warps = row_block_warps(cols)

    def region_bytes(self) -> tuple[int, int]:
        """(staging bytes, image bytes) of one warp's shared-memory region; both multiples of 16."""
        tail = self.max_tail_bytes if self.cols % 4 else 0
        stage = self.group_tiles * self.max_record_bytes + tail + 2 * _DELTA_ROW
        image = -(-(128 * self.pitch + CHUNK_BYTES) // CHUNK_BYTES) * CHUNK_BYTES  # + a flat image's misalignment
        return stage, image

    def resident_ctas(self) -> int:
        """CTAs per SM the registers are budgeted for: 32 warps (at most 64 registers a thread) for a warp per
        block; for a CTA per block, as many as its shared memory allows up to 35 warps (the CTA's warps wait on
        each other at its barriers: more of them hide the latency)."""
        if not self.shared:
            return 32 // self.warps
        return min(35 // self.warps, (227 * 1024) // (self.shared_bytes() + 1024))

    def shared_bytes(self) -> int:
        stage, image = self.region_bytes()
        return self.warps * stage + (image if self.shared else self.warps * image)

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
        record_words: Int32,
        tail_words: Int32,
        bpe_magic: Int32,
        bpg_magic: Int32,
        exception_caps: Int32,
        tail_exception_caps: Int32,
        num_experts: Int32,
        ctas: Int32,
        pdl: Int32,
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
            record_words,
            tail_words,
            bpe_magic,
            bpg_magic,
            exception_caps,
            tail_exception_caps,
            num_experts,
            ctas,
            pdl,
        ).launch(
            grid=(ctas, 1, 1),
            block=(32 * self.warps, 1, 1),
            stream=stream,
            use_pdl=cutlass.min(pdl, Int32(1)),
            min_blocks_per_mp=self.resident_ctas(),
            preferred_smem_carveout=100,
        )

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
        record_words: Int32,
        tail_words: Int32,
        bpe_magic: Int32,
        bpg_magic: Int32,
        exception_caps: Int32,
        tail_exception_caps: Int32,
        num_experts: Int32,
        ctas: Int32,
        pdl: Int32,
    ):
        if pdl & 3 == 1:
            cute.arch.griddepcontrol_wait()  # before the expert ids and the plane are touched
        if pdl < 4:
            cute.arch.griddepcontrol_launch_dependents()  # a no-op in a plain launch
        cols = self.cols
        tc = cols % 4
        db = self.delta_bits
        gt = self.group_tiles
        pitch = self.pitch
        vec = cols % 16 == 0  # rows imaged 16 bytes (four tiles) per store, the image 16-byte aligned
        tid, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        warp = tid >> 5
        lane = tid & 31

        stage_bytes, image_bytes = self.region_bytes()
        smem = cutlass.memory.SmemAllocator()
        s_rec = smem.allocate_tensor(Uint32, cute.make_layout((self.warps * stage_bytes // 4,)), byte_alignment=16)
        s_rec16 = cute.recast_tensor(s_rec, Uint16)
        s_rec8 = cute.recast_tensor(s_rec, Uint8)
        images = 1 if self.shared else self.warps
        s_img32 = smem.allocate_tensor(Uint32, cute.make_layout((images * image_bytes // 4,)), byte_alignment=16)
        s_img16 = cute.recast_tensor(s_img32, Uint16)
        s_img8 = cute.recast_tensor(s_img32, Uint8)
        # this warp's staging region (words): records, tail record, two base-delta rows. Records and tail
        # records of at most half the largest size (DS4.1's: 96 and 48 of 192 and 176 bytes) leave room for a
        # second item's, which is then fetched a whole item ahead (a wait for records fetched during the
        # copy-out is the warps' top stall; ``docs/perf-notes.md``, "A block's global loads are issued an item
        # ahead"); larger ones are fetched during the copy-out.
        rw0 = warp * (stage_bytes // 4)
        tail_w0 = rw0 + gt * self.max_record_bytes // 4
        delta_w0 = rw0 + (stage_bytes - 2 * _DELTA_ROW) // 4
        fits_two = 8 * record_words <= self.max_record_bytes
        if cutlass.const_expr(tc > 0):
            fits_two = fits_two & (8 * tail_words <= self.max_tail_bytes)
        second = Int32(0)  # words from the first item's staging to the second's: records (tail, delta: scaled)
        if fits_two:
            second = gt * record_words
        double = second > 0
        par = Int32(0)  # the staging the item's records are in (0, 1)
        ib0 = warp * image_bytes  # this warp's image (bytes)
        colb = 0  # the image column of the warp's group (shared images)
        if cutlass.const_expr(self.shared):
            ib0 = 0
            colb = 4 * gt * warp

        copy_atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Uint32, num_bits_per_copy=128
        )
        sources = (
            cute.zipped_divide(records, (4,)),
            cute.zipped_divide(tail, (4,)),
            cute.zipped_divide(
                cute.make_tensor(
                    cute.recast_tensor(base_delta, Uint32).iterator,
                    cute.make_layout(cute.size(base_delta) // 4),
                ),
                (4,),
            ),
        )
        s_chunks = cute.zipped_divide(s_rec, (4,))
        out8 = cute.recast_tensor(out, Uint8)
        out_chunks = cute.zipped_divide(out, (4,))
        img_chunks = cute.zipped_divide(s_img32, (4,))
        raw_rows = cute.size(raw, mode=[0])
        tail_raw_bytes = cute.size(tail_raw, mode=[0])
        items = cute.size(expert_ids, mode=[0]) * blocks_per_expert  # row blocks of the routed experts
        step = ctas * (1 if self.shared else self.warps)
        rec_n = gt * (record_words >> 2)  # 16-byte chunks of a group's full-tile records
        tail_n = Int32(0)
        if cutlass.const_expr(tc > 0):
            tail_n = tail_words >> 2
        counts = (rec_n, tail_n)
        quad_rows = [slot_to_row(4 * lane + k) for k in range(4)]

        # a warp's items: (routed expert slot, row block, column group). Each global round trip is issued a
        # stage before its first use (the kernel is bound by each item's dependent expert id -> reference byte
        # -> records loads, not by DRAM; ``docs/perf-notes.md``, "A block's global loads are issued an item
        # ahead"): the expert id of the item after next is loaded while this item is decoded, the next item's
        # reference byte and records while this one is copied out. An id outside [0, E) is graph padding:
        # nothing read or written.
        item = bx * self.warps + warp
        g = Int32(0)  # the warp's column group
        if cutlass.const_expr(self.shared):
            item = bx
            g = warp
        e, blk = self.locate(item, items, expert_ids, blocks_per_expert, bpe_magic)
        ne, nblk = self.locate(item + step, items, expert_ids, blocks_per_expert, bpe_magic)
        ref = self.reference(e, blk, base_ref, blocks_per_expert, num_experts)
        if e >= 0 and e < num_experts:
            self.stage(
                copy_atom,
                sources,
                s_chunks,
                e * blocks_per_expert + blk,
                g,
                counts,
                self.staging(rw0, tail_w0, delta_w0, 0, second, tail_words),
                lane,
            )
        while item < items:
            nxt = item + step
            nne, nnblk = self.locate(nxt + step, items, expert_ids, blocks_per_expert, bpe_magic)
            nref = self.reference(ne, nblk, base_ref, blocks_per_expert, num_experts)
            if double:
                if ne >= 0 and ne < num_experts:
                    self.stage(
                        copy_atom,
                        sources,
                        s_chunks,
                        ne * blocks_per_expert + nblk,
                        g,
                        counts,
                        self.staging(rw0, tail_w0, delta_w0, 1 - par, second, tail_words),
                        lane,
                    )
                else:
                    cute.arch.cp_async_commit_group()  # an empty group: the wait below still leaves one pending
                cute.arch.cp_async_wait_group(1)
            else:
                cute.arch.cp_async_wait_group(0)
            cute.arch.sync_warp()  # the item's records landed; the previous image is copied out
            rb0, tb0, db0 = self.staging(rw0, tail_w0, delta_w0, par, second, tail_words)
            if e >= 0 and e < num_experts:
                if cutlass.const_expr(self.shared):
                    cute.arch.barrier()  # every warp has copied the previous image out
                group_index = _divide(blk, bpg_magic)
                within = blk - group_index * blocks_per_group
                row0 = e * rows_per_expert + group_index * row_group + within * 128
                valid = cutlass.min(Int32(128), row_group - within * 128)
                mis = Int32(0)
                if cutlass.const_expr(not vec):
                    mis = (row0 * cols) & 15
                img0 = ib0 + mis  # image byte of the block's first row
                if cutlass.const_expr(db == 4):
                    deltas = Uint32(s_rec16[2 * db0 + lane])
                else:
                    deltas = Uint32(s_rec[db0 + lane])
                bases = [
                    Uint32((ref + Int32((deltas >> (db * k)) & ((1 << db) - 1))) & 0xFF) * 0x01010101 for k in range(4)
                ]
                row_at = [img0 + colb + quad_rows[k] * pitch for k in range(4)]  # image byte of the quad's rows

                # full tiles, four at a time: decode, image, then (after a warp barrier) their exceptions
                for s in range(gt // 4):
                    rec0 = rb0 + 4 * s * record_words
                    words = []
                    for u in cutlass.range_constexpr(4):
                        words.append(
                            self.decode_tile(
                                rec0 + u * record_words, record_words, bases, raw, raw_rows, s_rec, s_rec16, lane
                            )
                        )
                    for k in cutlass.range_constexpr(4):
                        if cutlass.const_expr(vec):
                            frag = cute.make_rmem_tensor((4,), Uint32)
                            for u in cutlass.range_constexpr(4):
                                frag[u] = words[u][k]
                            cute.autovec_copy(frag, img_chunks[None, (row_at[k] >> 4) + s])
                        else:
                            for u in cutlass.range_constexpr(4):
                                self.image_word(s_img32, s_img16, row_at[k] + 16 * s + 4 * u, words[u][k])
                    cute.arch.sync_warp()  # every word is imaged before lanes patch their bytes
                    self.patch_tiles(
                        4, rec0, record_words, colb + 16 * s, exception_caps, s_rec, s_rec16, s_rec8, s_img8, img0, lane
                    )
                if cutlass.const_expr(gt % 4 > 0):
                    t0 = gt - gt % 4
                    for u in cutlass.range_constexpr(gt % 4):
                        w = self.decode_tile(
                            rb0 + (t0 + u) * record_words, record_words, bases, raw, raw_rows, s_rec, s_rec16, lane
                        )
                        for k in cutlass.range_constexpr(4):
                            self.image_word(s_img32, s_img16, row_at[k] + 4 * (t0 + u), w[k])
                    cute.arch.sync_warp()
                    self.patch_tiles(
                        gt % 4,
                        rb0 + t0 * record_words,
                        record_words,
                        colb + 4 * t0,
                        exception_caps,
                        s_rec,
                        s_rec16,
                        s_rec8,
                        s_img8,
                        img0,
                        lane,
                    )
                if cutlass.const_expr(tc > 0):
                    if self.owns_tail(g):
                        self.tail_tile(
                            tb0,
                            tail_words,
                            tail_exception_caps,
                            bases,
                            tail_raw,
                            tail_raw_bytes,
                            s_rec,
                            s_rec16,
                            s_rec8,
                            s_img8,
                            img0,
                            lane,
                        )
                cute.arch.sync_warp()  # the image is complete; the staging region is free
                if cutlass.const_expr(self.shared):
                    cute.arch.barrier()  # every group's columns are imaged

                if not double and ne >= 0 and ne < num_experts:  # fetch the next item during the copy-out
                    self.stage(
                        copy_atom, sources, s_chunks, ne * blocks_per_expert + nblk, g, counts, (rb0, tb0, db0), lane
                    )
                if cutlass.const_expr(self.shared):
                    self.copy_out(img_chunks, out_chunks, s_img8, out8, ib0, row0, valid, mis, tid, 32 * self.warps)
                else:
                    self.copy_out(img_chunks, out_chunks, s_img8, out8, ib0, row0, valid, mis, lane, 32)
            elif not double and ne >= 0 and ne < num_experts:
                self.stage(
                    copy_atom, sources, s_chunks, ne * blocks_per_expert + nblk, g, counts, (rb0, tb0, db0), lane
                )
            if double:
                par = 1 - par
            item = nxt
            e = ne
            blk = nblk
            ref = nref
            ne = nne
            nblk = nnblk
        if pdl >= 4:
            cute.arch.griddepcontrol_launch_dependents()
        if pdl & 3 == 2:
            cute.arch.griddepcontrol_wait()  # so that this grid completes after its predecessor

    @cute.jit
    def staging(self, rw0, tail_w0, delta_w0, par, second, tail_words):
        """(records, tail record, delta row) staging words of staging ``par`` (0, 1; 1 only where the region
        holds two items', ``second`` words apart)."""
        return rw0 + par * second, tail_w0 + par * tail_words, delta_w0 + par * (_DELTA_ROW // 4)

    @cute.jit
    def locate(self, item, items, expert_ids, blocks_per_expert, bpe_magic):
        """(expert id, row block) of an item; id -1 past the last item."""
        e = Int32(-1)
        blk = Int32(0)
        if item < items:
            z = _divide(item, bpe_magic)
            blk = item - z * blocks_per_expert
            e = Int32(expert_ids[z])
        return e, blk

    @cute.jit
    def reference(self, e, blk, base_ref, blocks_per_expert, num_experts):
        """The reference byte of expert ``e``'s row block ``blk`` (0 for padding ids)."""
        ref = Int32(0)
        if e >= 0 and e < num_experts:
            ref = Int32(base_ref[e * blocks_per_expert + blk])
        return ref

    @cute.jit
    def copy_out(self, img_chunks, out_chunks, s_img8, out8, ib0, row0, valid, mis, thread, threads: int):
        """The image's rows to the plane in 16-byte chunks by ``threads`` threads (a warp, or a CTA sharing the
        image): the rows are one contiguous run of the plane, whole sectors; a run that does not start or end on
        a 16-byte boundary (``mis``, planes outside the catalog) has its partial chunks written bytewise."""
        cols = self.cols
        n = valid * cols
        chunk0 = (row0 * cols - mis) >> 4
        if mis == 0 and (n & 15) == 0:  # a run of whole chunks (every catalog plane)
            for v in cutlass.range_constexpr(-(-128 * cols // (16 * threads))):
                i = thread + threads * v
                if i < n >> 4:
                    self.copy_chunk(img_chunks, out_chunks, (ib0 >> 4) + i, chunk0 + i)
        else:
            lo = (mis + 15) >> 4  # whole chunks lo .. hi - 1
            hi = (mis + n) >> 4
            for i0 in range(lo + thread, hi, threads * _COPY_UNROLL):
                for v in cutlass.range_constexpr(_COPY_UNROLL):
                    i = i0 + threads * v
                    if i < hi:
                        self.copy_chunk(img_chunks, out_chunks, (ib0 >> 4) + i, chunk0 + i)
            # partial chunks: threads 0-15 the first chunk's bytes, 16-31 the last's
            if thread < 32:
                i = Int32(0)
                if thread >= 16:
                    i = hi
                b = 16 * i + (thread & 15)
                if b >= mis and b < mis + n:
                    out8[chunk0 * 16 + b] = s_img8[ib0 + b]

    def owns_tail(self, g):
        """Whether column group ``g`` stages and decodes the plane's tail tile: the last group (or a block's only
        warp)."""
        return g == self.groups - 1

    @cute.jit
    def stage(self, copy_atom, sources, s_chunks, rb, g, counts, buffer, lane):
        """Queue the 16-byte copies of row block ``rb``'s column group ``g``: its full-tile records (a pass over
        the lanes), the tail record (planes with a tail: the last group; the low lanes) and the base deltas (the top
        lanes), each a predicated copy rather than a branch per lane (a three-way branch per lane costs more warp
        instructions a block)."""
        records, tail, deltas = sources
        rec_n, tail_n = counts
        rw0, tail_w0, delta_w0 = buffer
        src = (rb * self.full + g * self.group_tiles) * (rec_n // self.group_tiles)
        for i in cutlass.range(lane, rec_n, 32, unroll=1):  # one or two chunks a lane: no unrolled remainder
            cute.copy(copy_atom, records[None, src + i], s_chunks[None, rw0 // 4 + i])
        if cutlass.const_expr(self.cols % 4 > 0):
            if lane < tail_n and self.owns_tail(g):
                cute.copy(copy_atom, tail[None, rb * tail_n + lane], s_chunks[None, tail_w0 // 4 + lane])
        j = lane - (32 - self.delta_bits)
        if j >= 0:
            cute.copy(copy_atom, deltas[None, rb * self.delta_bits + j], s_chunks[None, delta_w0 // 4 + j])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def copy_chunk(self, img_chunks, out_chunks, src, dst):
        frag = cute.make_rmem_tensor((4,), Uint32)
        cute.autovec_copy(img_chunks[None, src], frag)
        cute.autovec_copy(frag, out_chunks[None, dst])

    @cute.jit
    def decode_tile(self, rec0, record_words, bases, raw, raw_rows, s_rec, s_rec16, lane):
        """The quad's four words of the full tile whose record starts at staging word ``rec0`` (its exceptions
        are :meth:`patch_tiles`'s)."""
        h = Uint32(s_rec[rec0 + record_words - 1])
        mode = header_mode(h)
        ow = selector_origin_word(h)
        w0 = Uint32(0)
        w1 = Uint32(0)
        w2 = Uint32(0)
        w3 = Uint32(0)
        # the common modes' selector words are loaded with the header, not after it: no dependent load latency
        sel1 = Uint32(s_rec16[2 * rec0 + lane])
        sel2 = Uint32(s_rec[rec0 + lane])
        if mode == 0:
            w0, w1, w2, w3 = quad_words(
                bases, ow, [((sel1 >> (4 * k)) & 0xF) * 0x00204081 & 0x01010101 for k in range(4)]
            )
        elif mode == 1:
            sel = sel2
            w0, w1, w2, w3 = quad_words(bases, ow, [spread_fields((sel >> (8 * k)) & 0xFF, 2) for k in range(4)])
        elif mode == 2:
            lo = Uint32(s_rec[rec0 + 2 * lane])
            hi = Uint32(s_rec[rec0 + 2 * lane + 1])
            halves = (lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16)
            w0, w1, w2, w3 = quad_words(bases, ow, [spread_fields(x, 4) for x in halves])
        else:
            idx = header_raw_index(h)
            if idx < raw_rows:
                frag = cute.make_rmem_tensor((4,), Uint32)
                cute.autovec_copy(cute.zipped_divide(raw[idx, None], (4,))[None, lane], frag)
                w0 = frag[0]
                w1 = frag[1]
                w2 = frag[2]
                w3 = frag[3]
        return [w0, w1, w2, w3]

    @cute.jit
    def image_word(self, s_img32, s_img16, at, word):
        """One decoded word at image byte ``at`` (4-byte aligned for rows of 4k columns, else 2-byte)."""
        if cutlass.const_expr(self.cols % 4 == 0):
            s_img32[at >> 2] = word
        else:
            s_img16[at >> 1] = Uint16(word & 0xFFFF)
            s_img16[(at >> 1) + 1] = Uint16(word >> 16)

    @cute.jit
    def patch_tiles(self, tiles: int, rec0, record_words, col0, caps, s_rec, s_rec16, s_rec8, s_img8, img0, lane):
        """Overwrite the exception bytes of ``tiles`` (at most 4) consecutive full tiles, records from staging word
        ``rec0``, columns from ``col0``: lanes 8 u .. 8 u + 7 take tile u's entries, eight at a time, each lane
        reading the tile's header itself. ``caps`` packs each mode's exception capacity in a byte (host's
        :func:`csf_kernels.expand.launch.exception_caps`; raw tiles' byte 0), which also places the values after the
        positions. Every position and value read lies inside the record whatever the header says."""
        u = lane >> 3
        active = u < tiles
        if cutlass.const_expr(tiles == 4):
            active = True
        if active:
            rec = rec0 + u * record_words
            h = Uint32(s_rec[rec + record_words - 1])
            mode = header_mode(h)
            cap = _capacity(caps, mode)
            sel_bytes = Int32(64) << mode
            pos0 = 2 * rec + (sel_bytes >> 1)
            val0 = 4 * rec + sel_bytes + 2 * cap
            for j in range(lane & 7, cutlass.min(header_count(h), cap), 8):
                pos = Int32(s_rec16[pos0 + j])
                if pos < 512:
                    s_img8[img0 + slot_to_row(pos >> 2) * self.pitch + col0 + 4 * u + (pos & 3)] = s_rec8[val0 + j]

    @cute.jit
    def tail_pairs(self, tail_w0, h, quad_bases, fits, s_rec, s_img8, img0, lane):
        """The two tail columns of lane g's slots 4 g .. 4 g + 3 (selector modes), a 16-bit image store per row:
        the four slots' fields are 8 w bits at byte w g of the record, one aligned word shifted; a slot's pair
        is its row's base word plus the origin (as the full tiles' words) plus the two fields, low half."""
        mode = header_mode(h)
        width = Int32(1) << mode
        fmask = (Int32(1) << width) - 1
        byte = lane << mode
        x = Uint32(s_rec[tail_w0 + (byte >> 2)]) >> Uint32((byte & 3) * 8)
        ow = selector_origin_word(h)
        s_img16 = cute.recast_tensor(s_img8, Uint16)
        for s in cutlass.range_constexpr(4):
            fs = Int32(x >> Uint32(width * (2 * s)))
            pair = Uint32(0)
            if fits:
                pair = quad_bases[s] + ow + Uint32((fs & fmask) | ((fs >> width) & fmask) << 8)
            s_img16[(img0 + slot_to_row(4 * lane + s) * self.cols + self.cols - 2) >> 1] = Uint16(pair & 0xFFFF)

    @cute.jit
    def tail_tile(
        self,
        tail_w0,
        tail_words,
        caps,
        quad_bases,
        tail_raw,
        tail_raw_bytes,
        s_rec,
        s_rec16,
        s_rec8,
        s_img8,
        img0,
        lane,
    ):
        """The tail tile's ``cols % 4`` columns: lane g decodes slots 4 g .. 4 g + 3 (a slot's tc fields are
        tc * w consecutive bits, read through a 64-bit window of two record words; two columns:
        :meth:`tail_pairs`), raw tail tiles are copied, then the exceptions (``caps``: the tail record's
        capacities per mode, packed as :meth:`patch_tiles` takes them)."""
        cols = self.cols
        tc = cols % 4
        col0 = cols - tc
        h = Uint32(s_rec[tail_w0 + tail_words - 1])
        mode = header_mode(h)
        width = Int32(1) << mode
        if mode == 3:
            idx = header_raw_index(h)
            raw_ok = idx < tail_raw_bytes // (128 * tc)  # the index, not its byte offset (which may wrap)
            for s in cutlass.range_constexpr(4):
                slot = 4 * lane + s
                for c in cutlass.range_constexpr(tc):
                    val = Uint8(0)
                    if raw_ok:
                        val = tail_raw[idx * (128 * tc) + slot * tc + c]
                    s_img8[img0 + slot_to_row(slot) * cols + col0 + c] = val
        else:
            fits = 4 * tail_words >= 16 * tc * width + HEADER_BYTES
            if cutlass.const_expr(tc == 2):
                self.tail_pairs(tail_w0, h, quad_bases, fits, s_rec, s_img8, img0, lane)
            else:
                origin = selector_origin(h)
                for s in cutlass.range_constexpr(4):
                    slot = 4 * lane + s
                    base = Int32(quad_bases[s] & 0xFF) + origin
                    bit = slot * tc * width
                    lo = Uint64(s_rec[tail_w0 + (bit >> 5)])
                    hi = Uint64(s_rec[tail_w0 + (bit >> 5) + 1])
                    window = ((hi << 32) | lo) >> Uint64(bit & 31)
                    at = img0 + slot_to_row(slot) * cols + col0
                    for c in cutlass.range_constexpr(tc):
                        val = Int32(0)
                        if fits:
                            field = Int32((window >> Uint64(c * width)) & Uint64((1 << width) - 1))
                            val = (base + field) & 0xFF
                        s_img8[at + c] = Uint8(val)
            cute.arch.sync_warp()
            sel_bytes = 16 * tc * width
            cap = _capacity(caps, mode)
            for j in range(lane, cutlass.min(header_count(h), cap), 32):
                pos = Int32(s_rec16[2 * tail_w0 + (sel_bytes >> 1) + j])
                if pos < 128 * tc:
                    eslot = pos // tc
                    s_img8[img0 + slot_to_row(eslot) * cols + col0 + pos - eslot * tc] = s_rec8[
                        4 * tail_w0 + sel_bytes + 2 * cap + j
                    ]
