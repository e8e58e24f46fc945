"""csf-kernels: every GPU program of csf (Triton and CuTe DSL kernels for sm_90a) and the
ahead-of-time cache runtime that loads them from ``aot_cache/`` without lowering or compiling.

* :mod:`csf_kernels.runtime`: the frozen runtime (``program``, ``freeze``, ``UncachedProgramError``);
* :mod:`csf_kernels.expand`: CSF -> native scale planes on the GPU (inline and compact forms);
* :mod:`csf_kernels.expand_layer`: a layer's planes (W13, W2) expanded concurrently on two streams;
* :mod:`csf_kernels.cute_so`: loader of the CuTe DSL programs exported as shared objects;
* :mod:`csf_kernels.aot`: ``nox -s aot_build`` (build time only: imports triton and cutlass).

Depends only on csf-codec (and torch, cuda-bindings, pyyaml). See docs/aot-cache.md.
"""
