"""A compact CSF payload laid out for the expansion kernel: section views and per-payload tables.

Built once per payload with torch on its device, from the codec's structurally validated layout
(:func:`csf_codec.compact.compact_layout`: checksums, geometry, escape and chunk counts) and its listed
exceptions' codes (:func:`csf_codec.compact_torch.listed_exceptions`, every rule checked), so every offset
the kernel derives stays inside the payload.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec import ScaleFormat
from csf_codec.compact import SEGMENT_ROWS, compact_layout
from csf_codec.compact_code import ESCAPE_CODE, FAR_BITS
from csf_codec.compact_torch import exclusive_cumsum, listed_exceptions

__all__ = ["CompactTables", "compact_tables"]


@dataclass(frozen=True, kw_only=True)
class CompactTables:
    fmt: ScaleFormat
    shape: tuple[int, ...]
    width: int
    codes: torch.Tensor
    escapes: torch.Tensor
    selectors: torch.Tensor
    counts: torch.Tensor
    exceptions: torch.Tensor
    chunk_offsets: torch.Tensor  # int64 [chunks]: a listed chunk's first bit, a raw chunk's first byte
    far_offsets: torch.Tensor  # int64 [chunks]: the first bit of each chunk's far codes in ``exceptions``
    escape_offsets: torch.Tensor  # int64 [chunks]: the first byte of each chunk's escaped values
    segment_escapes: torch.Tensor  # int32 [segments]: escapes before each 128-row segment

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n


def compact_tables(payload: torch.Tensor, *, name: str = "scales") -> CompactTables:
    lay = compact_layout(payload, name=name)
    table = lay.table
    listed = listed_exceptions(table, lay.exceptions, name)
    chunks = table.raw.numel()
    far_chunk = listed.chunk[listed.far]
    far = torch.bincount(far_chunk, minlength=chunks)
    esc = torch.bincount(far_chunk[listed.codes == ESCAPE_CODE], minlength=chunks)
    is_esc = (lay.base_codes == 3).to(torch.int32)
    per_seg = torch.nn.functional.pad(is_esc, (0, (-lay.rows) % SEGMENT_ROWS)).view(-1, SEGMENT_ROWS).sum(1)
    return CompactTables(
        fmt=lay.fmt,
        shape=lay.shape,
        width=lay.width,
        codes=lay.codes,
        escapes=lay.escapes,
        selectors=lay.selectors,
        counts=lay.counts,
        exceptions=lay.exceptions,
        chunk_offsets=torch.where(table.raw, table.raw_offsets, table.bit_offsets),
        far_offsets=8 * listed.far_start + FAR_BITS * exclusive_cumsum(far),
        escape_offsets=listed.escape_start + exclusive_cumsum(esc),
        segment_escapes=(torch.cumsum(per_seg, 0) - per_seg).to(torch.int32),
    )
