"""Build-time side of the AOT cache: compiling programs and writing ``aot_cache/`` (imports triton/cutlass)."""
