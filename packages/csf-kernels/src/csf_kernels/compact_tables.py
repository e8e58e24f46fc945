"""A compact CSF payload laid out for the expansion kernel: section views and per-payload tables.

Built once per payload with torch on its device. The structural rules the kernel relies on to stay in
bounds (escape count, chunk counts, exception bytes) are checked here, and the payload's checksums and
geometry by the codec's envelope reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec import CorruptPayloadError, ScaleFormat
from csf_codec.bitfields import unpack_fields
from csf_codec.compact import CHUNK_SCALES, MAGIC, RAW_CHUNK, SEGMENT_ROWS
from csf_codec.container import open_envelope

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
    env, body = open_envelope(payload, MAGIC, name=name)
    shape, w = env.shape, env.param
    rows = 1
    for d in shape[:-1]:
        rows *= d
    cols = shape[-1]
    total = rows * cols
    cuts = [0]
    for n in env.sections:
        cuts.append(cuts[-1] + n)
    sec = [body[cuts[i] : cuts[i + 1]] for i in range(5)]
    nchunks = -(-total // CHUNK_SCALES)
    if sec[0].numel() != -(-rows // 4) or sec[2].numel() != -(-total * w // 8) or sec[3].numel() != nchunks:
        raise CorruptPayloadError(name, f"section sizes {env.sections} do not fit the geometry {shape}")
    codes = unpack_fields(sec[0], 2, rows)
    is_esc = (codes == 3).to(torch.int32)
    if rows and (bool((codes[::SEGMENT_ROWS] != 3).any()) or int(is_esc.sum()) != sec[1].numel()):
        raise CorruptPayloadError(name, "base codes and escaped bases disagree")
    per_seg = torch.nn.functional.pad(is_esc, (0, (-rows) % SEGMENT_ROWS)).view(-1, SEGMENT_ROWS).sum(1)
    segment_escapes = (torch.cumsum(per_seg, 0) - per_seg).to(torch.int32)
    counts = sec[3].to(torch.int64)
    lens = torch.full((nchunks,), CHUNK_SCALES, dtype=torch.int64, device=body.device)
    if nchunks:
        lens[-1] = total - CHUNK_SCALES * (nchunks - 1)
    raw = counts == RAW_CHUNK
    if bool((~raw & (2 * counts >= lens)).any()):
        raise CorruptPayloadError(name, "a chunk lists more exceptions than a raw chunk would hold")
    chunk_bytes = torch.where(raw, lens, 2 * counts)
    if int(chunk_bytes.sum()) != sec[4].numel():
        raise CorruptPayloadError(name, "chunk counts disagree with the exception section")
    return CompactTables(
        fmt=env.fmt,
        shape=shape,
        width=w,
        codes=sec[0],
        escapes=sec[1],
        selectors=sec[2],
        counts=sec[3],
        exceptions=sec[4],
        chunk_offsets=torch.cumsum(chunk_bytes, 0) - chunk_bytes,
        segment_escapes=segment_escapes,
    )
