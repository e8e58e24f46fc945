"""Triton: W4A8's FC1 input (issue 47), the engine's route gather fused with FP8 E4M3 quantization.

Slot ``s`` of the block order (``sorted_ids``, from the alignment) takes token ``sorted_ids[s] // k``'s row of ``x``
and writes it quantized, with its scale, at row ``s``; each route's slot goes to ``inverse``. A block's empty slots
quantize a zero row. Bytes and scales equal :mod:`csf_kernels.moe.fp8_activations` (the torch references) on the
gathered rows, bit for bit:

* ``engine_gather_fp8``: vLLM's dynamic per-token convention, one program a slot: the row's amax over ``hidden`` in
  ``BH``-column chunks, then each chunk divided by the scale (``div_rn``: IEEE division, as vLLM's CUDA kernel),
  clamped and rounded to nearest even; scales float32 ``[slots]``.
* ``engine_gather_mxfp8``: OCP MXFP8, one program a (slot, ``BH`` columns): each 32-column block's E8M0 exponent
  from its amax's exponent field, elements times ``2**-X`` (exact); scales uint8 ``[slots, hidden / 32]``.

E4M3 bytes are stored as uint8 (``xq [slots, hidden]``). Every program first checks its slot against the blocks in
use (``meta[0]``, device data: graph-safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.moe.kernels.engine_glue import slot_route
from csf_kernels.runtime.pdl import await_predecessor

_COMMON = {
    "x": "*bf16",
    "sorted_ids": "*i32",
    "meta": "*i32",
    "xq": "*u8",
}
_SIZES = {"inverse": "*i32", "hidden": "i32", "top_k": "i32", "pairs": "i32"}
_CONSTS = {"BM": "constexpr", "BH": "constexpr", "PDL": "constexpr"}
SIGNATURE_FP8 = {**_COMMON, "xscale": "*fp32", **_SIZES, **_CONSTS}
SIGNATURE_MXFP8 = {**_COMMON, "xscale": "*u8", **_SIZES, **_CONSTS}
MULTIPLE_OF = {"hidden": 32}

E4M3_MAX = tl.constexpr(448.0)
PER_TOKEN_MIN_SCALE = tl.constexpr(1.0 / (448.0 * 512.0))  # vLLM's min_scaling_factor<float8_e4m3fn>


@triton.jit
def _e4m3_bytes(v):
    return tl.clamp(v, -E4M3_MAX, E4M3_MAX).to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def engine_gather_fp8(x, sorted_ids, meta, xq, xscale, inverse, hidden, top_k, pairs, BM: tl.constexpr,
                      BH: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    s = tl.program_id(0)
    used, live, row, route = slot_route(sorted_ids, meta, s, top_k, pairs, BM)
    if not used:
        return
    cols = tl.arange(0, BH)
    src = x + row * hidden
    amax = tl.zeros([], dtype=tl.float32)
    for c in range(0, hidden, BH):
        v = tl.load(src + c + cols, mask=(c + cols < hidden) & live, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(v)))
    scale = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), PER_TOKEN_MIN_SCALE)
    dst = xq + s.to(tl.int64) * hidden
    for c in range(0, hidden, BH):
        m = c + cols < hidden
        v = tl.load(src + c + cols, mask=m & live, other=0.0).to(tl.float32)
        tl.store(dst + c + cols, _e4m3_bytes(tl.math.div_rn(v, scale)), mask=m)
    tl.store(xscale + s, scale)
    if live:
        tl.store(inverse + route, s)


@triton.jit
def engine_gather_mxfp8(x, sorted_ids, meta, xq, xscale, inverse, hidden, top_k, pairs, BM: tl.constexpr,
                        BH: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    s = tl.program_id(0)
    used, live, row, route = slot_route(sorted_ids, meta, s, top_k, pairs, BM)
    if not used:
        return
    c = tl.program_id(1) * BH
    cols = c + tl.arange(0, BH)
    m = cols < hidden
    v = tl.load(x + row * hidden + cols, mask=m & live, other=0.0).to(tl.float32)
    blocks = tl.reshape(v, [BH // 32, 32])
    amax = tl.max(tl.abs(blocks), axis=1)
    field = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # floor(log2(amax)) + 127
    x_exp = tl.minimum(tl.maximum(field - 135, -127), 127)
    inv = ((127 - x_exp) << 23).to(tl.float32, bitcast=True)  # 2**-X
    q = tl.reshape(_e4m3_bytes(blocks * inv[:, None]), [BH])
    tl.store(xq + s.to(tl.int64) * hidden + cols, q, mask=m)
    b = c // 32 + tl.arange(0, BH // 32)
    tl.store(xscale + s.to(tl.int64) * (hidden // 32) + b, (x_exp + 127).to(tl.uint8), mask=b < hidden // 32)
    if live and tl.program_id(1) == 0:
        tl.store(inverse + route, s)
