"""The MoE engine's programs (``docs/moe-engine.md``): CuTe DSL, built ahead of time into shared objects.

The grouped FP4 x bf16 GEMM (:mod:`csf_kernels.moe.kernels.engine_gemm`) serves route blocks of any expert and, with
one expert, a dense GEMM; one program per route-block size, every shape at run time.
"""

from __future__ import annotations

from csf_kernels.runtime.programs import ProgramSpec

__all__ = [
    "ENGINE_GEMM",
    "ENGINE_GEMM_VERSION",
    "ENGINE_TILE_K",
    "ENGINE_TILE_M",
    "ENGINE_TILE_N",
    "engine_gemm_spec",
    "engine_specs",
]

ENGINE_GEMM = "moe.engine_gemm"
ENGINE_GEMM_VERSION = 1
ENGINE_TILE_N = (64, 128, 256)  # routes a block: the programs the cache holds
ENGINE_TILE_M = 128  # weight rows a CTA tile: two consumer warpgroups of 64
ENGINE_TILE_K = 64  # K a stage (csf_kernels.moe.engine_panels.PANEL_STEP_K)


def engine_gemm_spec(tile_n: int) -> ProgramSpec:
    if tile_n not in ENGINE_TILE_N:
        raise ValueError(f"the engine GEMM is built for {ENGINE_TILE_N} routes a block; got {tile_n}")
    return ProgramSpec.of(ENGINE_GEMM, ENGINE_GEMM_VERSION, TN=tile_n)


def engine_specs() -> list[ProgramSpec]:
    """Every engine program the AOT cache holds (they take every shape at run time)."""
    return [engine_gemm_spec(tn) for tn in ENGINE_TILE_N]
