"""W4A8's programs (issue 47, ``docs/moe-engine.md`` "W4A8"): what ``nox -s aot_build`` builds for the FP8 engine.

FC1's input gathered by token and quantized to FP8 and FC2's input quantized in block order, one program each per
activation convention (:mod:`csf_kernels.moe.kernels.engine_fp8_gather`), and the grouped W4A8 GEMM
(:mod:`csf_kernels.moe.kernels.engine_gemm_fp8`, CuTe DSL: MXFP4 weights, per-token E4M3 activations) per block
size, plain and with each geometry's fused FC1 activation.
"""

from __future__ import annotations

from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.engine_specs import (
    ACTIVATIONS,
    ENGINE_TILE_N,
    GATHER_TOKENS,
    engine_combine_spec,
    engine_serves,
)
from csf_kernels.moe.fp8_activations import ACTIVATION_CONVENTIONS
from csf_kernels.moe.specs import MOE_PDL
from csf_kernels.runtime.programs import ProgramSpec, TritonFamily

__all__ = [
    "ENGINE_GATHER_FP8",
    "ENGINE_GATHER_MXFP8",
    "ENGINE_QUANTIZE_ROWS_FP8",
    "ENGINE_QUANTIZE_ROWS_MXFP8",
    "FP8_COLUMNS",
    "GATHER_FP8_TOKENS",
    "W4A8_FORMATS",
    "W4A8_GEMM",
    "W4A8_GEMM_CONVENTIONS",
    "W4A8_GEMM_VERSION",
    "W4A8_TILE_N",
    "gather_fp8_spec",
    "quantize_rows_fp8_spec",
    "w4a8_gemm_spec",
    "w4a8_geometry_specs",
    "w4a8_serves",
    "w4a8_specs",
    "w4a8_tile_n",
]

_MODULE = "csf_kernels.moe.kernels.engine_fp8_gather"
# FC1's gathers, version 2: by token, storing at the routes' slots the alignment writes (1: a program a slot of the
# block order, writing each route's slot itself)
ENGINE_GATHER_FP8 = TritonFamily(
    kernel="moe.engine_gather_fp8", version=2, module=_MODULE, function="engine_gather_fp8",
    signature="SIGNATURE_FP8", num_warps=8,
)  # fmt: skip
ENGINE_GATHER_MXFP8 = TritonFamily(
    kernel="moe.engine_gather_mxfp8", version=2, module=_MODULE, function="engine_gather_mxfp8",
    signature="SIGNATURE_MXFP8", num_warps=4,
)  # fmt: skip
# FC2's input (FC1's bf16 output) quantized where it lies, row by row (before: the gather over an identity slot map)
ENGINE_QUANTIZE_ROWS_FP8 = TritonFamily(
    kernel="moe.engine_quantize_rows_fp8", version=1, module=_MODULE, function="engine_quantize_rows_fp8",
    signature="SIGNATURE_ROWS_FP8", num_warps=4,
)  # fmt: skip
ENGINE_QUANTIZE_ROWS_MXFP8 = TritonFamily(
    kernel="moe.engine_quantize_rows_mxfp8", version=1, module=_MODULE, function="engine_quantize_rows_mxfp8",
    signature="SIGNATURE_ROWS_MXFP8", num_warps=4,
)  # fmt: skip
_GATHERS = {"per_token": ENGINE_GATHER_FP8, "mxfp8": ENGINE_GATHER_MXFP8}
_ROW_QUANTIZERS = {"per_token": ENGINE_QUANTIZE_ROWS_FP8, "mxfp8": ENGINE_QUANTIZE_ROWS_MXFP8}
W4A8_GEMM = "moe.w4a8_gemm"
W4A8_GEMM_VERSION = 2  # 2: waits for its predecessor in the shared producer code (griddepcontrol, PDL)
W4A8_FORMATS = ("mxfp4",)  # NVFP4 does not fold into E4M3 (docs/moe-engine.md §8.1): it stays W4A16
W4A8_GEMM_CONVENTIONS = ("per_token",)  # activation conventions the GEMM's epilogue applies
# routes a block: two m64nN fp32 accumulators a consumer thread (the promotion's) fit its 232 registers to N = 128
W4A8_TILE_N = tuple(t for t in ENGINE_TILE_N if t <= 128)
GATHER_FP8_TOKENS = GATHER_TOKENS  # tokens a program of FC1's gather (the W4A16 pass's)
# columns a program holds, FC1's gather and FC2's row quantizer alike: per-token programs loop over their rows in
# chunks (the amax needs whole rows), MXFP8 programs own one chunk each
FP8_COLUMNS = {"per_token": 1024, "mxfp8": 512}


