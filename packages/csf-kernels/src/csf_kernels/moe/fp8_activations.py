"""W4A8's activation quantization to FP8 E4M3 (issue 47): the torch references its kernels are held to, byte for byte.

Two conventions, rows ``[T, K]`` (bf16 or float32) quantized along K:

* ``per_token``: vLLM's dynamic per-token FP8 (``scaled_fp8_quant(x, use_per_token_if_dynamic=True)``, the CUDA
  kernel ``dynamic_per_token_scaled_fp8_quant_kernel_strided`` of ``csrc/quantization/w8a8/fp8/common.cu``):
  ``scale = max(amax / 448, 1 / (448 * 512))`` in float32 (``min_scaling_factor<float8_e4m3fn>``), then each element
  ``x / scale`` (an IEEE division, not a reciprocal multiply: vLLM's native torch path multiplies by the reciprocal
  and can differ in the last bit), clamped to [-448, 448] and rounded to nearest even (``__nv_fp8_e4m3``'s
  satfinite cast). Scales float32 ``[T]``; the layer multiplies them back in its epilogue.
* ``mxfp8``: OCP MX v1.0 MXFP8, one E8M0 exponent per 32 elements along K: ``X = floor(log2(amax)) - 8`` read from
  the float32 exponent field (8 = E4M3's largest exponent, 448 = 1.75 * 2**8), clamped to [-127, 127] and stored as
  ``X + 127``; elements ``x * 2**-X`` (exact: a power of two) clamped to [-448, 448] and rounded to nearest even.
  A block's amax lands in [256, 512) after scaling, so values in (448, 512) saturate. This is torchao 0.18's
  ``to_mx(x, float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)`` byte for byte except one deliberate difference, as in
  :func:`csf_codec.quantize.quantize_mxfp4`: blocks with ``X = -127`` (amax < 2**-118) are scaled by 2**127
  exactly where torchao clamps the scale to 2**-126. An all-zero block gets byte 0 and zero elements.

Inputs are expected finite: NaN and Inf propagate differently in vLLM's CUDA kernel (its ``fmaxf``/``fminf`` drop
NaN), torch and Triton, and no convention here promises one behaviour for them.
"""

from __future__ import annotations

import torch

from csf_codec.fp4 import E4M3_MAX, E8M0_BIAS, e4m3_bytes_to_float

__all__ = [
    "ACTIVATION_CONVENTIONS",
    "E4M3_EMAX",
    "MX_BLOCK",
    "PER_TOKEN_MIN_SCALE",
    "dequantize_fp8",
    "mxfp8_quant",
    "per_token_fp8_quant",
    "quantize_activations",
]

ACTIVATION_CONVENTIONS = ("per_token", "mxfp8")
PER_TOKEN_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)  # vLLM's min_scaling_factor<c10::Float8_e4m3fn>
MX_BLOCK = 32
E4M3_EMAX = 8  # floor(log2(448))


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"activations must be 2-D bf16 or float32 rows; got {x.dtype} {tuple(x.shape)}")
    return x.float()


def _e4m3(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def per_token_fp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 bytes uint8 [T, K], float32 scales [T]) by vLLM's dynamic per-token convention (module docstring)."""
    xf = _rows(x)
    amax = xf.abs().amax(dim=1) if xf.shape[1] else xf.new_zeros(xf.shape[0])
    # a 0-dim tensor divisor, not a Python number: CUDA torch multiplies by a number's reciprocal, which differs in
    # the last bit from vLLM's (and the kernels') IEEE division
    scale = (amax / amax.new_full((), E4M3_MAX)).clamp(min=PER_TOKEN_MIN_SCALE)
    return _e4m3(xf / scale[:, None]), scale


def mxfp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 bytes uint8 [T, K], E8M0 bytes uint8 [T, K / 32]) by OCP MXFP8 (module docstring); K % 32 == 0."""
    xf = _rows(x)
    t, k = xf.shape
    if k % MX_BLOCK:
        raise ValueError(f"MXFP8 quantizes whole blocks of {MX_BLOCK} along K; got K = {k}")
    blocks = xf.reshape(t, k // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1) if k else xf.new_zeros(t, 0)
    field = (amax.view(torch.int32) >> 23) & 0xFF  # floor(log2(amax)) + 127 for normal amax
    x_exp = (field - E8M0_BIAS - E4M3_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS)
    inv = ((E8M0_BIAS - x_exp) << 23).view(torch.float32)  # 2**-X, a normal float32 for X in [-127, 120]
    q = _e4m3(blocks * inv[..., None]).view(t, k)
    return q, (x_exp + E8M0_BIAS).to(torch.uint8)


def quantize_activations(x: torch.Tensor, convention: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 bytes, scales) of ``x`` by ``convention`` (one of :data:`ACTIVATION_CONVENTIONS`)."""
    if convention == "per_token":
        return per_token_fp8_quant(x)
    if convention == "mxfp8":
        return mxfp8_quant(x)
    raise ValueError(f"unknown activation convention {convention!r}: expected one of {ACTIVATION_CONVENTIONS}")


def dequantize_fp8(q: torch.Tensor, scales: torch.Tensor, convention: str) -> torch.Tensor:
    """float32 [T, K]: the values the quantized rows stand for (per-token: ``e4m3 * scale``, rounded once in
    float32; MXFP8: ``e4m3 * 2**X``, exact)."""
    v = e4m3_bytes_to_float(q)
    if convention == "per_token":
        return v * scales[:, None]
    if convention == "mxfp8":
        x_exp = scales.to(torch.int32) - E8M0_BIAS
        return (v.view(q.shape[0], -1, MX_BLOCK) * torch.exp2(x_exp.float())[..., None]).view(q.shape)
    raise ValueError(f"unknown activation convention {convention!r}: expected one of {ACTIVATION_CONVENTIONS}")
