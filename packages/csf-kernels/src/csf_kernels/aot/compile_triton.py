"""Compile one Triton program spec for sm_90a, on any machine (no GPU, no driver needed)."""

from __future__ import annotations

from csf_kernels.runtime.manifest import Artifact
from csf_kernels.runtime.programs import ProgramSpec, assumed_multiples, triton_family

__all__ = ["compile_triton"]


def compile_triton(spec: ProgramSpec) -> Artifact:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    family = triton_family(spec.kernel)
    if family.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource

    fn, signature, module = family.source()
    facts = spec.fact
    constexprs = {k: facts[k] for k, t in signature.items() if t == "constexpr"}
    multiples = assumed_multiples(signature, getattr(module, "MULTIPLE_OF", {}))
    # what Triton's JIT would specialise on: 16-divisible pointers and integers (the runtime checks them)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(signature) if multiples.get(n, 1) % 16 == 0}
    src = ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": facts["num_warps"], "num_stages": facts.get("num_stages", 1)}
    if "maxnreg" in facts:
        options["maxnreg"] = facts["maxnreg"]
    if facts.get("PDL"):  # the program waits for its predecessor (runtime/pdl.py): launch it as a dependent
        options["launch_pdl"] = True
    # no line info: it names the source files by absolute path, so the bytes would depend on where the checkout
    # lies and a shared Triton cache could hand one checkout's cubin to another's build (the knob is part of
    # Triton's cache key). The SASS is the same either way.
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.disable_line_info = True
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    md = compiled.metadata
    if md.num_ctas != 1 or md.launch_cooperative_grid:
        raise NotImplementedError(f"{spec.describe()}: cluster or cooperative launches are not supported yet")
    params = [(name, t) for name, t in signature.items() if t != "constexpr"]
    launch = {
        "entry": md.name,
        "block": [32 * md.num_warps, 1, 1],
        "shared": md.shared,
        # Triton appends two implicit u64 pointers to every entry: global scratch, profile scratch
        "global_scratch": [md.global_scratch_size, md.global_scratch_align],
        "profile_scratch": [md.profile_scratch_size, md.profile_scratch_align],
        "params": [t for _, t in params],
        "param_names": [n for n, _ in params],
        "multiples": {n: multiples[n] for n, _ in params if n in multiples},
        "triton": triton.__version__,
        "pdl": bool(md.launch_pdl),
    }
    return Artifact(kind="triton_cubin", data=bytes(compiled.asm["cubin"]), launch=launch)
