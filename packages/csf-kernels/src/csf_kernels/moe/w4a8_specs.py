"""W4A8's programs (issue 47, ``docs/moe-engine.md`` "W4A8"): what ``nox -s aot_build`` builds for the FP8 engine.

So far the activation side: FC1's route gather fused with FP8 quantization, one program per route-block size and
activation convention (:mod:`csf_kernels.moe.kernels.engine_fp8_gather`). The FP8 grouped GEMM comes with its own
specs when it exists.
"""

from __future__ import annotations

from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.engine_specs import ENGINE_TILE_N, engine_serves
from csf_kernels.moe.fp8_activations import ACTIVATION_CONVENTIONS
from csf_kernels.moe.specs import MOE_PDL
from csf_kernels.runtime.programs import ProgramSpec, TritonFamily

__all__ = ["ENGINE_GATHER_FP8", "ENGINE_GATHER_MXFP8", "gather_fp8_spec", "w4a8_geometry_specs"]

_MODULE = "csf_kernels.moe.kernels.engine_fp8_gather"
ENGINE_GATHER_FP8 = TritonFamily(
    kernel="moe.engine_gather_fp8", version=1, module=_MODULE, function="engine_gather_fp8",
    signature="SIGNATURE_FP8", num_warps=4,
)  # fmt: skip
ENGINE_GATHER_MXFP8 = TritonFamily(
    kernel="moe.engine_gather_mxfp8", version=1, module=_MODULE, function="engine_gather_mxfp8",
    signature="SIGNATURE_MXFP8", num_warps=4,
)  # fmt: skip
_FAMILIES = {"per_token": ENGINE_GATHER_FP8, "mxfp8": ENGINE_GATHER_MXFP8}
# columns a program holds: per-token programs loop over the row in chunks; MXFP8 programs own one chunk each
GATHER_FP8_COLUMNS = {"per_token": 1024, "mxfp8": 512}


def gather_fp8_spec(bm: int, convention: str) -> ProgramSpec:
    """The gather-and-quantize program for blocks of ``bm`` routes and an activation convention."""
    if bm not in ENGINE_TILE_N:
        raise ValueError(f"the engine's route blocks are {ENGINE_TILE_N} routes; got {bm}")
    if convention not in _FAMILIES:
        raise ValueError(f"unknown activation convention {convention!r}: expected one of {ACTIVATION_CONVENTIONS}")
    fam = _FAMILIES[convention]
    return ProgramSpec.of(fam.kernel, fam.version, BM=bm, BH=GATHER_FP8_COLUMNS[convention], PDL=MOE_PDL,
                          num_warps=fam.num_warps)  # fmt: skip


def w4a8_geometry_specs(geo: MoEGeometry) -> list[ProgramSpec]:
    """W4A8's programs for a geometry the engine serves: the gather at every block size and convention."""
    if not engine_serves(geo):
        return []
    return [gather_fp8_spec(bm, conv) for bm in ENGINE_TILE_N for conv in ACTIVATION_CONVENTIONS]
