"""The compact form's CPU decoder on the C extension (:mod:`csf_codec.native`): the numpy decoder's checks and
bytes (:func:`csf_codec.compact_decode_np.decode_rows_np`, the reference), each span's per-scale work in one C
call that releases the GIL, two spans at a time.

The plane-wide checks (stream padding, the far codes' length and padding, the escape list's length) run here in
Python as in the reference, in its order; a span's faults come back from C as a code, raised with the
reference's message.
"""

from __future__ import annotations

import numpy as np

from .compact_code import ESCAPE_CODE, FAR_BITS
from .compact_np import ChunkTable, row_spans
from .errors import CorruptPayloadError
from .native import native
from .swar import gather_bits, map_spans

__all__ = ["decode_rows_c", "scan_bases_c"]

# by the C code's fault number (native_compact.c), the reference's message
_FAULTS = {
    1: "a chunk's position code does not hold its count of exceptions",
    2: "an exception position lies past the end of its chunk",
    3: "exception positions are not strictly ascending",
    4: "an exception placed by its selector is flagged far",
    5: "an exception's value leaves the byte range",
    6: "an escaped exception byte lies within reach of its far code",
    7: "an exception's value leaves the byte range",
    8: "a raw chunk's selectors differ from the scales it stores",
    9: "a raw chunk holds few enough exceptions to be listed",
    10: "an exception index lies outside its section",
}


def scan_bases_c(codes: np.ndarray, escapes: np.ndarray) -> np.ndarray:
    """:func:`csf_codec.compact_np.scan_bases_np` (the reference) in one C pass."""
    out = np.empty(codes.size, dtype=np.int32)
    native().scan_bases(np.ascontiguousarray(codes, dtype=np.uint8), np.ascontiguousarray(escapes, np.uint8), out)
    return out


def _i64(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.int64)


def decode_rows_c(
    bases, selectors, table: ChunkTable, exceptions, rows: int, cols: int, width: int, name: str, hasher=None
):
    """:func:`csf_codec.compact_decode_np.decode_rows_np` (same arguments, bytes and errors) on the C loops."""
    nat = native()
    out = np.empty(rows * cols, dtype=np.uint8)
    exceptions = np.ascontiguousarray(exceptions, dtype=np.uint8)
    stream = exceptions[: table.stream_bytes]
    if table.stream_bits % 8 and stream[-1] >> (table.stream_bits % 8):
        raise CorruptPayloadError(name, "the padding after the position codes is not zero")
    listed, bit_offsets = _i64(table.listed), _i64(table.bit_offsets)
    per_chunk = np.empty(listed.size, dtype=np.int64)
    nat.far_counts(stream, listed, bit_offsets, per_chunk)
    far_before = np.zeros(listed.size + 1, dtype=np.int64)
    np.cumsum(per_chunk, out=far_before[1:])
    n_far = int(far_before[-1])
    far_end = table.raw_end + -(-FAR_BITS * n_far // 8)
    if far_end > exceptions.size:
        raise CorruptPayloadError(name, f"exception section holds {exceptions.size} bytes, its codes need {far_end}")
    far_stream = exceptions[table.raw_end : far_end]
    if (FAR_BITS * n_far) % 8 and far_stream[-1] >> ((FAR_BITS * n_far) % 8):
        raise CorruptPayloadError(name, "the padding after the far codes is not zero")
    codes = gather_bits(far_stream, FAR_BITS * np.arange(n_far), FAR_BITS).astype(np.uint8)
    is_esc = codes == ESCAPE_CODE
    need = far_end + int(is_esc.sum())
    if need != exceptions.size:
        raise CorruptPayloadError(name, f"exception section holds {exceptions.size} bytes, its codes need {need}")
    escaped = exceptions[far_end:]
    esc_before = np.zeros(n_far + 1, dtype=np.int64)
    np.cumsum(is_esc, out=esc_before[1:])
    args = (
        np.ascontiguousarray(selectors, dtype=np.uint8),
        np.ascontiguousarray(bases, dtype=np.int32),
        exceptions,
        listed,
        bit_offsets,
        _i64(table.lens),
        np.ascontiguousarray(table.raw, dtype=np.bool_),
        _i64(table.raw_offsets),
        codes,
        escaped,
        esc_before,
        far_before,
        int(table.stream_bytes),
    )

    def span(s: tuple[int, int]) -> tuple[int, int]:
        a, b = s
        fault, _ = nat.decode_compact_span(out, *args, a, b, cols, width)
        if fault:
            raise CorruptPayloadError(name, _FAULTS[fault])
        return a * cols, b * cols

    map_spans(span, row_spans(rows, cols), None if hasher is None else lambda d: hasher.update(out[d[0] : d[1]]))
    return out
