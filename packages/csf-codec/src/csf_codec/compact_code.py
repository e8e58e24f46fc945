"""The compact body's exception code (docs/csf-format.md section 4): its constants and size rules.

Every implementation (the numpy coder, the torch reference, the GPU expander's host tables) takes its
numbers from here, so they agree on where each chunk's bits lie.

A listed chunk of n exceptions is ``n`` position codes (Elias-Fano: ``256 >> l`` unary buckets holding
``n`` ones, then ``n`` low parts of ``l`` bits) and ``n`` far flags; ``l`` is a function of ``n`` alone, so
the host finds every chunk's bits from the chunk counts by a prefix sum. An exception's selector field
says which side of the row's window its value lies on and, for ``w > 1``, its distance up to ``2**(w-1)``;
the far flag and a plane-wide list of 3-bit far codes and escaped bytes carry the rest.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "CHUNK",
    "ESCAPE_CODE",
    "FAR_BITS",
    "LISTED_BITS",
    "LOW_BITS",
    "MAX_LISTED",
    "RAW",
    "exact_distances",
    "listed_cost_bits",
]

CHUNK = 256  # scales per chunk
RAW = 255  # chunk count byte of a raw chunk
MAX_LISTED = 254  # the most exceptions a listed chunk holds
FAR_BITS = 3  # a far code: distance - (exact_distances(w) + 2), or ESCAPE_CODE
ESCAPE_CODE = (1 << FAR_BITS) - 1  # the value is the next byte of the escape list


def _low_bits(n: int) -> int:
    """The Elias-Fano low-part width that makes n positions in [0, 256) shortest (ties: the smaller)."""
    return min(range(8), key=lambda low: (n * low + (CHUNK >> low), low))


LOW_BITS = np.array([_low_bits(n) for n in range(CHUNK + 1)], dtype=np.int64)  # by exception count
# bits of a listed chunk's own stream (unary buckets, low parts, far flags) by exception count; 0 for none
LISTED_BITS = np.array(
    [0] + [n + (CHUNK >> int(LOW_BITS[n])) + n * int(LOW_BITS[n]) + n for n in range(1, CHUNK + 1)], dtype=np.int64
)


def exact_distances(width: int) -> int:
    """K: exceptions at distance <= K from their window are placed by their selector field alone
    (field = side | (min(distance - 1, K) << 1)); the others are open: near (distance K + 1) or far."""
    return (1 << (width - 1)) - 1


def listed_cost_bits(n, far, escaped):
    """Bits a chunk's exceptions take listed (its stream, far codes and escaped bytes): a chunk is raw
    when this is at least its native bits, or when it has more than MAX_LISTED exceptions."""
    return LISTED_BITS[n] + FAR_BITS * far + 8 * escaped
