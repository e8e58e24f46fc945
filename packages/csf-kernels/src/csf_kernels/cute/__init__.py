"""CuTe DSL programs of csf and their ahead-of-time export (build time only: the modules import cutlass).

Nothing here is imported at run time; :mod:`csf_kernels.cute_so` loads the built shared objects with ctypes.
"""
