"""The transform warps of the engine's grouped FP4 x bf16 GEMM (schedule ``transform``; ``docs/moe-engine.md`` §4.4,
§7): producer warps 1-3 (native scales) or 2-3 (inline: warp 1 decodes the engine records) convert each stage's
128 x 64 FP4 weight panel into a bf16 A tile in shared memory, and the consumer warpgroups run their wgmmas with A
from shared memory (SS) instead of converting in their registers.

Why the producer warpgroup: a fourth warpgroup would make 512 threads, and ptxas compiles every thread of a kernel
under the launch's register share (65,536 / 512 = 128), too few for a 64 x 256 fp32 accumulator and its wgmma
(ptxas C7602); warps 1-3 are idle where warp 0 copies by TMA alone (rows in block order), but for the one decoder
warp inline scales need (at 64- to 256-route blocks a stage's MMAs are long enough for one warp to decode).

The conversion is the consumers' of the other schedules (the same
:class:`~csf_kernels.moe.kernels.engine_mainloop.ConsumerStep`): the tile's eight MMA warps' fragments (row block
``g // 4``, MMA warp ``g % 4``) are dealt to the transform warps in turn, each playing MMA warp ``g``'s lanes,
then ``stmatrix``-ed into the tile through the MMA's own A partition, so each weight lands where the SS wgmma reads
it: the same bf16 values at the same (row, K) as the register operand, and so the same output bits.

Hand-offs: the ring's stage (weights, scales, activations) is released by the transform warps once they have read
its weights and scales, and by the consumers' eight once their wgmmas have read its activations (10 or 11 arrivals).
The A tiles (:data:`A_TILES`, a full and an empty mbarrier each) go round by the stage count both sides keep: the
transform waits for tile ``count % A_TILES`` to be empty, writes it, fences it for the async proxy and arrives on its
full barrier (one arrival a warp); the consumers wait for it full and release it when the wgmmas that read it retire
(one arrival a warp).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from csf_kernels.moe.engine_specs import ENGINE_TILE_K as TILE_K
from csf_kernels.moe.engine_specs import ENGINE_TILE_M as TILE_M
from csf_kernels.moe.kernels.engine_producer import CONSUMER_WARPS, ring_phase, ring_slot

__all__ = [
    "A_TILES",
    "TRANSFORM_DECODER_WARPS",
    "TRANSFORM_REGISTERS",
    "SharedATiles",
    "TransformWarps",
    "transform_warps",
]

A_TILES = 2  # bf16 A tiles in flight: the transform converts a stage ahead of the consumers' wgmmas
TRANSFORM_DECODER_WARPS = (1,)  # inline scales: the one producer warp that decodes the engine records


def transform_warps(inline: bool) -> tuple[int, ...]:
    """The producer warps that convert: 1-3 (warp 0 copies by TMA) but the inline decoder's."""
    decoders = TRANSFORM_DECODER_WARPS if inline else ()
    return tuple(w for w in (1, 2, 3) if w not in decoders)


# the producer warpgroup's registers a thread after setmaxnreg (384 threads share 65,536: producers 56, consumers
# 224; without a transform 40 and 232)
TRANSFORM_REGISTERS = 56


class SharedATiles:
    """The A tiles' barriers (``bars``: ``2 * tiles`` Int64 mbarriers, full then empty), indexed by a ring state's
    ``count`` (stages consumed since the start, the same on both sides); ``writers``: the transform warps, one
    arrival each on a full barrier."""

    def __init__(self, writers: int, tiles: int = A_TILES):
        ring_slot(0, tiles)  # refuses a slot count that is not a power of two
        self.writers = writers
        self.tiles = tiles

    @cute.jit
    def init(self, bars):
        """One thread (traced inline, before the CTA's barrier-initialisation sync)."""
        for i in cutlass.range_constexpr(self.tiles):
            cute.arch.mbarrier_init(bars + i, self.writers)
            cute.arch.mbarrier_init(bars + self.tiles + i, CONSUMER_WARPS)
        cute.arch.mbarrier_init_fence()

    def tile(self, count):
        return ring_slot(count, self.tiles)

    def parity(self, count):
        """The phase parity of tile ``count % tiles``'s ``count // tiles``-th use."""
        return ring_phase(count, self.tiles)

    @cute.jit
    def wait_full(self, bars, count):
        """A consumer thread: tile ``count``'s bf16 weights are written and fenced."""
        cute.arch.mbarrier_wait(bars + self.tile(count), self.parity(count))

    @cute.jit
    def release(self, bars, count):
        """A consumer warp, once the wgmmas that read tile ``count`` have retired: one arrival."""
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(bars + self.tiles + self.tile(count))

    @cute.jit
    def wait_empty(self, bars, count):
        """A transform thread: the consumers are done with tile ``count``'s previous use (a fresh barrier's
        opposite parity passes at once)."""
        cute.arch.mbarrier_wait(bars + self.tiles + self.tile(count), 1 - self.parity(count))

    @cute.jit
    def publish(self, bars, count):
        """A transform warp, its stores to tile ``count`` done: fence them for the async proxy (wgmma), then one
        arrival."""
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(bars + self.tile(count))


