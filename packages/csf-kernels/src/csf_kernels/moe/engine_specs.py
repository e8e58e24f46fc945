"""The MoE engine's programs (``docs/moe-engine.md``): CuTe DSL, built ahead of time into shared objects.

Step 1 of the build plan is the dense FP4 x bf16 GEMM (:mod:`csf_kernels.moe.kernels.engine_dense`): one expert's
weights against dense activations, the structure the grouped FC1/FC2 programs grow from.
"""

from __future__ import annotations

from csf_kernels.runtime.programs import ProgramSpec

__all__ = [
    "ENGINE_DENSE",
    "ENGINE_DENSE_TILE_N",
    "ENGINE_DENSE_VERSION",
    "ENGINE_TILE_K",
    "ENGINE_TILE_M",
    "engine_dense_spec",
    "engine_specs",
]

ENGINE_DENSE = "moe.engine_dense"
ENGINE_DENSE_VERSION = 1
ENGINE_DENSE_TILE_N = (128, 256)  # tokens a tile: the programs the cache holds
ENGINE_TILE_M = 128  # weight rows a CTA tile: two consumer warpgroups of 64
ENGINE_TILE_K = 64  # K a stage (csf_kernels.moe.engine_panels.PANEL_STEP_K)


def engine_dense_spec(tile_n: int) -> ProgramSpec:
    if tile_n not in ENGINE_DENSE_TILE_N:
        raise ValueError(f"the dense engine GEMM is built for {ENGINE_DENSE_TILE_N} tokens a tile; got {tile_n}")
    return ProgramSpec.of(ENGINE_DENSE, ENGINE_DENSE_VERSION, TN=tile_n)


def engine_specs() -> list[ProgramSpec]:
    """Every engine program the AOT cache holds (they take every shape at run time)."""
    return [engine_dense_spec(tn) for tn in ENGINE_DENSE_TILE_N]