def _family(families: dict[str, TritonFamily], convention: str) -> TritonFamily:
    if convention not in families:
        raise ValueError(f"unknown activation convention {convention!r}: expected one of {ACTIVATION_CONVENTIONS}")
    return families[convention]


def gather_fp8_spec(convention: str) -> ProgramSpec:
    """FC1's quantizing gather for an activation convention: by token, at the routes' slots (any block size)."""
    fam = _family(_GATHERS, convention)
    return ProgramSpec.of(fam.kernel, fam.version, RT=GATHER_FP8_TOKENS, BH=FP8_COLUMNS[convention],
                          PDL=MOE_PDL, num_warps=fam.num_warps)  # fmt: skip


def quantize_rows_fp8_spec(convention: str) -> ProgramSpec:
    """FC2's input quantizer for an activation convention: the block-order rows of the blocks in use, in place
    order (the block size a run-time argument)."""
    fam = _family(_ROW_QUANTIZERS, convention)
    return ProgramSpec.of(fam.kernel, fam.version, BH=FP8_COLUMNS[convention], PDL=MOE_PDL,
                          num_warps=fam.num_warps)  # fmt: skip


def w4a8_geometry_specs(geo: MoEGeometry) -> list[ProgramSpec]:
    """W4A8's programs for a geometry the engine serves: FC1's gather and FC2's row quantizer for each convention,
    and where the weights fold (MXFP4) FC1's W4A8 GEMM with the geometry's activation fused at every W4A8 block size
    and the combine over FC2's block-order rows (through each route's slot; the alignment programs that write the
    slots are the engine's, :func:`csf_kernels.moe.engine_specs.engine_geometry_specs`)."""
    if not engine_serves(geo):
        return []
    specs = [gather_fp8_spec(conv) for conv in ACTIVATION_CONVENTIONS]
    specs += [quantize_rows_fp8_spec(conv) for conv in ACTIVATION_CONVENTIONS]
    if w4a8_serves(geo):
        specs += [w4a8_gemm_spec(bm, geo.activation, geo.bias) for bm in W4A8_TILE_N]  # FC1, activation fused
        specs += [engine_combine_spec(ids64, geo.bias, inverse=True) for ids64 in (False, True)]
    return specs


def w4a8_serves(geo: MoEGeometry) -> bool:
    """Whether the W4A8 GEMM serves a geometry's weights (MXFP4: the offsets fold exactly)."""
    return geo.fmt.name in W4A8_FORMATS


def w4a8_tile_n(routes_per_expert: float) -> int:
    """Routes a block for a W4A8 call: the smallest program tile holding an expert's mean routes (the largest past
    it), as :func:`csf_kernels.moe.engine_specs.engine_tile_n` over :data:`W4A8_TILE_N`."""
    fits = [t for t in W4A8_TILE_N if t >= routes_per_expert]
    return min(fits) if fits else max(W4A8_TILE_N)


def w4a8_gemm_spec(tile_n: int, activation: str | None = None, bias: bool = False) -> ProgramSpec:
    """The grouped W4A8 GEMM for ``tile_n`` routes a block; ``activation``: FC1's, fused into its epilogue (with
    W13's ``bias``), else the plain bf16 GEMM."""
    if tile_n not in W4A8_TILE_N:
        raise ValueError(f"the W4A8 GEMM is built for {W4A8_TILE_N} routes a block; got {tile_n}")
    if bias and activation is None:
        raise ValueError("the W4A8 GEMM adds a bias only with a fused activation")
    act = 0 if activation is None else 1 + ACTIVATIONS[activation]
    return ProgramSpec.of(W4A8_GEMM, W4A8_GEMM_VERSION, TN=tile_n, ACT=act, BIAS=int(bias))


def w4a8_specs() -> list[ProgramSpec]:
    """Every plain W4A8 GEMM the AOT cache holds (they take every shape at run time)."""
    return [w4a8_gemm_spec(tn) for tn in W4A8_TILE_N]
