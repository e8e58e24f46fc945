"""The consumers' K step of the engine's grouped FP4 x bf16 GEMM (``docs/moe-engine.md`` §4.4, §4.9): a stage's
placed FP4 words and scale factors converted into wgmma A fragments, and the order its wgmmas issue and retire in.
Both schedules convert the same words with the same factors and issue the same wgmmas in the same K order into one
accumulator, so their outputs are the same bits; only when each wgmma may start moves.

* ``slice`` (one dependent chain a warpgroup): per K slice of 16, convert into one of two A register sets, issue its
  wgmma as a commit group of its own and wait until one group is left in flight. At most two wgmmas are in flight,
  and each slice's conversion waits for the wgmma two slices back.
* ``stage``: convert a stage's four slices into four A register sets, issue its four wgmmas back to back as one
  commit group, then wait until one group (this stage's) is left in flight: up to eight wgmmas in flight, the next
  stage's conversion overlapping this stage's MMAs. Stages alternate between two sets of four fragments (32
  registers a thread).

The caller releases a stage to the producer after the step whose wait retires its wgmmas: in ``stage``, the next
step's, right after its one wait; in ``slice`` the next step's too, after its fourth slice.

Bound probes (``probe``, diagnostic programs only, wrong outputs by design; ``docs/moe-engine.md`` §7): ``noconvert``
feeds each placed word to wgmma as it is (the conversion's instructions and scale reads gone, the rest of the loop
kept), ``ss`` issues each stage's four wgmmas with A from a bf16 tile in shared memory that nothing writes (the
consumer side of a transform warpgroup: no weight words read, no conversion), as ``stage`` does.

ptxas (C7513) accepts a conversion that writes registers while other wgmmas are in flight only where it can prove
them disjoint, and it cannot across a loop's back edge: the ``last`` step of an unrolled group waits for zero
groups, else ptxas serializes every wgmma of the kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from csf_kernels.moe.engine_specs import ENGINE_PROBES
from csf_kernels.moe.kernels.engine_convert import (
    E4M3_FACTOR_PTX,
    FACTOR_PTX,
    PAIR_ONE_MULTIPLY_PTX,
    PAIR_PTX,
    PLACED_FACTOR_PTX,
)
from csf_kernels.moe.kernels.engine_epilogue import asm_u32
from csf_kernels.moe.kernels.engine_producer import ring_slot
from csf_kernels.moe.kernels.engine_transform import A_TILES

__all__ = ["PROBES", "SCHEDULES", "STEP_GROUP", "ConsumerStep"]

SCHEDULES = ("slice", "stage")
# the diagnostic loops bounding what the conversion costs (see the module's docstring)
PROBES = ENGINE_PROBES
SLICES = 4  # K slices of 16 a stage (a 64-K panel step)
STEP_GROUP = 4  # K steps a loop iteration, unrolled (an even count: ``stage`` alternates two register sets)


class ConsumerStep:
    """One consumer warpgroup's K step of a program: ``schedule`` (``SCHEDULES``), ``nvfp4`` the scale slots'
    format (E4M3 words, else E8M0 bytes), ``gathered`` whether the producer warps fill a stage's B rows by
    ``cp.async`` (FC1 gathering its routes' rows) rather than TMA, ``one_multiply`` (MXFP4) whether each pair takes
    one multiply by ``2**126`` times its scale (a row block whose E8M0 bytes are all <= 128 or 255) or two;
    ``probe`` (:data:`PROBES`, MXFP4 only): a diagnostic loop, never served (``ss`` runs the ``stage`` schedule);
    ``tiles`` (schedule ``transform``, :class:`~csf_kernels.moe.kernels.engine_transform.SharedATiles`): the
    consumers of a transform warpgroup, their A from the bf16 tiles it writes, the ``stage`` schedule's wgmmas."""

    def __init__(
        self, schedule: str, nvfp4: bool, gathered: bool = False, one_multiply: bool = False,
        probe: str | None = None, tiles=None,
    ):  # fmt: skip
        if schedule not in SCHEDULES:
            raise ValueError(f"the consumer schedule must be one of {SCHEDULES}; got {schedule!r}")
        if one_multiply and nvfp4:
            raise ValueError("NVFP4's E4M3 factors take two multiplies (2**126 times 448 overflows bf16)")
        if probe is not None and (probe not in PROBES or nvfp4 or (probe == "ss" and schedule != "stage")):
            raise ValueError(f"probes {PROBES} are built for MXFP4 (ss on the stage schedule); got {probe!r}, "
                             f"{schedule!r}, nvfp4 {nvfp4}")  # fmt: skip
        if tiles is not None and (schedule != "stage" or probe is not None):
            raise ValueError("a transform warpgroup's consumers run the stage schedule's wgmmas, never a probe")
        self.probe = probe
        self.tiles = tiles
        # A from shared memory: the ss probe's unwritten tiles, or the transform warpgroup's
        self.shared_a = probe == "ss" or tiles is not None
        self.schedule = schedule
        self.nvfp4 = nvfp4
        self.gathered = gathered
        self.factor_ptx = PLACED_FACTOR_PTX if one_multiply else FACTOR_PTX
        self.pair_ptx = PAIR_ONE_MULTIPLY_PTX if one_multiply else PAIR_PTX
        self.sets = 2  # A register sets: alternate slices (slice), alternate stages (stage)
        self.per_set = 1 if schedule == "slice" else SLICES

    def fragments(self, tiled_mma, thr_mma, rows: int):
        """Device side, once a kernel: the A fragments ``[set][slice]`` and their uint32 views."""
        frag = [
            [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((rows, 16))) for _ in range(self.per_set)]
            for _ in range(self.sets)
        ]
        return frag, [[cute.recast_tensor(f, cutlass.Uint32) for f in fs] for fs in frag]

    def wgmmas_in_flight(self) -> int:
        """The most wgmmas a warpgroup has in flight by construction (while it converts the next ones)."""
        return 2 * self.per_set

    def _scales(self, s_s, stage, r0):
        """The stage's scale slots of the thread's rows ``r0`` and ``r0 + 8``: NVFP4 a word of four E4M3 bytes each
        (byte j for slice j), MXFP4 the bf16x2 factors of the step's two scale blocks."""
        if self.nvfp4:
            return s_s[(r0, 0, 0, stage)], s_s[(r0 + 8, 0, 0, stage)]
        return (
            asm_u32(self.factor_ptx, cutlass.Uint32(s_s[(2 * r0, 0, 0, stage)])),
            asm_u32(self.factor_ptx, cutlass.Uint32(s_s[(2 * r0 + 1, 0, 0, stage)])),
            asm_u32(self.factor_ptx, cutlass.Uint32(s_s[(2 * r0 + 16, 0, 0, stage)])),
            asm_u32(self.factor_ptx, cutlass.Uint32(s_s[(2 * r0 + 17, 0, 0, stage)])),
        )

    def _slice_factors(self, scales, j: int):
        """Slice ``j``'s bf16x2 factors of rows ``r0`` and ``r0 + 8``."""
        if self.nvfp4:
            return asm_u32(E4M3_FACTOR_PTX[j], scales[0]), asm_u32(E4M3_FACTOR_PTX[j], scales[1])
        f0a, f0b, f1a, f1b = scales
        return (f0a, f1a) if j < 2 else (f0b, f1b)  # slices 0, 1: the step's first scale block

    def _factors(self, scales, j: int):
        """Slice ``j``'s factors, or (probe ``noconvert``) none read."""
        return (None, None) if scales is None else self._slice_factors(scales, j)

    def _convert(self, dst, word, f0, f1):
        """A slice's four bf16x2 A registers from one placed word (rows r0: pairs 0 and 2, r0 + 8: 1 and 3)."""
        if self.probe == "noconvert":  # the word itself in each register: the loop's cost without the conversion
            for i in range(4):
                dst[i] = word
            return
        dst[0] = asm_u32(self.pair_ptx[0], word, f0)
        dst[1] = asm_u32(self.pair_ptx[1], word, f1)
        dst[2] = asm_u32(self.pair_ptx[2], word, f0)
        dst[3] = asm_u32(self.pair_ptx[3], word, f1)

    def step(
        self, tiled_mma, acc, frags, words, s_words, s_s, t_cr_b, stage, t, row_block, r0, parity, last, count=None
    ):
        """One K step (traced inline): the thread's four weight words and scale factors from the stage, then the
        schedule's conversions and wgmmas. ``parity``: the step's place in its unrolled group (``stage`` writes
        register set ``parity % 2``); the ``last`` step of a group waits for every wgmma. A from shared memory
        (``frags``: the tiles' A partition and, with a transform warpgroup, their barriers): tile ``count %
        tiles`` (``count``: the stages consumed so far), waited for where the transform warpgroup writes it."""
        if self.shared_a:
            a_tiles, bars = frags
            a = ring_slot(count, A_TILES)
            if cutlass.const_expr(self.tiles is not None):
                self.tiles.wait_full(bars, count)
                a = self.tiles.tile(count)
            warpgroup.fence()
            for j in range(SLICES):
                cute.gemm(tiled_mma, acc, a_tiles[(None, None, j, a)], t_cr_b[(None, None, j, stage)], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(0 if last else 1)
            return
        frag, frag_words = frags
        for i in range(SLICES):
            words[i] = s_words[(t * 4 + i, row_block, 0, 0, stage)]
        scales = None if self.probe == "noconvert" else self._scales(s_s, stage, r0)
        if self.schedule == "slice":
            for j in range(SLICES):
                self._convert(frag_words[j % 2][0], words[j], *self._factors(scales, j))
                warpgroup.fence()
                cute.gemm(tiled_mma, acc, frag[j % 2][0][(None, None, 0)], t_cr_b[(None, None, j, stage)], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(0 if last and j == SLICES - 1 else 1)
        else:
            p = parity % 2
            for j in range(SLICES):
                self._convert(frag_words[p][j], words[j], *self._factors(scales, j))
            warpgroup.fence()
            for j in range(SLICES):
                cute.gemm(tiled_mma, acc, frag[p][j][(None, None, 0)], t_cr_b[(None, None, j, stage)], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(0 if last else 1)

    def release(self, ring, release, frags):
        """Release a stage whose wgmmas retired (traced inline), and its A tile to a transform warpgroup."""
        ring.consumer_release(release)
        if cutlass.const_expr(self.tiles is not None):
            self.tiles.release(frags[1], release.count)

    def wait(self, ring, read):
        """Wait for a full stage (traced inline); gathered, its B rows were written by ``cp.async`` (the generic
        proxy), so fence them before wgmma reads the stage through the async proxy."""
        ring.consumer_wait(read)
        if self.gathered:
            cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def k_loop(self, ring, read, release, k_steps, operands):
        """A unit's K steps (traced inline): ``STEP_GROUP`` steps a loop iteration, then the remainder one step an
        iteration, each waiting for zero wgmmas. ``operands``: ``(tiled_mma, acc, frags, words, s_words, s_s,
        t_cr_b, t, row_block, r0)``. Returns the ring's ``read`` and ``release`` states.

        ``slice`` drains (waits for zero wgmmas) at each group's last step. ``stage`` leaves its last group in
        flight across the back edge (the next iteration's first stage writes the other register set, which ptxas
        accepts) and drains once, after the loop, before the accumulator is read."""
        tiled_mma, acc, frags, words, s_words, s_s, t_cr_b, t, row_block, r0 = operands
        groups = k_steps // STEP_GROUP
        if cutlass.const_expr(self.schedule == "stage"):
            for i in cutlass.range(groups, unroll=1):
                for g in cutlass.range_constexpr(STEP_GROUP):
                    self.wait(ring, read)
                    self.step(tiled_mma, acc, frags, words, s_words, s_s, t_cr_b, read.index, t, row_block, r0, g,
                              False, read.count)  # fmt: skip
                    # the step's wait retired the previous stage's wgmmas: that stage is free (a unit's first has none)
                    if cutlass.const_expr(g > 0):
                        self.release(ring, release, frags)
                        release.advance()
                    else:
                        if i > 0:
                            self.release(ring, release, frags)
                            release.advance()
                    read.advance()
            warpgroup.wait_group(0)  # unconditional: ptxas sees every path to the accumulator's readers drained
            if groups > 0:
                self.release(ring, release, frags)
                release.advance()
        else:
            for _ in cutlass.range(groups, unroll=1):
                for g in cutlass.range_constexpr(STEP_GROUP):
                    self.wait(ring, read)
                    self.step(tiled_mma, acc, frags, words, s_words, s_s, t_cr_b, read.index, t, row_block, r0, g,
                              g == STEP_GROUP - 1, read.count)  # fmt: skip
                    if g > 0:  # the previous step's wgmmas completed (its stage is free)
                        self.release(ring, release, frags)
                        release.advance()
                    read.advance()
                self.release(ring, release, frags)
                release.advance()
        for _ in cutlass.range(k_steps - groups * STEP_GROUP, unroll=1):
            self.wait(ring, read)
            self.step(
                tiled_mma, acc, frags, words, s_words, s_s, t_cr_b, read.index, t, row_block, r0, 0, True, read.count
            )
            self.release(ring, release, frags)
            release.advance()
            read.advance()
        return read, release
