"""The inline decoder warp's lane arithmetic (``moe/kernels/engine_record_decoder.py``, ``docs/csf-format.md`` §6):
where a lane reads its quad's selectors and an entry, where an entry lands in the slot-order tile, what value a code
gives, which row a slot fills. Operators only, no branches on values, so one definition serves the CuTe program
(CuTe DSL integers) and its lane-by-lane model on the CPU (Python integers, ``tests/kernels/record_decoder_model.py``).
It imports no CuTe, and lives under ``kernels/`` so the AOT cache key (``runtime.toolchain.sources_hash``) covers it.
"""

from __future__ import annotations

from csf_codec.engine_record_layout import BELOW_CODES, HEADER_BYTES, entry_bytes, selector_bytes

# staging slots (records in flight) of each decoder warp: a warp decodes every third record, so two slots lead it by
# six records
RECORD_SLOTS = 2

__all__ = [
    "RECORD_SLOTS",
    "above_value",
    "below_value",
    "entries_byte",
    "entry_byte",
    "entry_shift",
    "escapes_byte",
    "first_dealt",
    "quad_selector_byte",
    "slot_row",
    "spread_bits",
    "spread_nibbles",
    "spread_pairs",
    "tile_byte",
]


def quad_selector_byte(lane, tc, w):
    """The byte where quad ``lane``'s ``4 tc w`` selector bits start: slot ``4 lane``'s field ``4 lane tc`` at bit
    ``4 lane tc w`` past the header."""
    return HEADER_BYTES + ((lane * tc * w) >> 1)


def entries_byte(tc, w):
    """The first entry's byte: past the header and ``16 tc w`` selector bytes."""
    return HEADER_BYTES + selector_bytes(w, tc)


def escapes_byte(entries, count):
    """The first escape byte: past ``count`` 12-bit entries."""
    return entries + entry_bytes(count)


def entry_byte(entries, i):
    """The byte holding entry ``i``'s low bits (entry ``i`` at bit ``12 i``)."""
    return entries + ((3 * i) >> 1)


def entry_shift(i):
    """Entry ``i``'s bit offset within the 16 bits from :func:`entry_byte`."""
    return (i & 1) * 4


def tile_byte(pos, tc):
    """The slot-order tile's byte of position ``pos = slot tc + column`` (``tc`` 4 or 2): four bytes a slot."""
    s = pos >> (tc >> 1)
    return s * 4 + pos - s * tc


def below_value(lo, code):
    """Codes 0-3: 1-4 below the window's low end."""
    return lo - 1 - code


def above_value(lo, code, w):
    """Codes 4-6: 1-3 above the window's high end ``lo + 2^w - 1`` (``w`` the selector width)."""
    return lo + (1 << w) - 1 + code - (BELOW_CODES - 1)


def slot_row(lane, i):
    """The tile row of slot ``4 lane + i`` (``i`` 0-3): row ``64 half + 16 warp + quad + 8 pair`` of slot
    ``32 warp + 4 quad + 2 half + pair``."""
    return 64 * (i // 2) + 16 * (lane // 8) + lane % 8 + 8 * (i % 2)


def spread_nibbles(d):
    """Four 4-bit deltas of a u16 (slot ``4 l + i`` in bits ``4 i``) as one byte each (slot ``4 l + i`` in byte
    ``i``)."""
    return (d & 0xF) | ((d & 0xF0) << 4) | ((d & 0xF00) << 8) | ((d & 0xF000) << 12)


def first_dealt(rank, seq, warps):
    """The first of a unit's records dealt to decoder warp ``rank`` of ``warps``, when ``seq`` records precede the
    unit in the CTA's walk: record ``j`` of the unit goes to warp ``(seq + j) % warps``, so consecutive records (two
    MXFP4 ring stages each) go to consecutive warps across unit boundaries too."""
    return (rank - seq % warps + warps) % warps


def spread_bits(g):
    """Four 1-bit fields (bits 0-3 of ``g``) as one byte each (field ``c`` in byte ``c``): one multiply places bit
    ``c`` at bit ``8 c`` (the four shifted copies never overlap, so nothing carries)."""
    return ((g & 0xF) * 0x00204081) & 0x01010101


def spread_pairs(g):
    """Four 2-bit fields (bits 0-7 of ``g``) as one byte each: the even and the odd fields by one multiply each
    (fields 0 and 2 shift by 0 and 12, fields 1 and 3 by 6 and 18: no copies overlap)."""
    return (((g & 0x33) * 0x1001) & 0x00030003) | (((g & 0xCC) * 0x40040) & 0x03000300)
