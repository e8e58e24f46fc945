"""Triton: W4A8's activations as FP8 E4M3 (issue 47): FC1's input gathered by token and quantized, FC2's quantized in
block order. Bytes and scales equal :mod:`csf_kernels.moe.fp8_activations` (the torch references) bit for bit, per
convention:

* ``per_token``: vLLM's dynamic per-token convention: a row's amax over ``hidden`` in ``BH``-column chunks, then
  each chunk divided by the scale (``div_rn``: IEEE division, as vLLM's CUDA kernel), clamped and rounded to nearest
  even; one float32 scale a row (``xscale [slots]``).
* ``mxfp8``: OCP MXFP8: each 32-column block's E8M0 exponent from its amax's exponent field, elements times
  ``2**-X`` (exact); uint8 scales ``xscale [slots, hidden / 32]``.

E4M3 bytes are stored as uint8 (``xq [slots, hidden]``). The programs:

* ``engine_gather_fp8`` / ``engine_gather_mxfp8``: FC1's input, by token (as the W4A16 pass
  ``engine_glue.engine_gather_tokens``): a program reads ``RT`` tokens' rows of ``x`` once, quantizes each once and
  stores its bytes and scale(s) at each of the token's routes' slots (``route_slots [tokens * top_k]``, the
  alignment's inverse: -1, or a slot past ``slots``, stores nothing). Per-token programs own whole rows (the amax
  needs them: a second pass over the program's rows re-reads them from the caches); MXFP8 programs own ``BH``
  columns. A slot without a route is not written (``docs/moe-engine.md`` §8.2: its bytes and scale reach only that
  slot's own GEMM outputs, which nothing reads).
* ``engine_quantize_rows_fp8`` / ``engine_quantize_rows_mxfp8``: FC2's input, FC1's bf16 output ``a [slots,
  hidden]`` quantized row by row where it lies (block order), one program a row (per-token) or a (row, ``BH``
  columns) (MXFP8); rows of the blocks in use only (``s < meta[0] * bm``, device data: graph-safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.runtime.pdl import await_predecessor

_GATHER = {"x": "*bf16", "route_slots": "*i32", "xq": "*u8"}
_GATHER_SIZES = {
    "tokens": "i32",
    "hidden": "i32",
    "top_k": "i32",
    "slots": "i32",  # xq's rows: a slot past them (never written by the alignment) is not stored
    "RT": "constexpr",  # tokens a program
    "BH": "constexpr",
    "PDL": "constexpr",
}
SIGNATURE_FP8 = {**_GATHER, "xscale": "*fp32", **_GATHER_SIZES}
SIGNATURE_MXFP8 = {**_GATHER, "xscale": "*u8", **_GATHER_SIZES}
_ROWS = {"a": "*bf16", "meta": "*i32", "xq": "*u8"}
_ROWS_SIZES = {"hidden": "i32", "bm": "i32", "BH": "constexpr", "PDL": "constexpr"}
SIGNATURE_ROWS_FP8 = {**_ROWS, "xscale": "*fp32", **_ROWS_SIZES}
SIGNATURE_ROWS_MXFP8 = {**_ROWS, "xscale": "*u8", **_ROWS_SIZES}
MULTIPLE_OF = {"hidden": 32}

E4M3_MAX = tl.constexpr(448.0)
PER_TOKEN_MIN_SCALE = tl.constexpr(1.0 / (448.0 * 512.0))  # vLLM's min_scaling_factor<float8_e4m3fn>


@triton.jit
def _e4m3_bytes(v):
    return tl.clamp(v, -E4M3_MAX, E4M3_MAX).to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def _per_token_scale(amax):
    """vLLM's per-token scale of a row whose amax is ``amax`` (float32)."""
    return tl.maximum(tl.math.div_rn(amax, E4M3_MAX), PER_TOKEN_MIN_SCALE)


@triton.jit
def _mx_exponents(amax):
    """OCP MXFP8's ``X = floor(log2 amax) - 8`` of each 32-element block's amax, clamped to [-127, 127] (int32), and
    ``2**-X`` (float32, exact)."""
    field = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # floor(log2(amax)) + 127
    x_exp = tl.minimum(tl.maximum(field - 135, -127), 127)
    return x_exp, ((127 - x_exp) << 23).to(tl.float32, bitcast=True)


