"""CuTe DSL inline-tile stage decoder (build time only: imports cutlass).

The building block of the inline-scale wgmma GEMM: one CTA of 128 threads (one consumer warpgroup) per 128-row
block ``rb`` walks that block's full column tiles the way a GEMM mainloop walks K, and rebuilds in registers the
scale words each thread's wgmma A fragments consume (format: ``docs/csf-format.md`` section 5).

Per tile ``t`` of block ``rb``:

* the tile's S-byte record ``records[rb, t]`` is copied into shared memory with ``S / 16`` 16-byte ``cp.async``
  copies, issued by threads ``0 .. S/16 - 1``; two buffers: the copy of tile ``t + 1`` is in flight while tile
  ``t`` is decoded (one commit group per tile, ``cp.async.wait_group 1`` + CTA barrier before decoding, a second
  barrier before a buffer is refilled);
* thread ``tid`` (warp ``w = tid // 32``, lane ``l``), quad group ``g = 8 w + l // 4``, owns slots ``4 g + k``
  (``k`` = 0..3) and positions ``16 g .. 16 g + 15`` (position ``p = slot * 4 + col``); it builds word ``k`` =
  the four column bytes of slot ``4 g + k`` (column ``c`` in byte ``c``, little-endian):

  - selector tiles (mode 0/1/2, width ``w`` = 1/2/4 bits): ``byte = base_ref[rb] + delta k + o + field``, where
    delta k is nibble ``k`` of the quad's u16 of ``base_delta[rb]`` (4-bit deltas, MXFP4: ``[RB, 64]`` bytes) or
    byte ``k`` of its u32 (8-bit deltas, ``[RB, 128]`` bytes, the codec's NVFP4 form), read once per block, and
    the quad's ``16 w`` selector bits are read as one word at byte ``2 w g``; the
    header's ``count`` exceptions (u16 positions at byte ``64 w + 2 e``, values at byte ``64 w + 2 cap + e``,
    ``cap = min(63, (S - 4 - 64 w) // 3)``) that fall in the thread's 16 positions overwrite their byte;
  - raw tiles (mode 3): the 16 bytes ``raw[h >> 2, 16 g : 16 g + 16]`` (one 16-byte global load).

* each thread stores its 4 words to ``out[rb, t, tid, 0:4]`` (uint32 ``[RB, CTF, 128, 4]``), so a test can
  compare them bit for bit with :func:`csf_kernels.record.reference.expected_stage_words`.

Padding slots (rows past a partial row group) decode like any other slot: ``(base_ref + o) & 0xFF`` in selector
tiles (their delta and fields are 0), the stored raw bytes in raw tiles; the GEMM drops them.

Out of scope: tail (partial column) tiles, and the GEMM itself. Headers are trusted (the codec validates
payloads); a selector mode whose selectors do not fit ``S`` (e.g. 4-bit selectors in an MXFP4-sized record)
decodes to zero words.

``S`` (record bytes) and the delta width are compile-time constants: ``S`` any multiple of 16 from 80 to 448
(MXFP4 planes use 80..224, NVFP4 full tiles 272..352). One program is built per ``(S, delta bits)`` (see
:mod:`csf_kernels.aot.cute_export`).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32
from cutlass.cute.nvgpu import cpasync

from csf_codec.inline import exception_capacity as codec_exception_capacity
from csf_kernels.record.cute import header_count, header_mode, header_raw_index

__all__ = [
    "DELTA_BITS",
    "MAX_RECORD_BYTES",
    "MIN_RECORD_BYTES",
    "THREADS",
    "InlineStageDecoder",
    "check_record_bytes",
    "exception_capacity",
]

THREADS = 128  # one consumer warpgroup
TILE_POSITIONS = 512  # 128 slots x 4 columns
MIN_RECORD_BYTES = 80
MAX_RECORD_BYTES = 448
_COPY_BYTES = 16
DELTA_BITS = (4, 8)  # base_delta bits per slot: 4 (MXFP4, [RB, 64] bytes) or 8 ([RB, 128] bytes)


def check_record_bytes(record_bytes: int) -> int:
    s = int(record_bytes)
    if s % _COPY_BYTES or not MIN_RECORD_BYTES <= s <= MAX_RECORD_BYTES:
        raise ValueError(f"record bytes must be a multiple of 16 in [{MIN_RECORD_BYTES}, {MAX_RECORD_BYTES}]; got {s}")
    return s


def exception_capacity(width: int, record_bytes: int) -> int:
    """Exceptions an S-byte full-tile record holds with selectors of this width (negative: mode impossible)."""
    return codec_exception_capacity(width, record_bytes)


def _spread_mask(width: int) -> tuple[tuple[int, int], ...]:
    """(mask, left shift) pairs that move 4 fields of ``width`` bits into the 4 bytes of a word."""
    field = (1 << width) - 1
    return tuple((field << (c * width), c * (8 - width)) for c in range(4))


class InlineStageDecoder:
    """The stage decoder for one record size ``S``; call through :func:`cute.compile`.

    Arguments of the compiled function, in order: ``base_ref`` u8 [RB], ``base_delta`` u8 [RB, 16 * delta_bits],
    ``records`` u8 [RB, CTF, S], ``raw`` u8 [n, 512], ``out`` u32 [RB, CTF, 128, 4], ``stream``.
    Every tensor's base must be 16-byte aligned (records, raw and out are read/written with 16-byte accesses).
    """

    def __init__(self, record_bytes: int, delta_bits: int = 4):
        self.record_bytes = check_record_bytes(record_bytes)
        if delta_bits not in DELTA_BITS:
            raise ValueError(f"base deltas are {DELTA_BITS} bits wide; got {delta_bits}")
        self.delta_bits = delta_bits

    @cute.jit
    def __call__(
        self,
        base_ref: cute.Tensor,
        base_delta: cute.Tensor,
        records: cute.Tensor,
        raw: cute.Tensor,
        out: cute.Tensor,
        stream: cuda.CUstream,
    ):
        s = self.record_bytes
        self.kernel(base_ref, base_delta, records, raw, out).launch(
            grid=(cute.size(records, mode=[0]), 1, 1),
            block=(THREADS, 1, 1),
            smem=2 * s,
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        base_ref: cute.Tensor,
        base_delta: cute.Tensor,
        records: cute.Tensor,
        raw: cute.Tensor,
        out: cute.Tensor,
    ):
        s = self.record_bytes
        copies = s // _COPY_BYTES
        tid, _, _ = cute.arch.thread_idx()
        rb, _, _ = cute.arch.block_idx()
        tiles = cute.size(records, mode=[1])
        g = tid >> 2  # quad group 8 * warp + lane // 4 (tid = 32 warp + lane)

        # two record buffers, one per pipeline stage, plus 16/32-bit views of them
        smem = cutlass.memory.SmemAllocator()
        s_rec = smem.allocate_tensor(cutlass.Uint8, cute.make_layout((s, 2)), byte_alignment=16)
        s_rec16 = cute.recast_tensor(s_rec, cutlass.Uint16)
        s_rec32 = cute.recast_tensor(s_rec, cutlass.Uint32)

        # cp.async.cg: 16-byte copies that bypass L1 (records are read once)
        copy_atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), cutlass.Uint8, num_bits_per_copy=128
        )

        # the thread's four row bases (read once per block): the quad's deltas are one u16 (4-bit) or u32 (8-bit)
        db = self.delta_bits
        ref = Int32(base_ref[rb])
        delta_words = cute.recast_tensor(base_delta, cutlass.Uint16 if db == 4 else cutlass.Uint32)
        deltas = Uint32(delta_words[rb, g])

        # prologue: stage 0 <- tile 0
        if tid < copies:
            if tiles > 0:
                src = cute.zipped_divide(records[rb, 0, None], (_COPY_BYTES,))
                dst = cute.zipped_divide(s_rec[None, 0], (_COPY_BYTES,))
                cute.copy(copy_atom, src[None, tid], dst[None, tid])
        cute.arch.cp_async_commit_group()

        for t in range(tiles):
            buf = t & 1
            if tid < copies:
                if t + 1 < tiles:
                    src = cute.zipped_divide(records[rb, t + 1, None], (_COPY_BYTES,))
                    dst = cute.zipped_divide(s_rec[None, 1 - buf], (_COPY_BYTES,))
                    cute.copy(copy_atom, src[None, tid], dst[None, tid])
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.sync_threads()

            h = Uint32(s_rec32[s // 4 - 1, buf])
            mode = header_mode(h)
            w0 = Uint32(0)
            w1 = Uint32(0)
            w2 = Uint32(0)
            w3 = Uint32(0)
            if mode == 3:
                row = cute.recast_tensor(raw, cutlass.Uint32)[header_raw_index(h), None]
                mine = cute.zipped_divide(row, (4,))[None, g]
                frag = cute.make_rmem_tensor((4,), cutlass.Uint32)
                cute.autovec_copy(mine, frag)
                w0 = frag[0]
                w1 = frag[1]
                w2 = frag[2]
                w3 = frag[3]
            for m in cutlass.range_constexpr(3):
                width = 1 << m
                cap = exception_capacity(width, s)
                if cutlass.const_expr(cap >= 0):
                    if mode == m:
                        count = header_count(h)
                        origin = Int32((h >> 8) & 0xFF)
                        origin = origin - ((origin & 0x80) << 1)
                        # the quad's 16 fields: 16 * width bits at byte 2 * width * g
                        if cutlass.const_expr(width == 1):
                            sel_lo = Uint32(s_rec16[g, buf])
                            sel_hi = Uint32(0)
                        elif cutlass.const_expr(width == 2):
                            sel_lo = Uint32(s_rec32[g, buf])
                            sel_hi = Uint32(0)
                        else:
                            sel_lo = Uint32(s_rec32[2 * g, buf])
                            sel_hi = Uint32(s_rec32[2 * g + 1, buf])
                        group_bits = 4 * width
                        group_mask = (1 << group_bits) - 1
                        words = []
                        for k in cutlass.range_constexpr(4):
                            lo_bit = k * group_bits
                            if cutlass.const_expr(lo_bit < 32):
                                grp = (sel_lo >> lo_bit) & group_mask
                            else:
                                grp = (sel_hi >> (lo_bit - 32)) & group_mask
                            spread = Uint32(0)
                            for c in cutlass.range_constexpr(4):
                                fmask, fshift = _spread_mask(width)[c]
                                spread = spread | ((grp & fmask) << fshift)
                            b = Uint32((ref + Int32((deltas >> (db * k)) & ((1 << db) - 1)) + origin) & 0xFF)
                            words.append(b * 0x01010101 + spread)
                        w0 = words[0]
                        w1 = words[1]
                        w2 = words[2]
                        w3 = words[3]
                        pos_base = 32 * width  # u16 index of the first exception position
                        val_base = 64 * width + 2 * cap  # byte index of the first exception value
                        for e in range(count):
                            pos = Int32(s_rec16[pos_base + e, buf])
                            if (pos >> 4) == g:
                                val = Uint32(s_rec[val_base + e, buf])
                                j = pos & 15
                                bshift = Uint32((j & 3) * 8)
                                keep = ~(Uint32(0xFF) << bshift)
                                put = val << bshift
                                kk = j >> 2
                                if kk == 0:
                                    w0 = (w0 & keep) | put
                                if kk == 1:
                                    w1 = (w1 & keep) | put
                                if kk == 2:
                                    w2 = (w2 & keep) | put
                                if kk == 3:
                                    w3 = (w3 & keep) | put

            res = cute.make_rmem_tensor((4,), cutlass.Uint32)
            res[0] = w0
            res[1] = w1
            res[2] = w2
            res[3] = w3
            cute.autovec_copy(res, out[rb, t, tid, None])
            # every thread is done reading this buffer before it is refilled (tile t + 2)
            cute.arch.sync_threads()