class TransformWarps:
    """The transform warps of one program: ``warps`` which producer warps they are, ``step`` and ``step_one`` the
    conversions (``ConsumerStep``: two multiplies a pair, or (MXFP4 row blocks flagged so) one; ``step_one`` is
    ``None`` for NVFP4), ``tiles`` the A tiles' barriers, ``facts`` and ``work`` the program's unit facts and unit
    map."""

    def __init__(self, warps: tuple[int, ...], step, step_one, nvfp4: bool, tiles: SharedATiles, facts, work):
        if tiles.writers != len(warps):
            raise ValueError(f"the A tiles' full barriers count {tiles.writers} writers; {len(warps)} warps convert")
        if tuple(warps) != tuple(range(warps[0], warps[0] + len(warps))):
            raise ValueError(f"transform warps {warps} are not consecutive (a warp's rank and the gate assume so)")
        self.warps = tuple(warps)
        self.step = step
        self.step_one = step_one
        self.nvfp4 = nvfp4
        self.tiles = tiles
        self.facts = facts
        self.work = work

    @cute.jit
    def run(self, ring, stages, bars, rs_mma, s_a, s_s, s_at, s_facts, units, tiles_m, k_steps, split_steps, warp,
            lane):  # fmt: skip
        """A transform warp's walk (traced inline; ``warp`` one of ``warps``): every unit of this CTA,
        each K step's stage converted into A tile ``count % A_TILES``, its share of the MMA warps' fragments.
        ``rs_mma``: the register-A MMA whose A partition the conversion writes (the consumers' SS MMA reads the same
        layout from ``s_at``)."""
        s_words = cute.recast_tensor(s_a, cutlass.Uint32)  # (512, 2, 1, 1, stages)
        atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), cutlass.BFloat16)
        r2s = cute.make_tiled_copy_A(atom, rs_mma)
        frag = rs_mma.make_fragment_A(rs_mma.get_slice(lane).partition_shape_A((TILE_M, TILE_K)))  # 4 K slices
        frag_words = cute.recast_tensor(frag, cutlass.Uint32)
        src = r2s.retile(frag)
        words = cute.make_rmem_tensor((4,), cutlass.Uint32)
        rank = warp - self.warps[0]
        shares = -(-CONSUMER_WARPS // len(self.warps))
        # where each share's fragments land in the tiles (share j is MMA warp rank + j * warps; a last share past the
        # eight MMA warps is never stored, its partition clamped in range): the same every stage
        dst = [
            r2s.get_slice(cutlass.min(rank + len(self.warps) * j, CONSUMER_WARPS - 1) * 32 + lane).partition_D(s_at)
            for j in range(shares)
        ]

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        u = cute.arch.block_idx()[0]
        while u < units:
            _, _, _, _, steps = self.work.unit(u, tiles_m, k_steps, split_steps)
            ring.consumer_wait(read)  # the unit's first stage holds its facts
            _, one0, _ = self.facts.read(s_facts[(None, read.index)], 0)
            _, one1, _ = self.facts.read(s_facts[(None, read.index)], 1)
            for _ in cutlass.range(steps, unroll=1):
                ring.consumer_wait(read)
                count = read.count
                self.tiles.wait_empty(bars, count)
                a = self.tiles.tile(count)
                for j in cutlass.range_constexpr(shares):
                    g = rank + len(self.warps) * j  # MMA warp g: row block g // 4, its warp g % 4 there
                    if g < CONSUMER_WARPS:
                        rb = g // 4
                        t = (g % 4) * 32 + lane  # the MMA thread's index in its warpgroup
                        r0 = rb * 64 + (g % 4) * 16 + lane // 4
                        for i in cutlass.range_constexpr(4):
                            words[i] = s_words[(t * 4 + i, rb, 0, 0, read.index)]
                        one = one0
                        if rb > 0:
                            one = one1
                        self._convert(frag_words, words, s_s, read.index, r0, one)
                        cute.copy(r2s, src, dst[j][(None, None, None, a)])
                self.tiles.publish(bars, count)
                ring.consumer_release(read)  # the stage's weights and scales are read
                read.advance()
            u += cute.arch.grid_dim()[0]

    @cute.jit
    def _convert(self, frag_words, words, s_s, stage, r0, one):
        """A row block's four K slices into the A fragment (traced inline): one multiply a pair where ``one``."""
        if cutlass.const_expr(self.nvfp4):
            self._slices(self.step, frag_words, words, s_s, stage, r0)
        else:
            if one:
                self._slices(self.step_one, frag_words, words, s_s, stage, r0)
            else:
                self._slices(self.step, frag_words, words, s_s, stage, r0)

    @staticmethod
    def _slices(step, frag_words, words, s_s, stage, r0):
        scales = step._scales(s_s, stage, r0)
        for j in range(4):
            step._convert(frag_words[(None, 0, j)], words[j], *step._slice_factors(scales, j))
