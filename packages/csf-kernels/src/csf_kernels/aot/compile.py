"""Compile one program spec for sm_90a, whatever its dialect (no GPU needed): the AOT build's and the development
runtime's compiler."""

from __future__ import annotations

from csf_kernels.runtime.manifest import Artifact
from csf_kernels.runtime.programs import ProgramSpec, is_triton

__all__ = ["compile_program"]


def compile_program(spec: ProgramSpec) -> Artifact:
    """Triton and Gluon programs through Triton, the rest through CuTe DSL (each imports its compiler)."""
    if is_triton(spec):
        from csf_kernels.aot.compile_triton import compile_triton

        return compile_triton(spec)
    from csf_kernels.aot.compile_cute import compile_cute

    return compile_cute(spec)
