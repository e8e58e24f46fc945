"""Triton: copy activations [rows, K] bf16 into the decode GEMM's relabelled K order, [rows, KP] with KP = K
rounded up to whole steps and the padding zero (``csf_kernels.moe.relabel``): FC1's input for wgmma programs
that copy their activations straight into the operand (``XR``)."""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.runtime.pdl import await_predecessor

SIGNATURE = {
    "x": "*bf16",
    "out": "*bf16",
    "K": "i32",
    "KP": "i32",
    "STEP": "constexpr",  # columns per K step: 128 (MXFP4) or 64 (NVFP4)
    "BLOCK": "constexpr",  # output columns per program
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}
MULTIPLE_OF = {"K": 16, "KP": 64}


@triton.jit
def actual_column(logical, STEP: tl.constexpr):
    """The actual column a relabelled (logical) column holds (csf_kernels.moe.relabel)."""
    L = logical % STEP
    i0 = L & 1
    t = (L >> 1) & 3
    i1 = (L >> 3) & 1
    i2 = (L >> 4) & 1
    q = L >> 5
    return logical - L + (STEP // 4) * t + 8 * q + 4 * i2 + 2 * i1 + i0


@triton.jit
def logical_column(actual, STEP: tl.constexpr):
    """Where an actual column goes in the relabelled order (the inverse of ``actual_column``)."""
    a = actual % STEP
    t = a // (STEP // 4)
    r = a % (STEP // 4)
    return actual - a + 32 * (r >> 3) + 16 * ((r >> 2) & 1) + 8 * ((r >> 1) & 1) + 2 * t + (r & 1)


@triton.jit
def moe_relabel(x, out, K, KP, STEP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    await_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    src = actual_column(col, STEP)
    v = tl.load(x + row * K + src, mask=(col < KP) & (src < K), other=0.0)
    tl.store(out + row * KP + col, v, mask=col < KP)
