"""A torch twin of the engine producer's inline scale decoder (``moe/kernels/engine_record_decoder.py``): one
(row block, K step) of engine records (:mod:`csf_codec.engine_records`, ``docs/csf-format.md`` section 6) decoded
straight into the engine's scale panel (:func:`csf_kernels.moe.engine_panels.engine_scale_panel`), as the decoder
warp fills a stage's scale slots: read the record's header, build each slot's bytes from its row base, the window
origin and its selector field, then overwrite the exceptions (a code's distance from the window, or the next escape
byte). MXFP4 steps take two of a record's four columns (one record fills two steps), NVFP4 steps all four.

It trusts its records (the codec's decoder checks them at load).
"""

from __future__ import annotations

import torch

from csf_codec.engine_record_layout import (
    ABOVE_CODES,
    BELOW_CODES,
    CODE_SHIFT,
    COUNT_MASK,
    COUNT_SHIFT,
    ESCAPE_CODE,
    HEADER_BYTES,
    MODE_RAW,
    MODE_WIDTH,
    ORIGIN_SHIFT,
    POSITION_MASK,
    entry_bytes,
    selector_bytes,
)
from csf_codec.engine_records import EngineRecords
from csf_codec.tile_layout import TILE_COLS, TILE_ROWS
from csf_kernels.moe.engine_panels import ROW_BLOCK, panel_scales

__all__ = ["decode_record_step", "empty_scale_panel", "record_tile"]


def _slot_bases(records: EngineRecords, block: int) -> torch.Tensor:
    """int32 [128]: each slot's row base (reference plus its delta: a nibble for MXFP4, a byte for NVFP4)."""
    packed = records.base_delta[block].to(torch.int32)
    if records.fmt.name == "mxfp4":
        packed = torch.stack((packed & 0xF, packed >> 4), dim=1).reshape(-1)
    return int(records.base_ref[block]) + packed


def record_tile(records: EngineRecords, block: int, col_tile: int) -> torch.Tensor:
    """uint8 [128 slots, tc]: one record decoded, slots in slot order."""
    geo = records.geometry
    tc = TILE_COLS if col_tile < geo.full_col_tiles else geo.tail_cols
    rec = records.record(block, col_tile).to(torch.int64)
    header = int(rec[0] | rec[1] << 8 | rec[2] << 16 | rec[3] << 24)
    mode = header & 3
    if mode == MODE_RAW:
        return rec[HEADER_BYTES : HEADER_BYTES + TILE_ROWS * tc].to(torch.uint8).view(TILE_ROWS, tc)
    w = MODE_WIDTH[mode]
    origin = ((header >> ORIGIN_SHIFT) & 0xFF ^ 0x80) - 0x80
    count = (header >> COUNT_SHIFT) & COUNT_MASK
    sb = selector_bytes(w, tc)
    sel = rec[HEADER_BYTES : HEADER_BYTES + sb]
    per_byte = 8 // w
    fields = (sel[:, None] >> (w * torch.arange(per_byte))) & ((1 << w) - 1)  # field p at bit p * w
    lo = (_slot_bases(records, block) + origin).repeat_interleave(tc)  # [128 tc] window low end a position
    vals = lo + fields.reshape(-1)
    if count:
        i = torch.arange(count)
        at = HEADER_BYTES + sb + (3 * i) // 2
        entry = ((rec[at] | rec[at + 1] << 8) >> (4 * (i & 1))) & 0xFFF
        pos, code = entry & POSITION_MASK, entry >> CODE_SHIFT
        lo_p = lo[pos]
        value = torch.where(code < BELOW_CODES, lo_p - 1 - code, lo_p + (1 << w) - 1 + code - (BELOW_CODES - 1))
        esc = code == ESCAPE_CODE
        escape_at = HEADER_BYTES + sb + entry_bytes(count) + torch.cumsum(esc.to(torch.int64), 0) - 1
        vals[pos] = torch.where(esc, rec[escape_at.clamp(min=0)], value)
    assert BELOW_CODES + ABOVE_CODES == ESCAPE_CODE
    return vals.to(torch.uint8).view(TILE_ROWS, tc)


def empty_scale_panel(records: EngineRecords) -> torch.Tensor:
    """The scale panel ``uint8 [steps, rows * b]`` of the records' plane (rows flattened, padded to whole 64-row
    blocks; steps of 64 K, ``b`` scale columns a step), filled with the padding scale: what the twin writes into."""
    geo = records.geometry
    kind = panel_scales(records.fmt.name)
    rows = geo.experts * geo.rows
    padded = -(-rows // ROW_BLOCK) * ROW_BLOCK
    steps = -(-geo.cols // kind.per_step)
    return torch.full((steps, padded * kind.per_step), kind.neutral, dtype=torch.uint8)


def decode_record_step(records: EngineRecords, block: int, step: int, panel: torch.Tensor) -> None:
    """Write K step ``step`` (64 K: ``b`` scale columns) of row block ``block``'s rows into ``panel[step]``."""
    per_step = panel_scales(records.fmt.name).per_step
    geo = records.geometry
    col0 = step * per_step
    tile = record_tile(records, block, col0 // TILE_COLS)
    rows = geo.block_rows()[block]
    real = rows >= 0
    out = panel[step].view(-1, per_step)
    for k in range(per_step):
        c = col0 % TILE_COLS + k
        if c < tile.shape[1]:
            out[rows[real], k] = tile[real, c]
