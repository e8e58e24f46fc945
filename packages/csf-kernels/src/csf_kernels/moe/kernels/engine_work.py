"""What a unit of the engine's grouped GEMM covers (``docs/moe-engine.md`` §4.2, §4.6): the one map from a unit index
to its route block, row tile and K range, read by every role (warp 0's copies, the gathering and decoder warps, the
consumers), so they walk the same stages in the same order.

Unsplit, a unit is (route block ``b``, 128-row tile ``tm``) over all of K: ``u = b * tiles_m + tm``. A split program
(K splits, :class:`UnitWork` with ``split``) runs units ``u = (b * tiles_m + tm) * splits + s`` for ``s < splits``,
split ``s`` over K steps ``[s * split_steps, min((s + 1) * split_steps, k_steps))``: ``split_steps`` is a run-time
argument, so one program serves every split count (``splits = ceil(k_steps / split_steps)``; the last split may be
shorter, none is empty). A tile's splits are consecutive units, so the CTAs running at once read one tile's weights
from neighbouring K ranges.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

__all__ = ["UnitWork", "split_count"]


def split_count(k_steps: int, split_steps: int) -> int:
    """Host side: the splits of ``k_steps`` K steps at ``split_steps`` a split."""
    return -(-k_steps // split_steps)


class UnitWork:
    """The unit map of one program (its configuration read as an attribute: the DSL carries no Python object through
    a dynamic loop): ``split`` whether its units are K splits. An unsplit program's map is the original one, with no
    division by the split count in its SASS."""

    def __init__(self, split: bool):
        self.split = split

    @cute.jit
    def splits(self, k_steps, split_steps):
        """Splits a row tile (traced inline): 1 unsplit."""
        n = cutlass.Int32(1)
        if cutlass.const_expr(self.split):
            n = (k_steps + split_steps - 1) // split_steps
        return n

    @cute.jit
    def units(self, tiles, k_steps, split_steps):
        """Units of ``tiles`` (route block, row tile) pairs (traced inline)."""
        return tiles * self.splits(k_steps, split_steps)

    @cute.jit
    def unit(self, u, tiles_m, k_steps, split_steps):
        """Unit ``u``'s ``(b, tm, s, k0, steps)`` (traced inline): its route block, row tile, split, first K step and
        K steps."""
        tile = u
        s = cutlass.Int32(0)
        k0 = cutlass.Int32(0)
        steps = k_steps
        if cutlass.const_expr(self.split):
            splits = self.splits(k_steps, split_steps)
            tile = u // splits
            s = u - tile * splits
            k0 = s * split_steps
            steps = cutlass.min(split_steps, k_steps - k0)
        b = tile // tiles_m
        tm = tile - b * tiles_m
        return b, tm, s, k0, steps
