"""Programmatic dependent launch (PDL) for the programs of one chain, such as the fused MoE layer's.

A program compiled with ``PDL`` is launched as a programmatic dependent launch (the runtime reads
``launch_pdl`` from its manifest entry): it may start while the previous kernel on its stream is still
running, so its launch latency and setup overlap that kernel's tail. It waits for that kernel's completion
and memory (``griddepcontrol.wait``) before it reads or writes global memory, and lets its own dependent
start as soon as all its programs have begun (``griddepcontrol.launch_dependents``): the dependent then
waits in turn, so kernels still complete in stream order. Both instructions are no-ops in a normal launch.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["await_predecessor", "gluon_await_predecessor"]


@triton.jit
def await_predecessor(PDL: tl.constexpr):
    """Call first, before any global memory access (Triton programs)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@gluon.jit
def gluon_await_predecessor(PDL: gl.constexpr):
    """Call first, before any global memory access (Gluon programs: they cannot call Triton functions)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise(
            "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )
