"""Scale expansion: CSF -> the native scale plane, on the GPU, for a whole layer or routed experts.

These are the host-side launchers of the Triton programs in :mod:`csf_kernels.kernels`; they import
no compiler and resolve every program through the AOT runtime.
"""

from __future__ import annotations

import torch

from csf_codec import InlineScales
from csf_codec.tile_layout import TILE_COLS

from . import runtime
from .compact_tables import CompactTables
from .families import compact_spec, inline_class_spec

__all__ = ["all_experts", "expand_inline"]

_ALL: dict[tuple[int, torch.device], torch.Tensor] = {}


def all_experts(num_experts: int, device: torch.device) -> torch.Tensor:
    """A cached int32 arange, so whole-layer expansion allocates nothing per call (graph-safe)."""
    key = (num_experts, torch.device(device))
    if key not in _ALL:
        _ALL[key] = torch.arange(num_experts, dtype=torch.int32, device=device)
    return _ALL[key]


def expand_inline(
    inline: InlineScales,
    out: torch.Tensor | None = None,
    *,
    experts: torch.Tensor | None = None,
    geometry: str | None = None,
) -> torch.Tensor:
    """Write the native scale plane of ``inline`` into ``out`` (uint8, the plane's shape, same device).

    ``experts`` (int32, on the device) limits the work to those experts' rows; ids outside [0, E) are
    graph padding and write nothing. Returns ``out``.
    """
    geo = inline.geometry
    dev = inline.records.device
    if out is None:
        out = torch.empty(inline.shape, dtype=torch.uint8, device=dev)
    if tuple(out.shape) != tuple(inline.shape) or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(
            f"expand_inline: out must be a contiguous uint8 {inline.shape} tensor, got {out.dtype} {tuple(out.shape)}"
        )
    if experts is None:
        experts = all_experts(geo.experts, dev)
    elif experts.dtype != torch.int32:
        experts = experts.to(torch.int32)
    blocks_per_expert = geo.row_blocks // max(geo.experts, 1)
    classes = [(inline.records, inline.raw, inline.record_bytes, TILE_COLS, geo.full_col_tiles, 0)]
    if geo.tail_cols:
        classes.append(
            (inline.tail, inline.tail_raw, inline.tail_record_bytes, geo.tail_cols, 1, geo.full_col_tiles * TILE_COLS)
        )
    for records, raw, s, tc, class_tiles, col_start in classes:
        if class_tiles == 0:
            continue
        spec = inline_class_spec(inline.fmt, s, tc)
        prog = runtime.program(spec, geometry=geometry)
        ctg = spec.fact["CTG"]
        grid = (experts.numel() * blocks_per_expert, -(-class_tiles // ctg))
        prog.launch(
            grid,
            inline.base_ref,
            inline.base_delta,
            records,
            raw,
            out,
            experts,
            blocks_per_expert,
            geo.blocks_per_group,
            geo.row_group,
            geo.rows,
            geo.cols,
            col_start,
            class_tiles,
            geo.experts,
        )
    return out


def expand_compact(
    tables: CompactTables,
    out: torch.Tensor | None = None,
    *,
    experts: torch.Tensor | None = None,
    geometry: str | None = None,
) -> torch.Tensor:
    """Write the native plane of a compact payload (prepared by ``compact_tables``) into ``out``.

    ``experts`` as for :func:`expand_inline`; a 2-D plane counts as one expert.
    """
    shape = tables.shape
    dev = tables.codes.device
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=dev)
    if tuple(out.shape) != tuple(shape) or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(
            f"expand_compact: out must be a contiguous uint8 {shape} tensor, got {out.dtype} {tuple(out.shape)}"
        )
    num_experts = shape[0] if len(shape) == 3 else 1
    rows_per_expert = tables.rows // max(num_experts, 1)
    if experts is None:
        experts = all_experts(num_experts, dev)
    elif experts.dtype != torch.int32:
        experts = experts.to(torch.int32)
    # an expert's rows may start inside a segment: one more segment than N / 128 covers any alignment
    segments_per_expert = -(-rows_per_expert // 128) + (1 if rows_per_expert % 128 else 0)
    prog = runtime.program(compact_spec(tables.width), geometry=geometry)
    prog.launch(
        (experts.numel() * segments_per_expert,),
        tables.codes,
        tables.escapes,
        tables.selectors,
        tables.counts,
        tables.exceptions,
        tables.chunk_offsets,
        tables.segment_escapes,
        out,
        experts,
        rows_per_expert,
        segments_per_expert,
        num_experts,
        tables.rows,
        shape[-1],
    )
    return out
