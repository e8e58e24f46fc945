"""Triton helpers shared by the sparse-MLA decode (single split) and merge programs: the same
instructions turn split results into the output in both, so a single-split decode that writes its output
directly gives the merge's bits."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def reference_max(m):
    """The softmax reference: the running maximum, or 0 where no key (nor sink) was seen."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def split_weight(lse, m_ref):
    """A split's weight in the merged softmax (0 for a split without keys)."""
    return tl.exp(lse - m_ref)


@triton.jit
def weighted(w, o):
    """A split's contribution w * o (never 0 * garbage for a split without keys)."""
    return tl.where(w > 0, w * o, 0.0)


@triton.jit
def finished(num, total):
    """The output num / total; zeros where there was no key and no sink."""
    return tl.where(total > 0, num / tl.where(total > 0, total, 1.0), 0.0)


@triton.jit
def keys_lse(den, m_ref):
    """The log-sum-exp over the keys (the sink excluded), -inf without keys."""
    return tl.where(den > 0, m_ref + tl.log(tl.where(den > 0, den, 1.0)), float("-inf"))