@triton.jit
def engine_gather_fp8(x, route_slots, xq, xscale, tokens, hidden, top_k, slots, RT: tl.constexpr, BH: tl.constexpr,
                      PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    t = tl.program_id(0) * RT + tl.arange(0, RT)
    held = t < tokens
    src = x + t.to(tl.int64)[:, None] * hidden
    cols = tl.arange(0, BH)
    amax = tl.zeros([RT], dtype=tl.float32)
    for c in range(0, hidden, BH):
        m = held[:, None] & (c + cols < hidden)[None, :]
        v = tl.load(src + c + cols[None, :], mask=m, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(v), axis=1))
    scale = _per_token_scale(amax)
    for c in range(0, hidden, BH):
        m = held[:, None] & (c + cols < hidden)[None, :]
        v = tl.load(src + c + cols[None, :], mask=m, other=0.0).to(tl.float32)
        q = _e4m3_bytes(tl.math.div_rn(v, scale[:, None]))
        for j in range(0, top_k):
            s = tl.load(route_slots + t * top_k + j, mask=held, other=-1)
            live = (s >= 0) & (s < slots)
            dst = xq + tl.where(live, s, 0).to(tl.int64)[:, None] * hidden + c + cols[None, :]
            tl.store(dst, q, mask=m & live[:, None])
    for j in range(0, top_k):
        s = tl.load(route_slots + t * top_k + j, mask=held, other=-1)
        live = (s >= 0) & (s < slots)
        tl.store(xscale + tl.where(live, s, 0), scale, mask=live)


@triton.jit
def engine_gather_mxfp8(x, route_slots, xq, xscale, tokens, hidden, top_k, slots, RT: tl.constexpr, BH: tl.constexpr,
                        PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    t = tl.program_id(0) * RT + tl.arange(0, RT)
    held = t < tokens
    c = tl.program_id(1) * BH + tl.arange(0, BH)
    m = held[:, None] & (c < hidden)[None, :]
    v = tl.load(x + t.to(tl.int64)[:, None] * hidden + c[None, :], mask=m, other=0.0).to(tl.float32)
    blocks = tl.reshape(v, [RT, BH // 32, 32])
    x_exp, inv = _mx_exponents(tl.max(tl.abs(blocks), axis=2))
    q = tl.reshape(_e4m3_bytes(blocks * inv[:, :, None]), [RT, BH])
    e8m0 = (x_exp + 127).to(tl.uint8)
    b = tl.program_id(1) * (BH // 32) + tl.arange(0, BH // 32)
    in_row = (b < hidden // 32)[None, :]
    for j in range(0, top_k):
        s = tl.load(route_slots + t * top_k + j, mask=held, other=-1)
        live = (s >= 0) & (s < slots)
        row = tl.where(live, s, 0).to(tl.int64)[:, None]
        tl.store(xq + row * hidden + c[None, :], q, mask=m & live[:, None])
        tl.store(xscale + row * (hidden // 32) + b[None, :], e8m0, mask=in_row & live[:, None])


@triton.jit
def engine_quantize_rows_fp8(a, meta, xq, xscale, hidden, bm, BH: tl.constexpr, PDL: tl.constexpr):
    await_predecessor(PDL)
    s = tl.program_id(0)
    if s >= tl.load(meta) * bm:
        return
    cols = tl.arange(0, BH)
    src = a + s.to(tl.int64) * hidden
    amax = tl.zeros([], dtype=tl.float32)
    for c in range(0, hidden, BH):
        v = tl.load(src + c + cols, mask=c + cols < hidden, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(v)))
    scale = _per_token_scale(amax)
    dst = xq + s.to(tl.int64) * hidden
    for c in range(0, hidden, BH):
        m = c + cols < hidden
        v = tl.load(src + c + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(dst + c + cols, _e4m3_bytes(tl.math.div_rn(v, scale)), mask=m)
    tl.store(xscale + s, scale)


@triton.jit
def engine_quantize_rows_mxfp8(a, meta, xq, xscale, hidden, bm, BH: tl.constexpr, PDL: tl.constexpr):
    await_predecessor(PDL)
    s = tl.program_id(0)
    if s >= tl.load(meta) * bm:
        return
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    m = cols < hidden
    v = tl.load(a + s.to(tl.int64) * hidden + cols, mask=m, other=0.0).to(tl.float32)
    blocks = tl.reshape(v, [BH // 32, 32])
    x_exp, inv = _mx_exponents(tl.max(tl.abs(blocks), axis=1))
    q = tl.reshape(_e4m3_bytes(blocks * inv[:, None]), [BH])
    tl.store(xq + s.to(tl.int64) * hidden + cols, q, mask=m)
    b = tl.program_id(1) * (BH // 32) + tl.arange(0, BH // 32)
    tl.store(xscale + s.to(tl.int64) * (hidden // 32) + b, (x_exp + 127).to(tl.uint8), mask=b < hidden // 32)
