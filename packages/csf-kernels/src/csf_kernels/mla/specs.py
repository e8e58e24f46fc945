"""The sparse-MLA decode program family: its kernels, head blocking and the specs the catalog needs.

Heads, top-k width, rows and splits are runtime arguments; a program is fixed by its head block, the
partials' dtype and (merge) the optional attention sink and log-sum-exp output. Nothing here imports
triton.
"""

from __future__ import annotations

from dataclasses import dataclass

from csf_kernels.runtime.programs import ProgramSpec, TritonFamily

__all__ = [
    "MLA_DECODE",
    "MLA_DECODE_MMA",
    "MLA_DECODE_WGMMA",
    "MLA_DECODE_WIDE",
    "MLA_MERGE",
    "MLA_PDL",
    "OPERANDS",
    "PARTIAL_DTYPES",
    "QUERY_MODES",
    "DecodeConfig",
    "decode_spec",
    "merge_spec",
    "sparse_mla_specs",
]

MLA_DECODE = TritonFamily(
    kernel="mla.sparse_decode",
    version=2,
    module="csf_kernels.mla.kernels.triton_decode",
    function="mla_decode",
    num_warps=8,
)
MLA_DECODE_MMA = TritonFamily(
    kernel="mla.sparse_decode_mma",
    version=1,
    module="csf_kernels.mla.kernels.gluon_decode_mma",
    function="mla_decode_mma",
    num_warps=4,
    gluon=True,
)
MLA_DECODE_WGMMA = TritonFamily(
    kernel="mla.sparse_decode_wgmma",
    version=1,
    module="csf_kernels.mla.kernels.gluon_decode_wgmma",
    function="mla_decode_wgmma",
    num_warps=4,
    gluon=True,
)
MLA_DECODE_WIDE = TritonFamily(
    kernel="mla.sparse_decode_wide",
    version=1,
    module="csf_kernels.mla.kernels.gluon_decode_wide",
    function="mla_decode_wide",
    num_warps=4,
    gluon=True,
)
MLA_MERGE = TritonFamily(
    kernel="mla.merge", version=2, module="csf_kernels.mla.kernels.merge", function="mla_merge", num_warps=4
)
PARTIAL_DTYPES = ("float32", "bfloat16")
OPERANDS = ("float16", "bfloat16")
ENGINES = ("triton", "gluon", "wgmma", "wide")
_GLUON_FAMILIES = {"gluon": MLA_DECODE_MMA, "wgmma": MLA_DECODE_WGMMA, "wide": MLA_DECODE_WIDE}
# the Gluon decode programs and the merge are programmatic dependent launches (kernels/pdl.py): each waits for
# the kernel before it at its start, so a merge's launch overlaps its decode's tail and a decode's the kernel
# before it (the Triton decode engine, a sweep's reference arm, launches plainly)
MLA_PDL = 1


@dataclass(frozen=True)
class _BuiltFor:
    """What a Gluon decode program's register layouts were written for (one chunk-stage loop of its own, no
    regrouping), and the words its refusal uses."""

    head_blocks: tuple[int, ...]
    warps: tuple[int, ...]  # per program (per warpgroup partition for the warp-specialized ones)
    operand: str
    words: str


_GLUON_BUILT_FOR = {
    "gluon": _BuiltFor((16, 32), (4, 8), "float16", "16 or 32 heads on 4 or 8 warps with float16 operands"),
    "wgmma": _BuiltFor((16, 32), (4,), "float16", "16 or 32 heads on one warpgroup with float16 operands"),
    "wide": _BuiltFor((64,), (4,), "bfloat16", "64 heads on bf16 operands, one warpgroup per partition"),
}


@dataclass(frozen=True)
class DecodeConfig:
    """Heads per decode program (an MMA tile: 16, 32 or 64; 64 runs on wgmma), warps per program (per
    warpgroup partition for the warp-specialized engines),
    software-pipeline stages of the chunk loop (2: the next chunk's records gathered by ``cp.async``
    while this one is computed), the programs per SM the split policy aims at (``waves``: how many
    fit beside each other at the program's register count), the MMA operands' type (``operand``:
    float16 codes with the scales kept apart, or bf16 scaled latents) and whether the latent is
    converted once before its operand layouts (``regroup``); see kernels/mla_decode.py. ``engine``
    "gluon": kernels/mla_decode_mma.py (16 or 32 heads, 4 or 8 warps, records staged by cp.async in two
    stages of its own; split programs only, the merge finishes them); "wgmma": kernels/mla_decode_wgmma.py
    (16 or 32 heads; ``num_warps`` 4 is one of its two warpgroups, the other a warp-specialized worker;
    products transposed on wgmma; a single split's output finished in the program, as the Triton one);
    "wide": kernels/mla_decode_wide.py (64 heads along wgmma's M; a converter warpgroup stores each chunk's
    records once in shared memory as bf16, two consumer warpgroups each score half the candidates and take
    half the output columns)."""

    head_block: int = 16
    num_warps: int = MLA_DECODE.num_warps
    num_stages: int = 1
    waves: int = 1
    operand: str = "float16"
    regroup: bool = False
    engine: str = "triton"

    def __post_init__(self):
        if (
            self.head_block not in (16, 32, 64)
            or self.num_warps not in (4, 8, 16)
            or self.num_stages not in (1, 2)
            or self.waves not in (1, 2, 3, 4)
            or self.operand not in OPERANDS
        ):
            raise ValueError(f"unsupported decode config {self}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown decode engine {self.engine!r}: expected one of {ENGINES}")
        built = _GLUON_BUILT_FOR.get(self.engine)
        if built is not None and (
            self.head_block not in built.head_blocks
            or self.num_warps not in built.warps
            or self.num_stages != 1
            or self.operand != built.operand
            or self.regroup
        ):
            raise ValueError(f"the {self.engine} decode runs {built.words}, got {self}")

    @property
    def finishes_directly(self) -> bool:
        """Whether a single-split call's decode program can write the finished output (no merge)."""
        return self.engine in ("triton", "wgmma", "wide")


