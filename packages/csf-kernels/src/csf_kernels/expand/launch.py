"""Scale expansion: CSF -> the native scale plane, on the GPU, for a whole layer or routed experts.

Host-side launchers of the CuTe DSL expanders (:mod:`csf_kernels.expand.kernels.cute_row_block_expander`,
:mod:`csf_kernels.expand.kernels.cute_row_expander`) and the Triton programs in :mod:`csf_kernels.kernels`; they import
no compiler and
resolve every program through the AOT runtime. ``bind_*`` resolves programs and marshals arguments
once (for serving and CUDA graphs); calling the binding launches. ``expand_*`` binds and calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec import InlineScales
from csf_codec.inline import exception_capacity
from csf_codec.tile_layout import TILE_COLS
from csf_kernels import runtime
from csf_kernels.expand.compact_tables import CompactTables
from csf_kernels.expand.heuristics import expansion_engine
from csf_kernels.expand.specs import (
    RowImageLayout,
    compact_spec,
    inline_narrow,
    inline_plane_spec,
    inline_store_bytes,
    row_block_covers,
    row_block_expander_spec,
    row_block_groups,
    row_block_warps,
    row_expander_spec,
    row_image_layout,
)
from csf_kernels.runtime import config as runtime_config

__all__ = [
    "BoundExpansion",
    "all_experts",
    "bind_expand_compact",
    "bind_expand_inline",
    "expand_compact",
    "expand_inline",
    "inline_expansion_launches",
]

_ALL: dict[tuple[int, torch.device], torch.Tensor] = {}


def all_experts(num_experts: int, device: torch.device) -> torch.Tensor:
    """A cached int32 arange, so whole-layer expansion allocates nothing per call (graph-safe)."""
    key = (num_experts, torch.device(device))
    if key not in _ALL:
        _ALL[key] = torch.arange(num_experts, dtype=torch.int32, device=device)
    return _ALL[key]


@dataclass(frozen=True, eq=False)
class BoundExpansion:
    """One plane's expansion with its programs and arguments resolved; call it to launch."""

    out: torch.Tensor
    launches: tuple[runtime.BoundLaunch, ...]

    def __call__(self) -> torch.Tensor:
        for launch in self.launches:
            launch()
        return self.out


def _check_out(out: torch.Tensor | None, shape: tuple[int, ...], device: torch.device, what: str) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.uint8, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"{what}: out must be a contiguous uint8 {shape} tensor, got {out.dtype} {tuple(out.shape)}")
    return out


def _expert_ids(experts: torch.Tensor | None, num_experts: int, device: torch.device) -> torch.Tensor:
    if experts is None:
        return all_experts(num_experts, device)
    if experts.dtype != torch.int32 or not experts.is_contiguous():
        raise ValueError("experts must be a contiguous int32 tensor (convert once, outside the hot path)")
    return experts


# "triton": the tile programs of csf_kernels.expand.kernels.triton_inline; "cute": the row-image expanders of
# csf_kernels.cute (inline_row_expander, narrow_row_expander); "row_block": the per-shape row-block expander
# (csf_kernels.expand.kernels.cute_row_block_expander); "auto" (the default): see auto_engine
ENGINES = ("auto", "triton", "cute", "row_block")
# when a row-block expansion launched dependently waits for its predecessor (inline_expansion_launches), in the
# order of the program's ``pdl`` argument (1, 2; 0: a plain launch)
WAITS = ("first", "last")
# when a row-block expansion launched dependently lets the kernel after it in: as its CTAs start ("start"), or as
# they finish their work ("end": the program's ``pdl`` argument plus LETS_DEPENDENT_IN_LAST)
LETS_NEXT_IN = ("start", "end")
LETS_DEPENDENT_IN_LAST = 4
ROW_BLOCKS_PER_CTA_MAX = 4


