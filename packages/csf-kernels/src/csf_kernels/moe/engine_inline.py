"""The engine's inline scale source on the host: a plane's engine records (``csf_codec.engine_records``, format
``docs/csf-format.md`` §6) as the inline GEMM program reads them (``moe/kernels/engine_record_decoder.py``).

The records are encoded at load from the native plane, over the weights' rows in the order the GEMM reads them
(W13 in engine order where FC1's epilogue activates), one row group an expert, so the GEMM's 128-row tile ``tm``
of expert ``e`` is row block ``e * ceil(R / 128) + tm``. Block starts travel as int32 16-byte units whatever the
codec stores (:func:`csf_codec.engine_record_layout.block_start_units`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec.engine_record_layout import block_start_units
from csf_codec.engine_records import EngineRecords, encode_engine_records
from csf_kernels.moe.engine_panels import ROW_BLOCK, panel_scales
from csf_kernels.moe.engine_specs import INLINE_MAX_COL_TILES

__all__ = ["InlineScales", "inline_scales"]


@dataclass(frozen=True, eq=False)
class InlineScales:
    """One plane's engine records on the GEMM's device."""

    fmt: str
    experts: int
    rows: int  # R: rows an expert (a multiple of 64)
    cols: int  # scale columns (K / 32 MXFP4, K / 16 NVFP4)
    base_ref: torch.Tensor  # uint8 [RB]
    base_delta: torch.Tensor  # uint8 [RB, 64] (MXFP4) or [RB, 128] (NVFP4)
    block_start: torch.Tensor  # int32 [RB]: 16-byte units
    record_units: torch.Tensor  # uint8 [RB, col tiles]
    body: torch.Tensor  # uint8 [bytes]

    @property
    def k(self) -> int:
        return self.cols * panel_scales(self.fmt).block

    @property
    def nbytes(self) -> int:
        """What the GEMM reads the plane from: bases, deltas, starts, lengths and records."""
        parts = (self.base_ref, self.base_delta, self.block_start, self.record_units, self.body)
        return sum(t.numel() * t.element_size() for t in parts)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The program's arguments in order."""
        return self.base_ref, self.base_delta, self.block_start, self.record_units, self.body


def _check_plane(plane: torch.Tensor, fmt: str) -> tuple[int, int, int]:
    kind = panel_scales(fmt)
    if plane.dtype != torch.uint8 or plane.dim() != 3:
        raise ValueError(
            f"a scale plane must be uint8 [E, R, K / {kind.block}]; got {plane.dtype} {tuple(plane.shape)}"
        )
    experts, rows, cols = plane.shape
    if rows % ROW_BLOCK or (cols * kind.block) % 64:
        raise ValueError(f"scale plane {tuple(plane.shape)}: the engine needs rows and K in whole multiples of 64")
    if -(-cols // 4) > INLINE_MAX_COL_TILES:
        raise ValueError(
            f"scale plane {tuple(plane.shape)}: {-(-cols // 4)} record tiles a row block; the inline engine reads "
            f"at most {INLINE_MAX_COL_TILES}"
        )
    return experts, rows, cols


def device_records(records: EngineRecords, fmt: str, device: torch.device | str) -> InlineScales:
    """``records`` (one row group an expert) moved to ``device`` as the inline program reads them."""
    experts, rows, cols = records.shape if len(records.shape) == 3 else (1, *records.shape)
    if records.row_group != rows or records.fmt.name != fmt:
        raise ValueError(f"records of {records.fmt.name} with row group {records.row_group}: the engine reads {fmt} "
                         f"records grouped by expert ({rows} rows)")  # fmt: skip
    starts = block_start_units(records.block_start).to(torch.int64)
    if starts.numel() and int(starts[-1]) + int(records.record_units[-1].sum()) >= 2**31:
        raise ValueError("a plane's records past 32 GB: the program's int32 starts cannot address them")

    def dev(t: torch.Tensor) -> torch.Tensor:  # a fresh allocation: aligned and contiguous
        return t.contiguous().to(device).clone()

    return InlineScales(
        fmt=fmt,
        experts=experts,
        rows=rows,
        cols=cols,
        base_ref=dev(records.base_ref),
        base_delta=dev(records.base_delta),
        block_start=dev(starts.to(torch.int32)),
        record_units=dev(records.record_units),
        body=dev(records.body),
    )


def inline_scales(plane: torch.Tensor, fmt: str, *, name: str = "scales") -> InlineScales:
    """Engine records of a native plane (uint8 ``[E, R, C]``, rows in the GEMM's order), encoded and checked
    (the codec decodes them back and compares), on the plane's device."""
    _check_plane(plane, fmt)
    records = encode_engine_records(plane, fmt, row_group=plane.shape[1], name=name)
    return device_records(records, fmt, plane.device)
