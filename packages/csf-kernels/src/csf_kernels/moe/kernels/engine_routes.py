"""Routed rows for the engine GEMM (``docs/moe-engine.md`` §4.3, §4.6): one TMA box per row, each lane of a warp
its own rows.

sm_90a has no TMA gather (``tile::gather4`` is sm_100+), and CuTe's ``cute.copy`` of a TMA atom issues from one
elected lane, so a per-row copy through it would serialize a block's rows on one lane. These helpers issue
``cp.async.bulk.tensor.2d`` by inline PTX from every lane that calls them, with the descriptor CuTe built on the
host (:func:`row_atom`: a box of one row of 64 bf16, the 128-byte swizzle's width) and an unswizzled shared address:
TMA swizzles by destination (or source) address bits, so a row box written at a row's start lands exactly where a
whole-tile box with the same swizzle would have put it, as wgmma's and ``stmatrix``'s layouts expect.

* FC1's gather (:func:`load_row`): the row of ``x [tokens, K]`` at ``(k, token)`` into row ``i`` of a B stage, its
  bytes completing on the stage's mbarrier. A slot without a route passes a token past ``x``'s rows: TMA fills the
  box with zeros and still counts its bytes, so the stage's transaction count stays ``TILE_N * 128``.
* FC2's scatter (:func:`store_row`): 64 output columns of one route from the epilogue's shared subtile to
  ``out [pairs, R]`` at ``(m, route)``, committed as this lane's bulk group.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import cute as _cute_ir
from cutlass._mlir.dialects import cute_nvgpu as _cute_nvgpu_ir
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync

__all__ = ["ROW_K", "desc_addr", "load_row", "route_token", "row_atom", "store_row"]

ROW_K = 64  # bf16 a row box: 128 bytes, the widest box a 128-byte swizzle takes


def row_atom(op, tensor: cute.Tensor, swizzled: cute.ComposedLayout, box: tuple[int, int]):
    """A TMA atom copying one ``box`` (``(1, 64)``: a row of a K-major tensor; ``(64, 1)``: a column of an M-major
    one) between ``tensor`` and shared memory laid out with ``swizzled``'s swizzle (what sets the descriptor's
    swizzle mode)."""
    stride = (box[1], 1) if box[0] == 1 else (1, box[0])
    layout = cute.make_composed_layout(swizzled.inner, 0, cute.make_layout(box, stride=stride))
    return cpasync.make_tiled_tma_atom(op, tensor, layout, box)


def desc_addr(atom: cute.CopyAtom) -> cutlass.Int64:
    """The generic address of a TMA atom's descriptor (a kernel parameter), for :func:`load_row` and
    :func:`store_row`."""
    ty = _cute_ir.PtrType.get(cutlass.Int8.mlir_type, _cute_ir.AddressSpace.generic, 64, None)
    ptr = _cute_nvgpu_ir.get_tma_desc_addr(ty, _cute_nvgpu_ir.atom_make_exec_tma(atom._trait.value))
    return ptr.toint()


def _asm(ptx: str, constraints: str, *args) -> None:
    llvm.inline_asm(
        None,
        [a.ir_value() for a in args],
        ptx,
        constraints,
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def load_row(desc: cutlass.Int64, dst: cutlass.Int32, k: cutlass.Int32, row: cutlass.Int32, bar: cutlass.Int32):
    """Copy the box at ``(k, row)`` to shared address ``dst`` (a row's unswizzled start), its bytes completing on
    the mbarrier at shared address ``bar``."""
    _asm(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {$2, $3}], [$4];",
        "r,l,r,r,r,~{memory}",
        cutlass.Int32(dst), cutlass.Int64(desc), cutlass.Int32(k), cutlass.Int32(row), cutlass.Int32(bar),
    )  # fmt: skip


def store_row(desc: cutlass.Int64, src: cutlass.Int32, m: cutlass.Int32, row: cutlass.Int32):
    """Copy the box at shared address ``src`` to ``(m, row)`` of the tensor; commit it with the lane's bulk group
    (``cute.arch.cp_async_bulk_commit_group``) and wait for its reads before ``src`` is rewritten."""
    _asm(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [$0, {$1, $2}], [$3];",
        "l,r,r,r,~{memory}",
        cutlass.Int64(desc), cutlass.Int32(m), cutlass.Int32(row), cutlass.Int32(src),
    )  # fmt: skip


@cute.jit
def route_token(route: cutlass.Int32, top_k: cutlass.Int32, tokens: cutlass.Int32) -> cutlass.Int32:
    """The token row of a slot's route (``route // top_k``), or ``tokens`` (past the last row: TMA reads zeros) for
    a slot holding no route of ``[0, tokens * top_k)``."""
    token = cutlass.max(route, 0) // top_k
    if (route < 0) | (token >= tokens):
        token = tokens
    return token
