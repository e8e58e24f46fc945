"""Scale expansion's policy: which engine expands a plane on this device (the programs are in
:mod:`csf_kernels.expand.specs`, their launches in :mod:`csf_kernels.expand.launch`). The choices are the measured
fastest per plane shape; the figures are in docs/perf-notes.md ("Scale expansion")."""

from __future__ import annotations

import torch

from csf_codec import InlineScales, ScaleFormat
from csf_kernels import runtime
from csf_kernels.expand.specs import inline_store_bytes, row_block_covers, row_block_expander_spec, row_image_layout

__all__ = ["auto_engine", "expansion_engine"]

# Triton's tile programs store rows in pieces of this many bytes or more to stay ahead of the CuTe row images
_TRITON_MIN_STORE = 8


def auto_engine(cols: int, nbytes: int, out_ptr: int, fmt: ScaleFormat | None = None) -> str:
    """The engine "auto" takes for a ``cols``-column plane of ``nbytes`` bytes at ``out_ptr`` on a GPU: the row-block
    expander where it covers the plane and the AOT cache holds its program for this shape (the catalog's planes;
    ``fmt`` names the format); otherwise the CuTe row images where they cover the plane and either the rows are
    narrow (one column group of at most 8 full tiles, one warp per row block) or Triton could only store them in
    pieces under 8 bytes; Triton's tiles for rows they store 8 or 16 bytes at a time."""
    if fmt is not None and row_block_covers(cols, nbytes, out_ptr):
        if runtime.is_cached(row_block_expander_spec(fmt, cols)):
            return "row_block"
    layout = row_image_layout(cols, nbytes, out_ptr)
    if layout is None:
        return "triton"
    if layout.per_warp and layout.groups == 1:
        return "cute"
    return "cute" if inline_store_bytes(cols, out_ptr) < _TRITON_MIN_STORE else "triton"


def expansion_engine(inline: InlineScales, out: torch.Tensor) -> str:
    """The engine "auto" takes to expand ``inline`` into ``out`` (CPU tensors only run in Triton's interpreter:
    tests)."""
    if not out.is_cuda:
        return "triton"
    return auto_engine(inline.geometry.cols, out.numel(), out.data_ptr(), inline.fmt)
