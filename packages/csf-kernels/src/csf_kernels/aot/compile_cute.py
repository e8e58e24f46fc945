"""Build one CuTe DSL program spec for sm_90a into a shared object (no GPU needed; imports cutlass)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..families import CUTE_STAGE_DECODER
from ..manifest import Artifact
from ..programs import ProgramSpec

__all__ = ["compile_cute"]


def compile_cute(spec: ProgramSpec) -> Artifact:
    if spec.kernel != CUTE_STAGE_DECODER:
        raise KeyError(f"no CuTe DSL builder for {spec.describe()}")
    from ..cute.export import build_stage_decoder

    facts = spec.fact
    with tempfile.TemporaryDirectory(prefix="csf-cute-") as tmp:
        meta = build_stage_decoder(int(facts["S"]), Path(tmp), delta_bits=int(facts["DB"]))
        data = Path(meta.pop("paths")["so"]).read_bytes()
    return Artifact(kind="cute_so", data=data, launch=meta)
