"""E4M3 (float8_e4m3fn) from its definition, for tests that must not trust torch's float8 cast: the value of every
byte, and round-to-nearest-even with saturation at 448 (what ``cvt.rn.satfinite.e4m3x2.f32`` does)."""

from __future__ import annotations

import numpy as np


def decode(b: int) -> float:
    """A byte's value: sign, 4 exponent bits biased 7, 3 mantissa bits; exponent 0 is subnormal (m * 2**-9).
    0x7F / 0xFF are NaN."""
    if b & 0x7F == 0x7F:
        return float("nan")
    e, m = (b >> 3) & 15, b & 7
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if b & 0x80 else v


VALUES = {decode(b) for b in range(256) if b & 0x7F != 0x7F}  # every finite E4M3 value
_POS = np.array([decode(b) for b in range(0x7F)])  # bytes 0..0x7E, ascending


def round_e4m3(v: np.ndarray) -> np.ndarray:
    """uint8 bytes of float64 ``v`` rounded to nearest E4M3, ties to the even byte, saturating at +-448."""
    a = np.minimum(np.abs(v), 448.0)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - _POS[lo], _POS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(a == _POS[hi], hi, pick)
    return (pick | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)
