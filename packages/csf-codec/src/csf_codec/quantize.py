"""Reference MXFP4 / NVFP4 quantizers and dequantizers, used to make test checkpoints.

Both work on any leading dims ([N, K], [E, N, K], ...) with blocks along the last dim, in float32, a chunk of
rows at a time so that a [384, 1152, 5120] expert stack never needs more than one chunk of temporaries.
Outputs are byte-for-byte what torchao 0.18's ``to_mx(..., ScaleCalculationMode.FLOOR)`` and
``nvfp4_quantize`` produce for finite inputs (tests/codec/test_quantize.py checks this); the few places where
they differ on purpose are listed in each docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .formats import MXFP4, NVFP4, ScaleFormat
from .fp4 import (
    E2M1_MAX,
    E4M3_MAX,
    E8M0_BIAS,
    E8M0_NAN_BYTE,
    e2m1_to_float,
    e4m3_bytes_to_float,
    e8m0_to_float,
    float_to_e2m1,
    float_to_e4m3_bytes,
    pack_fp4,
    unpack_fp4,
)

__all__ = [
    "MXFP4Weights",
    "NVFP4Weights",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "nvfp4_global_scale",
    "quantize_mxfp4",
    "quantize_nvfp4",
]

_E2M1_EMAX = 2  # exponent of E2M1's largest normal, 6 = 1.5 * 2**2
_E4M3_MIN_NORMAL = 2.0**-6  # torchao's floor for NVFP4 block scales (finfo(float8_e4m3fn).tiny)
_CHUNK_ELEMENTS = 1 << 22  # ~16 MiB of float32 per chunk keeps peak memory flat for any tensor size


@dataclass(frozen=True, kw_only=True)
class MXFP4Weights:
    values: torch.Tensor  # uint8 [..., K//2], packed E2M1 codes
    scales: torch.Tensor  # uint8 [..., K//32], E8M0 (bias 127, 0xFF = NaN)


@dataclass(frozen=True, kw_only=True)
class NVFP4Weights:
    values: torch.Tensor  # uint8 [..., K//2], packed E2M1 codes
    scales: torch.Tensor  # uint8 [..., K//16], float8_e4m3fn bits
    global_scale: torch.Tensor  # float32 0-d; w ~= e2m1 * e4m3(scale) * global_scale


def quantize_mxfp4(w: torch.Tensor, *, chunk_rows: int | None = None) -> MXFP4Weights:
    """OCP MX v1.0 MXFP4: per 32 weights along K, one E8M0 exponent X and 32 E2M1 elements w / 2**X.

    - X = floor(log2(amax(|block|))) - 2, clamped to [-127, 127], stored as X + 127. floor(log2) is read from
      the float32 exponent field, like torchao's FLOOR mode; for every finite input this is the exact floor.
    - Elements: w / 2**X rounded to nearest E2M1, ties to even, saturating at +-6.
    - All-zero block: amax 0 gives X = -inf, clamped to -127, so scale byte 0 and all element codes 0
      (torchao does the same, and it is the byte an E8M0 encoder clamps to).
    - A block holding NaN gets scale 0xFF and element codes 0: the NaN scale makes the whole block NaN.
    - A block holding +-Inf (no NaN) gets X = 126 from the exponent field (as torchao), Inf elements saturate.
    - Deliberate difference from torchao: blocks with X = -127 divide by 2**-127 exactly; torchao divides by
      2**-126 (it clamps the float scale to the smallest normal), which halves such blocks' elements and
      breaks dequantize -> quantize idempotence. Only blocks with amax < 2**-124 are affected.
    """
    k = _block_columns(w, MXFP4)

    def chunk(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = x.view(x.shape[0], -1, MXFP4.block_size)
        amax = blocks.abs().amax(dim=-1)
        exp_field = (amax.view(torch.int32) >> 23) & 0xFF  # biased float32 exponent = floor(log2) + 127
        x_exp = (exp_field - 127 - _E2M1_EMAX).clamp_(-E8M0_BIAS, E8M0_BIAS)
        scales = (x_exp + E8M0_BIAS).to(torch.uint8).masked_fill_(torch.isnan(amax), E8M0_NAN_BYTE)
        codes = float_to_e2m1(blocks / e8m0_to_float(scales).unsqueeze(-1))  # power-of-two divide: exact
        return pack_fp4(codes.view(x.shape[0], k)), scales

    values, scales = _quantize_rows(w, chunk, k, MXFP4, chunk_rows)
    return MXFP4Weights(values=values, scales=scales)


def dequantize_mxfp4(values: torch.Tensor, scales: torch.Tensor, *, chunk_rows: int | None = None) -> torch.Tensor:
    """Packed E2M1 values [..., K//2] and E8M0 scales [..., K//32] -> float32 [..., K]; 0xFF blocks are NaN."""

    def chunk(v: torch.Tensor, s: torch.Tensor, k: int) -> torch.Tensor:
        elems = e2m1_to_float(unpack_fp4(v)).view(v.shape[0], -1, MXFP4.block_size)
        return (elems * e8m0_to_float(s).unsqueeze(-1)).view(v.shape[0], k)

    return _dequantize_rows(values, scales, chunk, MXFP4, chunk_rows)


def nvfp4_global_scale(w: torch.Tensor, *, chunk_rows: int | None = None) -> torch.Tensor:
    """Per-tensor NVFP4 scale amax(|w|) / (6 * 448) as a float32 0-d tensor (ModelOpt's weight_scale_2).

    amax ignores NaN and +-Inf so one bad weight cannot poison the tensor; an all-zero (or all non-finite)
    tensor gets 1.0 so the scales stay finite instead of 0/0.
    """
    rows = _rows(w)
    amax = torch.zeros((), dtype=torch.float32, device=w.device)
    for sl in _row_chunks(rows.shape[0], _chunk_rows(rows.shape[-1], chunk_rows)):
        x = rows[sl].to(torch.float32).abs()
        amax = torch.maximum(amax, x.masked_fill_(~torch.isfinite(x), 0).amax())
    if amax == 0:
        return torch.ones((), dtype=torch.float32, device=w.device)
    return amax / (E2M1_MAX * E4M3_MAX)


def quantize_nvfp4(
    w: torch.Tensor, global_scale: torch.Tensor | float | None = None, *, chunk_rows: int | None = None
) -> NVFP4Weights:
    """NVFP4 as NVIDIA ModelOpt and torchao define it: w ~= e2m1 * e4m3(block scale) * global_scale.

    In ModelOpt checkpoint terms ``values`` is ``weight``, ``scales`` is ``weight_scale`` (float8_e4m3fn) and
    ``global_scale`` is ``weight_scale_2``: w ~= e2m1 * weight_scale * weight_scale_2. torchao calls it
    ``per_tensor_scale`` and applies it the same way. It is a multiplier, not its reciprocal (TensorRT-LLM's
    quantize kernel takes 1 / weight_scale_2). It defaults to :func:`nvfp4_global_scale`, amax(|w|) / (6 * 448),
    so the block holding the tensor's amax gets E4M3 scale 448, the top of the E4M3 range. Per 16 weights along
    K, exactly as torchao 0.18 ``nvfp4_quantize`` computes it in float32:

        block_scale = e4m3(clamp(amax(|block|) / 6 / global_scale, 2**-6, 448))    # round to nearest even
        elements    = e2m1(w * ((1 / global_scale) / float(block_scale)))          # ties to even, +-6 saturate

    Choices where ModelOpt and torchao differ (we follow torchao):
    - Block scales are clamped below at 2**-6 (the smallest normal E4M3, byte 0x08), so no subnormal scale
      bytes appear and an all-zero block gets 0x08. ModelOpt lets scales go subnormal and sets a zero block's
      scale to 1.0 (0x38). Either way the block dequantizes to zeros.
    - Elements multiply by the reciprocal of the combined scale; ModelOpt divides by
      ``scale * global_scale``. The two can differ in the last float32 ulp, which can move an exact E2M1 tie.
    A block holding NaN gets scale 0x7F (E4M3 NaN) and element codes 0. NaN/Inf are left out of the default
    global scale; a block holding +-Inf saturates to scale 448 and elements +-6.
    """
    k = _block_columns(w, NVFP4)
    if global_scale is None:
        g = nvfp4_global_scale(w, chunk_rows=chunk_rows)
    else:
        g = torch.as_tensor(global_scale, dtype=torch.float32, device=w.device).reshape(())
    if not (torch.isfinite(g) and g > 0):
        raise ValueError(f"quantize_nvfp4: global_scale must be finite and > 0, got {float(g)}")
    inv_g = 1.0 / g

    def chunk(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = x.view(x.shape[0], -1, NVFP4.block_size)
        block_scale = blocks.abs().amax(dim=-1) / E2M1_MAX / g
        scales = float_to_e4m3_bytes(block_scale.clamp_(min=_E4M3_MIN_NORMAL))  # clamp keeps NaN
        codes = float_to_e2m1(blocks * (inv_g / e4m3_bytes_to_float(scales)).unsqueeze(-1))
        return pack_fp4(codes.view(x.shape[0], k)), scales

    values, scales = _quantize_rows(w, chunk, k, NVFP4, chunk_rows)
    return NVFP4Weights(values=values, scales=scales, global_scale=g)


def dequantize_nvfp4(
    values: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor | float,
    *,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Packed E2M1 values, E4M3 scale bytes and the global scale -> float32 e2m1 * (e4m3 * global_scale).

    The scale product is formed first, as torchao and ModelOpt do, so results match theirs bit for bit.
    """
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=values.device).reshape(())

    def chunk(v: torch.Tensor, s: torch.Tensor, k: int) -> torch.Tensor:
        elems = e2m1_to_float(unpack_fp4(v)).view(v.shape[0], -1, NVFP4.block_size)
        return (elems * (e4m3_bytes_to_float(s) * g).unsqueeze(-1)).view(v.shape[0], k)

    return _dequantize_rows(values, scales, chunk, NVFP4, chunk_rows)


# --- chunking over the flattened leading dims -------------------------------------------------------------------


def _block_columns(w: torch.Tensor, fmt: ScaleFormat) -> int:
    if w.dim() < 1:
        raise ValueError(f"quantize_{fmt.name}: need at least one dimension, got a 0-d tensor")
    if not (w.is_floating_point() and w.element_size() >= 2):
        raise TypeError(f"quantize_{fmt.name}: expected a float16/bfloat16/float32/float64 tensor, got {w.dtype}")
    k = w.shape[-1]
    fmt.scale_columns(k)  # raises ValueError naming the format, K and the block size
    return k


def _rows(t: torch.Tensor) -> torch.Tensor:
    # A view for contiguous tensors; a non-contiguous one is copied once here.
    return t.reshape(-1, t.shape[-1]) if t.dim() > 0 else t.reshape(1, 1)


def _chunk_rows(row_len: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        return chunk_rows
    return max(1, _CHUNK_ELEMENTS // max(row_len, 1))


def _row_chunks(n_rows: int, step: int) -> Iterator[slice]:
    for start in range(0, n_rows, step):
        yield slice(start, min(start + step, n_rows))


def _quantize_rows(
    w: torch.Tensor,
    chunk: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    k: int,
    fmt: ScaleFormat,
    chunk_rows: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _rows(w)
    lead = w.shape[:-1]
    values = torch.empty((rows.shape[0], k // 2), dtype=torch.uint8, device=w.device)
    scales = torch.empty((rows.shape[0], k // fmt.block_size), dtype=torch.uint8, device=w.device)
    for sl in _row_chunks(rows.shape[0], _chunk_rows(k, chunk_rows)):
        values[sl], scales[sl] = chunk(rows[sl].to(torch.float32).contiguous())
    return values.view(*lead, k // 2), scales.view(*lead, k // fmt.block_size)


def _dequantize_rows(
    values: torch.Tensor,
    scales: torch.Tensor,
    chunk: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    fmt: ScaleFormat,
    chunk_rows: int | None,
) -> torch.Tensor:
    if values.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"dequantize_{fmt.name}: values and scales must be uint8, got {values.dtype}, {scales.dtype}")
    k = values.shape[-1] * 2
    if values.shape[:-1] != scales.shape[:-1] or scales.shape[-1] != fmt.scale_columns(k):
        raise ValueError(
            f"dequantize_{fmt.name}: values {tuple(values.shape)} (K={k}) need scales "
            f"{(*values.shape[:-1], k // fmt.block_size)}, got {tuple(scales.shape)}"
        )
    v_rows, s_rows = _rows(values), _rows(scales)
    out = torch.empty((v_rows.shape[0], k), dtype=torch.float32, device=values.device)
    for sl in _row_chunks(v_rows.shape[0], _chunk_rows(k, chunk_rows)):
        out[sl] = chunk(v_rows[sl].contiguous(), s_rows[sl].contiguous(), k)
    return out.view(*values.shape[:-1], k)
