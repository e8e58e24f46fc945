"""Planning sparse MLA decode: capabilities in, a frozen plan out (no GPU, no compiler).

The plan fixes the head block, how many splits a call with ``rows`` query rows gets (the balanced
policy: enough programs for one program per SM, or for ``waves`` programs per SM where each split still
keeps ``SHARED_SM_MIN_CHUNKS`` chunks; at most one 64-candidate chunk per split at the widest), the scratch
layout for the split partials, and every program a bound decoder may launch, so ``bind`` can resolve them
all up front.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from csf_kernels.mla.heuristics import decode_config
from csf_kernels.mla.layout import CHUNK, PAGE_SIZE, VALUE_DIM
from csf_kernels.mla.specs import PARTIAL_DTYPES, DecodeConfig, decode_spec, merge_spec
from csf_kernels.runtime import device
from csf_kernels.runtime.programs import ProgramSpec

__all__ = ["MODES", "SHARED_SM_MIN_CHUNKS", "MLACaps", "MLAPlan", "MLAScratch", "plan"]

MODES = ("decode",)
_ALIGN = 256  # scratch region alignment (bytes)
# A second program per SM (waves 2, the 16-head program) runs each SM faster, but every split costs a prologue, a
# partial and its merge: it pays only while a split keeps 16 chunks or more (docs/perf-notes.md, "Splits: one
# program per SM unless each split keeps 16 chunks")
SHARED_SM_MIN_CHUNKS = 16


@dataclass(frozen=True)
class MLACaps:
    """What a served model needs: heads per rank, the most query rows per call, the top-k width."""

    heads: int
    max_rows: int
    topk: int
    page_size: int = PAGE_SIZE
    mode: str = "decode"
    partial_dtype: str = "float32"  # split partials: float32 (one rounding, at the output) or bfloat16
    sm_count: int | None = None  # None: the device's (csf_kernels.runtime.device.num_sms)
    waves: int | None = None  # most programs per SM the split policy aims at; None: the decode config's
    quantize_query: bool = False  # quantize a bf16 query like a cache record (bit-identical to a packed one)
    direct_single_split: bool = True  # one split per row: the decode finishes the output (no partials, no merge)


@dataclass(frozen=True)
class MLAScratch:
    """Byte offsets and sizes in the caller-owned scratch (256-byte aligned regions)."""

    part_out: tuple[int, int]  # (offset, bytes): [slots, heads, 512] partial outputs
    part_lse: tuple[int, int]  # (offset, bytes): [slots, heads] float32 partial log-sum-exps
    slots: int  # rows * splits, at most, over every row count the plan admits
    nbytes: int


@dataclass(frozen=True)
class MLAPlan:
    caps: MLACaps
    config: DecodeConfig
    max_splits: int
    scratch: MLAScratch
    programs: tuple[ProgramSpec, ...]

    @property
    def head_block(self) -> int:
        return self.config.head_block

    @property
    def waves(self) -> int:
        return self.caps.waves or self.config.waves

    @property
    def direct(self) -> bool:
        """Whether a call with one split per row has its decode finish the output (no partials, no merge):
        asked for by the caps and offered by the decode program."""
        return self.caps.direct_single_split and self.config.finishes_directly

    @property
    def head_blocks(self) -> int:
        return self.caps.heads // self.head_block

    def splits_for(self, rows: int) -> int:
        """Splits per row for a call with ``rows`` rows: one program per SM, or ``waves`` where the splits of
        one program per SM keep ``SHARED_SM_MIN_CHUNKS`` chunks each."""
        return self._policy(rows)[0]

    def programs_per_sm(self, rows: int) -> int:
        """How many decode programs of a call with ``rows`` rows may share an SM: the waves its split count was
        planned for, or more where its programs outnumber that many waves. The decode launches so that no SM
        takes more (``csf_kernels.runtime.shared_for_at_most``): a program that fits twice on an SM would
        otherwise share one, beside whatever the kernel before it left resident, at twice its time, while
        another SM idles (measured in chained decodes: docs/archive/perf-log.md)."""
        splits, waves = self._policy(rows)
        programs = rows * self.head_blocks * splits
        return max(waves, -(-programs // self.caps.sm_count))

    def _policy(self, rows: int) -> tuple[int, int]:
        """(splits per row, the programs per SM they were planned for)."""
        if not 0 < rows <= self.caps.max_rows:
            raise ValueError(f"rows={rows} outside the plan's [1, {self.caps.max_rows}]")
        one_each = self._balanced(rows, 1)
        if self.max_splits < SHARED_SM_MIN_CHUNKS * one_each:  # (at waves 1 both are the same)
            return one_each, 1
        return self._balanced(rows, self.waves), self.waves

    def _balanced(self, rows: int, waves: int) -> int:
        target = (waves * self.caps.sm_count) // (rows * self.head_blocks)
        return max(1, min(self.max_splits, target))


def plan(caps: MLACaps, config: DecodeConfig | None = None) -> MLAPlan:
    """The plan for ``caps``; ``config`` overrides the decode program's head block and warps (sweeps)."""
    if caps.sm_count is None:
        caps = replace(caps, sm_count=device.num_sms())
    if caps.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {caps.mode!r}")
    if caps.page_size != PAGE_SIZE:
        raise ValueError(f"page_size must be {PAGE_SIZE} (the record layout's), got {caps.page_size}")
    if caps.topk <= 0 or caps.topk % CHUNK:
        raise ValueError(f"topk must be a positive multiple of {CHUNK}, got {caps.topk}")
    if caps.max_rows <= 0 or caps.sm_count <= 0 or (caps.waves is not None and caps.waves <= 0):
        raise ValueError(f"max_rows, sm_count and waves must be positive, got {caps}")
    if caps.partial_dtype not in PARTIAL_DTYPES:
        raise ValueError(f"partial_dtype must be one of {PARTIAL_DTYPES}, got {caps.partial_dtype!r}")
    config = config or decode_config(caps.heads)
    if caps.heads % config.head_block:
        raise ValueError(f"{caps.heads} heads do not split into blocks of {config.head_block}")
    max_splits = caps.topk // CHUNK
    draft = MLAPlan(caps, config, max_splits, MLAScratch((0, 0), (0, 0), 0, 0), ())
    # partials only for calls that merge: with direct single splits, those with more than one split
    merging = [r for r in range(1, caps.max_rows + 1) if not (draft.direct and draft.splits_for(r) == 1)]
    slots = max((r * draft.splits_for(r) for r in merging), default=0)
    esize = 4 if caps.partial_dtype == "float32" else 2
    out_bytes = slots * caps.heads * VALUE_DIM * esize
    lse_at = -(-out_bytes // _ALIGN) * _ALIGN
    lse_bytes = slots * caps.heads * 4
    scratch = MLAScratch((0, out_bytes), (lse_at, lse_bytes), slots, lse_at + -(-lse_bytes // _ALIGN) * _ALIGN)
    options = [(sink, lse) for sink in (False, True) for lse in (False, True)]
    queries = ("bf16_quantized" if caps.quantize_query else "bf16", "packed")
    programs = [decode_spec(config, caps.partial_dtype, query) for query in queries]
    programs += [merge_spec(caps.partial_dtype, sink=sink, lse=lse) for sink, lse in options]
    if draft.direct:
        programs += [
            decode_spec(config, caps.partial_dtype, query, direct=True, sink=sink, lse=lse)
            for query in queries
            for sink, lse in options
        ]
    return MLAPlan(caps, config, max_splits, scratch, tuple(programs))
