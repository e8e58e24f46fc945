"""csf-kernels: every GPU program of csf (Triton and CuTe DSL kernels for sm_90a) and the
ahead-of-time cache runtime that loads them from ``aot_cache/`` without lowering or compiling.

Depends only on csf-codec. Not built yet: see the AOT issue.
"""