QUERY_MODES = {"bf16": 0, "bf16_quantized": 1, "packed": 2}  # see kernels/mla_decode.py


def decode_spec(
    config: DecodeConfig,
    partial_dtype: str = "float32",
    query: str = "bf16",
    *,
    direct: bool = False,
    sink: bool = False,
    lse: bool = False,
) -> ProgramSpec:
    """The decode program. ``direct``: one split per row, the output finished in the program (then the
    partials' dtype, absent, is not part of the key; ``sink`` and ``lse`` are the merge's options)."""
    if partial_dtype not in PARTIAL_DTYPES:
        raise ValueError(f"partial_dtype must be one of {PARTIAL_DTYPES}, got {partial_dtype!r}")
    if query not in QUERY_MODES:
        raise ValueError(f"query must be one of {tuple(QUERY_MODES)}, got {query!r}")
    if direct and not config.finishes_directly:
        raise ValueError(f"{config} does not finish outputs directly: its splits are merged")
    if config.engine in _GLUON_FAMILIES:
        family = _GLUON_FAMILIES[config.engine]
        finishing = (
            {"DIRECT": int(direct), "HAS_SINK": int(direct and sink), "WRITE_LSE": int(direct and lse)}
            if config.finishes_directly
            else {}
        )
        return ProgramSpec.of(
            family.kernel,
            family.version,
            BH=config.head_block,
            PARTIAL_BF16=int(partial_dtype == "bfloat16" and not direct),
            Q_MODE=QUERY_MODES[query],
            **finishing,
            PDL=MLA_PDL,
            num_warps=config.num_warps,
        )
    return ProgramSpec.of(
        MLA_DECODE.kernel,
        MLA_DECODE.version,
        BH=config.head_block,
        PARTIAL_BF16=int(partial_dtype == "bfloat16" and not direct),
        Q_MODE=QUERY_MODES[query],
        DIRECT=int(direct),
        HAS_SINK=int(direct and sink),
        WRITE_LSE=int(direct and lse),
        F16=int(config.operand == "float16"),
        REGROUP=int(config.regroup),
        num_warps=config.num_warps,
        **({"num_stages": config.num_stages} if config.num_stages != 1 else {}),
    )


def merge_spec(partial_dtype: str = "float32", *, sink: bool = False, lse: bool = False) -> ProgramSpec:
    if partial_dtype not in PARTIAL_DTYPES:
        raise ValueError(f"partial_dtype must be one of {PARTIAL_DTYPES}, got {partial_dtype!r}")
    return ProgramSpec.of(
        MLA_MERGE.kernel,
        MLA_MERGE.version,
        PARTIAL_BF16=int(partial_dtype == "bfloat16"),
        HAS_SINK=int(sink),
        WRITE_LSE=int(lse),
        PDL=MLA_PDL,
        num_warps=MLA_MERGE.num_warps,
    )


def sparse_mla_specs(configs) -> list[ProgramSpec]:
    """Every program decode ``configs`` need (the catalog's: :func:`csf_kernels.mla.heuristics.catalog_configs`):
    each config's programs for every query form (split, for both partial dtypes; and direct, with every finishing
    option) and every merge."""
    specs: dict[str, ProgramSpec] = {}
    for config in sorted(set(configs), key=repr):
        for query in QUERY_MODES:
            for dtype in PARTIAL_DTYPES:
                s = decode_spec(config, dtype, query)
                specs[s.key] = s
            for sink in (False, True):
                for lse in (False, True):
                    if config.finishes_directly:
                        s = decode_spec(config, "float32", query, direct=True, sink=sink, lse=lse)
                        specs[s.key] = s
    if configs:
        for dtype in PARTIAL_DTYPES:
            for sink in (False, True):
                for lse in (False, True):
                    s = merge_spec(dtype, sink=sink, lse=lse)
                    specs[s.key] = s
    return list(specs.values())
