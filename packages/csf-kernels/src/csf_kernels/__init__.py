"""csf-kernels: every GPU program of csf (Triton, Gluon and CuTe DSL kernels for sm_90a) and the ahead-of-time
cache runtime that loads them from ``aot_cache/`` without lowering or compiling.

| package | job |
|---|---|
| :mod:`csf_kernels.runtime` | the frozen runtime: cache, manifest, loaders, launches, settings |
| :mod:`csf_kernels.record` | the CSF inline record on the GPU: its constants and decode helpers in each dialect |
| :mod:`csf_kernels.expand` | CSF -> native scale planes on the GPU (inline and compact forms) |
| :mod:`csf_kernels.moe` | the fused MoE programs: route alignment, grouped GEMMs, combine |
| :mod:`csf_kernels.mla` | DeepSeek-style sparse MLA decode |
| :mod:`csf_kernels.aot` | ``nox -s aot_build`` (build time only: imports triton and cutlass) |

Each operation holds its host API (``launch``), its program specs (``specs``), its policy (``heuristics``, which
reads the device) and its device code (``kernels/``). Operations import the runtime, the record and the catalog,
never each other. Depends only on csf-codec (and torch, cuda-bindings, pyyaml). See docs/aot-cache.md.
"""

from csf_kernels.runtime import set_compiler as _set_compiler


def _compile_on_miss(spec):
    """Development (unfrozen) runtime: compile a program the AOT cache lacks with the build's own compilers."""
    from csf_kernels.aot.compile import compile_program

    return compile_program(spec)


_set_compiler(_compile_on_miss)
