"""Pure-torch references for the csf kernels (imports only torch and csf_codec), for tests on any machine."""

from __future__ import annotations

import sys

import torch

from csf_codec import InlineScales, decode_inline
from csf_codec.tile_layout import TILE_COLS, TILE_ROWS

__all__ = ["STAGE_THREADS", "expected_stage_words", "stage_slots"]

STAGE_THREADS = 128  # one consumer warpgroup per 128-row block
_MODE_RAW = 3


def stage_slots(device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [128, 4]: the slot thread ``tid``'s word k holds, 4 (8 warp + lane // 4) + k = 4 (tid // 4) + k."""
    tid = torch.arange(STAGE_THREADS, device=device, dtype=torch.int64)
    return 4 * (tid // 4)[:, None] + torch.arange(4, device=device, dtype=torch.int64)[None, :]


def _headers(records: torch.Tensor) -> torch.Tensor:
    h = records[..., -4:].to(torch.int64)
    return h[..., 0] | (h[..., 1] << 8) | (h[..., 2] << 16) | (h[..., 3] << 24)


def expected_stage_words(inline: InlineScales) -> torch.Tensor:
    """uint32 [RB, CTF, 128, 4]: what the inline stage decoder writes for every full column tile.

    ``out[rb, t, tid, k]`` holds the four column bytes (column c in byte c, little-endian) of slot
    ``4 * (tid // 4) + k`` of tile ``(rb, t)``: the scale words thread ``tid`` of the consumer warpgroup feeds its
    wgmma A fragments. Real rows come from :func:`csf_codec.decode_inline` (the native plane); padding slots (rows
    past a partial row group), which the GEMM drops, hold what the register decode yields there: ``(base_ref + o)
    & 0xFF`` in a selector tile (their delta and fields are zero), the stored raw bytes in a raw tile.
    Tail (partial column) tiles are not covered.
    """
    if sys.byteorder != "little":
        raise RuntimeError("stage words are little-endian u32; this host is big-endian")
    geo = inline.geometry
    rb, ctf = geo.row_blocks, geo.full_col_tiles
    dev = inline.records.device
    if rb == 0 or ctf == 0:
        return torch.zeros(rb, ctf, STAGE_THREADS, 4, dtype=torch.uint32, device=dev)
    rows = decode_inline(inline).reshape(-1, geo.cols)
    br = geo.block_rows(dev)  # [RB, 128] plane row of each slot, -1 for padding
    valid = br >= 0
    cols = rows[:, : ctf * TILE_COLS].reshape(-1, ctf, TILE_COLS)  # [rows, CTF, 4]
    padded = torch.cat([cols, cols.new_zeros(1, ctf, TILE_COLS)])
    tiles = padded[torch.where(valid, br, torch.full_like(br, rows.shape[0]))]  # [RB, 128 slots, CTF, 4]
    tiles = tiles.permute(0, 2, 1, 3).contiguous()  # [RB, CTF, 128 slots, 4]

    if not bool(valid.all()):
        h = _headers(inline.records)  # [RB, CTF]
        raw = (h & 3) == _MODE_RAW
        origin = (h >> 8) & 0xFF
        origin = origin - ((origin & 0x80) << 1)
        fill = ((inline.base_ref.to(torch.int64)[:, None] + origin) & 0xFF).to(torch.uint8)  # [RB, CTF]
        pad_bytes = fill[:, :, None, None].expand(rb, ctf, TILE_ROWS, TILE_COLS).clone()
        if bool(raw.any()):
            idx = torch.where(raw, h >> 2, torch.zeros_like(h))
            raw_tiles = inline.raw.view(-1, TILE_ROWS, TILE_COLS)[idx[raw]]
            pad_bytes[raw] = raw_tiles
        pad = ~valid[:, None, :, None]
        tiles = torch.where(pad, pad_bytes, tiles)

    words = tiles[:, :, stage_slots(dev)]  # [RB, CTF, 128 threads, 4 words, 4 bytes]
    return words.contiguous().view(torch.uint32).reshape(rb, ctf, STAGE_THREADS, 4)