def inline_expansion_launches(
    inline: InlineScales,
    out: torch.Tensor,
    *,
    experts: torch.Tensor | None = None,
    store: int | None = None,
    engine: str = "auto",
    wait: str = "first",
    lets_next_in: str = "start",
) -> list[runtime.Launch]:
    """The launches expanding ``inline`` into ``out`` (see :func:`bind_expand_inline`).

    ``engine``: one of :data:`ENGINES` ("cute" covers planes :func:`~csf_kernels.expand.specs.row_image_layout`
    accepts, "row_block" those :func:`~csf_kernels.expand.specs.row_block_covers` accepts and the cache holds a
    program for); ``store`` (tests, Triton only) narrows the store width below the widest the plane allows.
    ``wait``: when the row-block expander, a dependent launch (unless ``CSF_PDL`` is off), waits for the kernel
    before it on the stream: "first" (before it reads anything: after any kernel), or "last" (before it exits, so
    it runs beside that kernel: only right after a "first" expansion of another plane, see
    :func:`expansion_engine`); the other engines launch plainly, so "last" is for the row-block expander only.
    ``lets_next_in``: when that dependent launch lets the kernel after it in, as its CTAs start ("start") or as
    they finish their work ("end": the next kernel's CTAs then do not sit on the SMs beside this grid's). Under
    CUDA-graph capture that holds across streams too: a dependent launch joined to this one on another stream
    gets a dependent-launch edge from it (``docs/perf-notes.md``, "An expansion lets FC1 in only as its CTAs
    finish")."""
    if engine not in ENGINES:
        raise ValueError(f"expand_inline: engine must be one of {ENGINES}, got {engine!r}")
    if wait not in WAITS:
        raise ValueError(f"expand_inline: wait must be one of {WAITS}, got {wait!r}")
    if lets_next_in not in LETS_NEXT_IN:
        raise ValueError(f"expand_inline: lets_next_in must be one of {LETS_NEXT_IN}, got {lets_next_in!r}")
    geo = inline.geometry
    dev = inline.records.device
    out = _check_out(out, inline.shape, dev, "expand_inline")
    if out.numel() >= 1 << 31:
        raise ValueError(f"expand_inline: a {out.numel()}-byte plane exceeds the kernel's 32-bit offsets")
    experts = _expert_ids(experts, geo.experts, dev)
    if experts.numel() == 0:
        return []
    if engine == "auto":
        engine = expansion_engine(inline, out) if store is None else "triton"
    if (wait, lets_next_in) != ("first", "start") and engine != "row_block":
        raise ValueError(f"expand_inline: only the row-block expander waits last or lets the next kernel in at "
                         f"its end; this plane takes {engine!r}")  # fmt: skip
    if engine == "row_block":
        if not row_block_covers(geo.cols, out.numel(), out.data_ptr()) or store is not None:
            raise ValueError(f"expand_inline: the row-block expander does not cover a {tuple(out.shape)} plane")
        pdl = 0
        if runtime_config.pdl_enabled():
            pdl = WAITS.index(wait) + 1 + LETS_NEXT_IN.index(lets_next_in) * LETS_DEPENDENT_IN_LAST
        return [_row_block_launch(inline, out, experts, pdl=pdl)]
    if engine == "cute":
        layout = row_image_layout(geo.cols, out.numel(), out.data_ptr())
        if layout is None or store is not None:
            raise ValueError(f"expand_inline: the CuTe row expander does not cover a {tuple(out.shape)} plane")
        return [_row_expander_launch(inline, out, experts, layout)]
    blocks_per_expert = geo.row_blocks // max(geo.experts, 1)
    base_ref, deltas, records, tail, raw, tail_raw = _aligned_arrays(inline)
    for what in (records, tail):
        if what.numel() >= 1 << 31:
            raise ValueError(f"expand_inline: {what.numel()} record bytes exceed the kernel's 32-bit tile offsets")
    widest = inline_store_bytes(geo.cols, out.data_ptr())
    if store is None or store > widest or store not in (1, 2, 4, 8, 16):
        store = widest
    # one program per row block and run of full tiles; the run holding a row block's last full tiles also
    # decodes its tail tile, so one launch writes the whole plane (narrow planes: one run holds them all)
    full = geo.full_col_tiles
    narrow = store == widest and inline_narrow(geo.cols, out.data_ptr(), geo.rows, geo.row_group)
    spec = inline_plane_spec(inline.fmt, inline.record_bytes, geo.cols, store, narrow)
    runs = max(1, -(-full // spec.fact["CT"]))
    tail_bytes = inline.tail_record_bytes if geo.tail_cols else 0
    if blocks_per_expert > 65535 or experts.numel() > 65535:
        raise ValueError(f"expand_inline: {blocks_per_expert} row blocks x {experts.numel()} experts exceed the grid")
    grid = (runs, blocks_per_expert, experts.numel())
    args = (
        base_ref,
        deltas,
        records,
        raw,
        tail,
        tail_raw,
        out,
        experts,
        blocks_per_expert,
        geo.blocks_per_group,
        geo.row_group,
        geo.rows,
        geo.cols,
        full,
        geo.experts,
        tail_bytes,
    )
    return [runtime.Launch(spec, grid, args)]


def _row_expander_launch(
    inline: InlineScales, out: torch.Tensor, experts: torch.Tensor, layout: RowImageLayout
) -> runtime.Launch:
    geo = inline.geometry
    blocks_per_expert = geo.row_blocks // max(geo.experts, 1)
    if experts.numel() > 65535:
        raise ValueError(f"expand_inline: {experts.numel()} experts exceed the grid")
    per_cta = _row_blocks_per_cta(experts.numel() * blocks_per_expert * layout.groups, layout.per_warp, out.device)
    runs = -(-blocks_per_expert // per_cta)
    args = (
        *_expander_tensors(inline, out, experts),
        blocks_per_expert,
        geo.blocks_per_group,
        geo.row_group,
        geo.rows,
        geo.cols,
        geo.full_col_tiles,
        inline.record_bytes // 4,
        (inline.tail_record_bytes if geo.tail_cols else 0) // 4,
        geo.experts,
        layout.groups,
        int(layout.flat),
        per_cta,
        runs,
    )
    spec = row_expander_spec(inline.fmt, layout.group_tiles, layout.store)
    return runtime.Launch(spec, (runs, layout.groups, experts.numel()), args)


# CTAs per SM of the row-block grid (twice what stays resident, so early finishers take more blocks): measured
# faster than 8 or one block a CTA (the row-block expander's CTA sweep, ``validation/log.md``)
ROW_BLOCK_CTAS_PER_SM = 16


DIVIDEND_LIMIT = 1 << 15  # what the row-block expander divides by multiplication: experts x blocks, blocks


def division_magic(d: int) -> int:
    """The multiplier that makes ``(x * m) >> 31`` equal ``x // d`` for 0 <= x < 2**15 (0 for d = 1): exact,
    as x * (m - 2**31 / d) / 2**31 < 2**-16 stays below the 1 / d a quotient's fraction is away from 1."""
    if not 1 <= d < DIVIDEND_LIMIT:
        raise ValueError(f"divisor {d} outside [1, {DIVIDEND_LIMIT})")
    return 0 if d == 1 else -(-(1 << 31) // d)


def exception_caps(record_bytes: int, cols: int) -> int:
    """Each selector mode's exception capacity in records of ``record_bytes`` for tiles of ``cols`` columns,
    packed a byte per mode (0 where the mode does not fit; byte 3, raw tiles, 0), as the row-block expander
    takes them: a capacity bounds the entries read and places the values after the positions."""
    caps = (max(0, exception_capacity(1 << m, record_bytes, cols)) for m in range(3))
    return sum(c << (8 * m) for m, c in enumerate(caps))


def _row_block_launch(
    inline: InlineScales, out: torch.Tensor, experts: torch.Tensor, *, ctas: int | None = None, pdl: int = 0
) -> runtime.Launch:
    """The row-block expander's launch (``ctas``: a sweep's grid size; default: 16 CTAs per SM; ``pdl``: the
    program's dependent-launch mode, see :func:`inline_expansion_launches`)."""
    geo = inline.geometry
    blocks_per_expert = geo.row_blocks // max(geo.experts, 1)
    if experts.numel() * blocks_per_expert >= DIVIDEND_LIMIT:
        raise ValueError(
            f"expand_inline: {experts.numel()} experts x {blocks_per_expert} row blocks exceed the row-block "
            f"expander's {DIVIDEND_LIMIT} items"
        )
    spec = row_block_expander_spec(inline.fmt, geo.cols)
    blocks = experts.numel() * blocks_per_expert
    grouped = row_block_groups(geo.cols) > 1  # a CTA per block, else a warp per block
    most = blocks if grouped else -(-blocks // row_block_warps(geo.cols))
    if ctas is None:
        ctas = _sm_count(out.device) * ROW_BLOCK_CTAS_PER_SM
    ctas = max(1, min(ctas, most))
    args = (
        *_expander_tensors(inline, out, experts),
        blocks_per_expert,
        geo.blocks_per_group,
        geo.row_group,
        geo.rows,
        inline.record_bytes // 4,
        (inline.tail_record_bytes if geo.tail_cols else 0) // 4,
        division_magic(blocks_per_expert),
        division_magic(geo.blocks_per_group),
        exception_caps(inline.record_bytes, TILE_COLS),
        exception_caps(inline.tail_record_bytes, geo.tail_cols) if geo.tail_cols else 0,
        geo.experts,
        ctas,
        pdl,
    )
    return runtime.Launch(spec, (ctas, 1, 1), args)


def _expander_tensors(inline: InlineScales, out: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The CuTe expanders' tensor arguments (``cute.export._expander_tensors``): the inline arrays, realigned,
    as flat 32-bit words (raw tiles as rows of 128), the plane's bytes as words, the routed expert ids."""
    base_ref, deltas, records, tail, raw, tail_raw = _aligned_arrays(inline)
    words = torch.uint32
    return (
        base_ref,
        deltas,
        records.view(-1).view(words),
        tail.view(-1).view(words),
        raw.view(-1).view(words).view(-1, 128),
        tail_raw.view(-1),
        out.view(-1).view(words),
        experts,
    )


def _aligned_arrays(inline: InlineScales) -> tuple[torch.Tensor, ...]:
    """base_ref, base_delta, records, tail, raw, tail_raw at 16-byte aligned addresses, as programs assume
    (views are realigned by a copy: bind time only)."""
    arrays = (inline.base_ref, inline.base_delta, inline.records, inline.tail, inline.raw, inline.tail_raw)
    return tuple(runtime.aligned(a) for a in arrays)


def _sm_count(device: torch.device) -> int:
    """The device's SM count, which sizes the expanders' grids (an H200's 132 for CPU tensors: tests)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _row_blocks_per_cta(items: int, per_warp: bool, device: torch.device) -> int:
    """Row blocks one CTA expands in turn (setup amortised, the next block's records fetched while one is
    copied out), while the grid still fills every SM with ~16 CTAs; narrow planes (8-tile groups) give each
    of a CTA's four warps its own blocks, so ~32 warps per SM."""
    sms = _sm_count(device)
    if per_warp:
        return 4 * max(1, min(ROW_BLOCKS_PER_CTA_MAX, items // (sms * 32)))
    return max(1, min(ROW_BLOCKS_PER_CTA_MAX, items // (sms * 16)))


def bind_expand_inline(
    inline: InlineScales,
    out: torch.Tensor | None = None,
    *,
    experts: torch.Tensor | None = None,
    geometry: str | None = None,
    engine: str = "auto",
) -> BoundExpansion:
    """Bind the expansion of ``inline`` into ``out`` (uint8, the plane's shape, same device).

    ``experts`` (int32, on the device) limits the work to those experts' rows; ids outside [0, E) are
    graph padding and write nothing. The ids' values may change between calls; their count may not.
    ``engine``: see :func:`inline_expansion_launches`.
    """
    out = _check_out(out, inline.shape, inline.records.device, "expand_inline")
    launches = inline_expansion_launches(inline, out, experts=experts, engine=engine)
    return BoundExpansion(out, tuple(la.bind(geometry) for la in launches))


def expand_inline(inline: InlineScales, out: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Expand ``inline`` into ``out`` now (see :func:`bind_expand_inline`); returns ``out``."""
    return bind_expand_inline(inline, out, **kwargs)()


def bind_expand_compact(
    tables: CompactTables,
    out: torch.Tensor | None = None,
    *,
    experts: torch.Tensor | None = None,
    geometry: str | None = None,
) -> BoundExpansion:
    """Bind the expansion of a compact payload (prepared by ``compact_tables``) into ``out``.

    ``experts`` as for :func:`bind_expand_inline`; a 2-D plane counts as one expert.
    """
    shape = tables.shape
    dev = tables.codes.device
    out = _check_out(out, shape, dev, "expand_compact")
    num_experts = shape[0] if len(shape) == 3 else 1
    rows_per_expert = tables.rows // max(num_experts, 1)
    experts = _expert_ids(experts, num_experts, dev)
    # an expert's rows may start inside a segment: one more segment than N / 128 covers any alignment
    segments_per_expert = -(-rows_per_expert // 128) + (1 if rows_per_expert % 128 else 0)
    prog = runtime.program(compact_spec(tables.width), geometry=geometry)
    sections = (tables.codes, tables.escapes, tables.selectors, tables.counts, tables.exceptions)
    sections = tuple(runtime.aligned(a) for a in sections)  # views into the payload: realign (bind time)
    launch = prog.bind(
        (experts.numel() * segments_per_expert,),
        *sections,
        runtime.aligned(tables.chunk_offsets),
        runtime.aligned(tables.far_offsets),
        runtime.aligned(tables.escape_offsets),
        runtime.aligned(tables.segment_escapes),
        out,
        experts,
        rows_per_expert,
        segments_per_expert,
        num_experts,
        tables.rows,
        shape[-1],
        tables.exceptions.numel(),
    )
    return BoundExpansion(out, (launch,))


def expand_compact(tables: CompactTables, out: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Expand a compact payload into ``out`` now (see :func:`bind_expand_compact`); returns ``out``."""
    return bind_expand_compact(tables, out, **kwargs)()
