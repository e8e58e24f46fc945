"""Build one CuTe DSL program spec for sm_90a into a shared object (no GPU needed; imports cutlass)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from csf_kernels.expand.specs import CUTE_ROW_BLOCK_EXPANDER, CUTE_ROW_EXPANDER, CUTE_STAGE_DECODER
from csf_kernels.moe.engine_specs import ENGINE_GEMM
from csf_kernels.moe.w4a8_specs import W4A8_GEMM
from csf_kernels.runtime.manifest import Artifact
from csf_kernels.runtime.programs import ProgramSpec

__all__ = ["compile_cute"]


def compile_cute(spec: ProgramSpec) -> Artifact:
    from csf_kernels.aot.cute_export import (
        build_cute_program,
        engine_gemm_program,
        row_block_expander_program,
        row_expander_program,
        stage_decoder_program,
        w4a8_gemm_program,
    )

    facts = spec.fact
    if spec.kernel == CUTE_STAGE_DECODER:
        prog = stage_decoder_program(int(facts["S"]), int(facts["DB"]))
    elif spec.kernel == CUTE_ROW_EXPANDER:
        prog = row_expander_program(
            int(facts["GT"]), int(facts["DB"]), int(facts["MAXS"]), int(facts["MAXST"]), int(facts["STORE"])
        )
    elif spec.kernel == CUTE_ROW_BLOCK_EXPANDER:
        prog = row_block_expander_program(int(facts["COLS"]), int(facts["DB"]), int(facts["MAXS"]), int(facts["MAXST"]))
    elif spec.kernel == ENGINE_GEMM:
        scales, io = str(facts.get("SRC", "native")), str(facts["IO"])
        schedule, ragged = str(facts.get("SCHED", "slice")), int(facts.get("RAG", 0))
        prog = engine_gemm_program(
            int(facts["TN"]),
            int(facts["ACT"]),
            bool(facts["BIAS"]),
            str(facts["FMT"]),
            scales,
            io,
            schedule,
            ragged,
            int(facts.get("OCC", 1)),
            facts.get("PART"),  # K-split partials' form, where the program stores them
            facts.get("PROBE"),  # a bound probe's loop (diagnostic programs)
        )
    elif spec.kernel == W4A8_GEMM:
        prog = w4a8_gemm_program(int(facts["TN"]), int(facts["ACT"]), bool(facts["BIAS"]))
    else:
        raise KeyError(f"no CuTe DSL builder for {spec.describe()}")
    with tempfile.TemporaryDirectory(prefix="csf-cute-") as tmp:
        meta = build_cute_program(prog, Path(tmp))
        data = Path(meta.pop("paths")["so"]).read_bytes()
    return Artifact(kind="cute_so", data=data, launch=meta)
