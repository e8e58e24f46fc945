"""A lane-by-lane CPU model of the inline decoder warp (``moe/kernels/engine_record_decoder.py``): the same reads of
the same words of a staging slot (stale bytes past the record included), the same u32 arithmetic and the same lane
formulas (:mod:`csf_kernels.moe.kernels.engine_record_lanes`, shared with the program), the ballot as a list of
flags. It checks the program's decoding algorithm against the torch twin on the CPU; the GPU probe
(``tests/moe/test_engine_inline_probe_gpu.py``) checks the program itself."""

from __future__ import annotations

import torch

from csf_codec.engine_record_layout import (
    BELOW_CODES,
    CODE_SHIFT,
    COUNT_MASK,
    COUNT_SHIFT,
    ESCAPE_CODE,
    MODE_RAW,
    ORIGIN_SHIFT,
    POSITION_MASK,
    raw_units,
)
from csf_codec.engine_records import EngineRecords
from csf_codec.tile_layout import TILE_COLS
from csf_kernels.moe.kernels.engine_record_lanes import (
    above_value,
    below_value,
    entries_byte,
    entry_byte,
    entry_shift,
    escapes_byte,
    quad_selector_byte,
    spread_bits,
    spread_nibbles,
    spread_pairs,
    tile_byte,
)

__all__ = ["RECORD_BYTES", "decode_block"]

RECORD_BYTES = 16 * raw_units(TILE_COLS)
_U32 = 0xFFFFFFFF
_LANES = range(32)


def _u32(buf: bytearray, index: int) -> int:
    return int.from_bytes(buf[4 * index : 4 * index + 4], "little")


def _bases(records: EngineRecords, rb: int, lane: int) -> int:
    ref = int(records.base_ref[rb]) * 0x01010101
    delta = records.base_delta[rb].tolist()
    if records.fmt.name == "nvfp4":
        return (int.from_bytes(bytes(delta[4 * lane : 4 * lane + 4]), "little") + ref) & _U32
    return (spread_nibbles(delta[2 * lane] | delta[2 * lane + 1] << 8) + ref) & _U32


def _decode(slot: bytearray, tc: int, bases: list[int]) -> list[list[int]]:
    """Each lane's four words (slot ``4 l + i``'s column bytes) of the record in ``slot``."""
    h = _u32(slot, 0)
    mode = h & 3
    if mode == MODE_RAW:
        if tc == TILE_COLS:
            return [[_u32(slot, 1 + 4 * lane + i) for i in range(4)] for lane in _LANES]
        return [[(_u32(slot, 1 + 2 * lane + i // 2) >> (16 * (i % 2))) & 0xFFFF for i in range(4)] for lane in _LANES]
    w = 1 << mode
    origin = (h >> ORIGIN_SHIFT) & 0xFF
    origin -= (origin & 0x80) << 1
    count = (h >> COUNT_SHIFT) & COUNT_MASK
    words = []
    for lane in _LANES:
        at = quad_selector_byte(lane, tc, w)
        sel = (_u32(slot, (at >> 2) + 1) << 32 | _u32(slot, at >> 2)) >> ((at & 3) * 8)
        mask = (1 << w) - 1
        lane_words = []
        for i in range(4):
            if tc == TILE_COLS:  # the program's full-tile forms: the quad's bits read as one aligned word
                if w == 1:
                    fields = spread_bits((slot[4 + 2 * lane] | slot[5 + 2 * lane] << 8) >> (4 * i))
                elif w == 2:
                    fields = spread_pairs(_u32(slot, 1 + lane) >> (8 * i))
                else:
                    fields = spread_nibbles(_u32(slot, 1 + 2 * lane + i // 2) >> (16 * (i % 2)))
            else:
                group = (sel >> (i * tc * w)) & _U32
                fields = 0
                for c in range(4):
                    fields |= ((group >> (c * w)) & mask) << (8 * c)
            lo = ((bases[lane] >> (8 * i)) & 0xFF) + origin
            lane_words.append((fields + (lo & _U32) * 0x01010101) & _U32)
        words.append(lane_words)
    if count:
        _exceptions(words, slot, tc, w, count)
    return words


def _exceptions(words: list[list[int]], slot: bytearray, tc: int, w: int, count: int) -> None:
    tile = bytearray(b"".join(word.to_bytes(4, "little") for lane_words in words for word in lane_words))
    entries = entries_byte(tc, w)
    escapes = escapes_byte(entries, count)
    escaped = 0
    for first in range(0, count, 32):
        lanes = []
        for lane in _LANES:
            i = first + lane
            at = min(entry_byte(entries, i), RECORD_BYTES - 2)
            entry = ((slot[at] | slot[at + 1] << 8) >> entry_shift(i)) & 0xFFF
            lanes.append((i, entry, entry >> CODE_SHIFT))
        ballot = [i < count and code == ESCAPE_CODE for i, _, code in lanes]
        for lane, (i, entry, code) in enumerate(lanes):
            if i < count:
                idx = tile_byte(entry & POSITION_MASK, tc)
                lo = tile[idx]
                v = above_value(lo, code, w)
                if code < BELOW_CODES:
                    v = below_value(lo, code)
                if code == ESCAPE_CODE:
                    v = slot[escapes + escaped + sum(ballot[:lane])]
                tile[idx] = v & 0xFF
        escaped += sum(ballot)
    for lane in _LANES:
        words[lane] = [_u32(tile, 4 * lane + i) for i in range(4)]


def decode_block(records: EngineRecords, rb: int, staging: list[bytearray], taken: int) -> list[torch.Tensor]:
    """Row block ``rb``'s records as the warp decodes them: record ``j`` lands in ``staging[(taken + j) % 4]`` over
    its first ``L`` bytes (the rest stays stale); returns uint8 [128 slots, 4] a record (column ``c`` in byte ``c``)."""
    geo = records.geometry
    bases = [_bases(records, rb, lane) for lane in _LANES]
    tiles = []
    for j in range(geo.col_tiles):
        rec = bytes(records.record(rb, j).tolist())
        slot = staging[(taken + j) % len(staging)]
        slot[: len(rec)] = rec
        tc = TILE_COLS if j < geo.full_col_tiles else geo.tail_cols
        words = _decode(slot, tc, bases)
        flat = [word for lane_words in words for word in lane_words]
        tiles.append(torch.tensor([list(word.to_bytes(4, "little")) for word in flat], dtype=torch.uint8))
    return tiles
