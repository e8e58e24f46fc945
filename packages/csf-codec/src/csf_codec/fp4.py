"""FP4 (E2M1) element codes, their nibble packing, and the two scale encodings (E8M0, E4M3)."""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E4M3_NAN_BYTE",
    "E8M0_BIAS",
    "E8M0_NAN_BYTE",
    "e2m1_to_float",
    "e4m3_bytes_to_float",
    "e8m0_to_float",
    "float_to_e2m1",
    "float_to_e4m3_bytes",
    "pack_fp4",
    "unpack_fp4",
]

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN_BYTE = 0xFF
E4M3_NAN_BYTE = 0x7F  # positive NaN; float8_e4m3fn has no Inf

# Code bits: [sign | e1 e0 | m]. Codes 0..7 are the magnitudes, bit 3 negates (code 8 is -0.0).
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32
)

# Midpoints between adjacent magnitudes. A value counts the midpoints strictly below it, which rounds ties down;
# ties whose lower neighbour has an odd code (0.75, 1.75, 3.5) must round up instead, so those midpoints are moved
# one float32 ulp down: "x > nextafter(b, 0)" is "x >= b" for float32 x. Net effect: round half to even code.
_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
_ROUND_UP_AT_TIE = torch.tensor([False, True, False, True, False, True, False])
_E2M1_BOUNDS = torch.where(_ROUND_UP_AT_TIE, torch.nextafter(_MIDPOINTS, torch.zeros(())), _MIDPOINTS)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] (each 0..15) -> uint8 [..., K//2]; element 2i in the low nibble, 2i+1 in the high.

    This is the OCP MX / gpt-oss / ModelOpt / torchao byte order.
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_fp4: codes must be uint8, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4: last dimension {codes.shape[-1]} is odd")
    return (codes[..., 0::2] & 0x0F) | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K//2] -> uint8 codes [..., K]; inverse of :func:`pack_fp4`."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4: packed values must be uint8, got {packed.dtype}")
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Unpacked uint8 E2M1 codes (0..15) -> float32 values."""
    return E2M1_VALUES.to(codes.device)[codes.long() & 0x0F]


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float -> unpacked uint8 E2M1 codes: round to nearest, ties to even code, saturate at +-6.

    Sign comes from the sign bit, so -0.0 and negatives that round to zero give code 8 (-0), as torchao does.
    E2M1 has no NaN or Inf: +-Inf saturates to +-6 and NaN gives code 0 (+0). Callers that must keep NaN
    visible mark it in the block scale (E8M0 0xFF, E4M3 0x7F), which overrides every element of the block.
    """
    x = x.float()
    magnitude = torch.searchsorted(_E2M1_BOUNDS.to(x.device), x.abs(), out_int32=True).to(torch.uint8)
    codes = magnitude | (torch.signbit(x).to(torch.uint8) << 3)
    return codes.masked_fill_(torch.isnan(x), 0)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 scale bytes -> float32 2**(byte - 127); 0xFF -> NaN. Byte 0 is the subnormal float32 2**-127, exact."""
    b = scales.to(torch.int32)
    # An exponent field of b is 2**(b-127) for b >= 1; 2**-127 needs the subnormal pattern (mantissa MSB).
    bits = torch.where(b == 0, torch.full_like(b, 1 << 22), b << 23)
    return bits.view(torch.float32).masked_fill(b == E8M0_NAN_BYTE, float("nan"))


def e4m3_bytes_to_float(scales: torch.Tensor) -> torch.Tensor:
    """uint8 holding float8_e4m3fn bits -> float32 (0x7F / 0xFF -> NaN)."""
    if scales.dtype != torch.uint8:
        raise TypeError(f"e4m3_bytes_to_float: expected uint8 bytes, got {scales.dtype}")
    return scales.view(torch.float8_e4m3fn).to(torch.float32)


def float_to_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """float -> uint8 float8_e4m3fn bits, round to nearest even.

    Finite values and Inf beyond +-448 saturate to +-448 (0x7E / 0xFE); we clamp first rather than rely on
    the cast, whose overflow behaviour changed across torch versions. NaN -> 0x7F (0xFF if its sign bit is set).
    """
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
