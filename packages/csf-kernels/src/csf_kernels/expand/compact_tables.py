"""A compact CSF payload laid out for the expansion kernel: section views and per-payload tables.

Built once per payload with torch on its device, from the codec's structurally validated layout
(:func:`csf_codec.compact.compact_layout`: checksums, geometry, escape and chunk counts), so every offset
the kernel derives stays inside the payload.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec import ScaleFormat
from csf_codec.compact import SEGMENT_ROWS, compact_layout

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
    chunk_offsets: torch.Tensor  # int64 [chunks]: byte offset of each chunk in ``exceptions``
    segment_escapes: torch.Tensor  # int32 [segments]: escapes before each 128-row segment

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n


def compact_tables(payload: torch.Tensor, *, name: str = "scales") -> CompactTables:
    lay = compact_layout(payload, name=name)
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
        chunk_offsets=lay.chunk_offsets,
        segment_escapes=(torch.cumsum(per_seg, 0) - per_seg).to(torch.int32),
    )
