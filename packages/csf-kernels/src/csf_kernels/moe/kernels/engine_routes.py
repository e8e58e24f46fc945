"""Routed rows for the engine GEMM (``docs/moe-engine.md`` §4.3, §4.6): 16-byte copies, the 128-byte swizzle
computed.

sm_90a has no TMA gather (``tile::gather4`` is sm_100+), and one TMA box per routed row (``1 x 64`` bf16) costs the
SM's TMA unit about 50 cycles a box on an H100: FC1 ran 10x slower than on block-order rows at 8192 tokens (256
boxes a stage), FC2's per-row store boxes cost it up to 2.3x. So rows move by plain 16-byte copies:

* FC1's gather (:func:`copy_chunk`): ``cp.async.cg`` of one 16-byte chunk of a token's row of ``x`` into the B
  stage, at the byte address the 128-byte swizzle gives it (:func:`swizzle128`: what TMA would have written there),
  zero-filled for an empty slot; each thread then arrives on the stage's mbarrier once its copies land
  (``cp.async.mbarrier.arrive.noinc``), and the consumers fence the generic-proxy writes before wgmma reads them.
* FC2's scatter (:func:`store_chunk`): one 16-byte chunk of a slot's row from the epilogue's swizzled shared
  subtile to ``out [pairs, R]`` at its route, by the 256 consumer threads, 16 to a route (a coalesced 256-byte row).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm

from csf_kernels.moe.engine_rows import CHUNK as CHUNK_BYTES  # one cp.async / vector access

__all__ = ["CHUNK_BYTES", "copy_chunk", "route_token", "store_chunk", "swizzle128"]


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


def swizzle128(addr: cutlass.Int32) -> cutlass.Int32:
    """The 128-byte swizzle of a shared byte address (a buffer 1024-byte aligned): its 16-byte chunk index (bits
    4-6) XOR its 128-byte row's index within 1024 bytes (bits 7-9), as TMA and wgmma's SW128 layouts place bytes."""
    return addr ^ ((addr >> 3) & 0x70)


def copy_chunk(dst: cutlass.Int32, src: cutlass.Int64, live: cutlass.Int32):
    """``cp.async`` 16 bytes from global ``src`` to shared ``dst``; ``live`` 0 writes zeros (reads nothing)."""
    _asm(
        "cp.async.cg.shared.global [$0], [$1], 16, $2;",
        "r,l,r,~{memory}",
        cutlass.Int32(dst), cutlass.Int64(src), cutlass.Int32(live) * CHUNK_BYTES,
    )  # fmt: skip


def store_chunk(src: cutlass.Int32, dst: cutlass.Int64):
    """16 bytes from shared ``src`` to global ``dst``."""
    _asm(
        "{\n.reg .b32 a, b, c, d;\nld.shared.v4.b32 {a, b, c, d}, [$0];\nst.global.v4.b32 [$1], {a, b, c, d};\n}",
        "r,l,~{memory}",
        cutlass.Int32(src), cutlass.Int64(dst),
    )  # fmt: skip


@cute.jit
def route_token(route: cutlass.Int32, top_k: cutlass.Int32, tokens: cutlass.Int32) -> cutlass.Int32:
    """The token row of a slot's route (``route // top_k``), or ``tokens`` (past the last row: the slot loads zeros)
    for a slot holding no route of ``[0, tokens * top_k)``."""
    token = cutlass.max(route, 0) // top_k
    if (route < 0) | (token >= tokens):
        token = tokens
    return token
