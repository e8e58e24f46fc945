"""Program families: which programs a geometry needs, and where each kernel's source lives.

Nothing here imports triton or cutlass: the build imports a family's source module when it compiles,
and the unfrozen development runtime when it JIT-compiles.
"""

from __future__ import annotations

from csf_codec import ScaleFormat
from csf_codec import scale_format as catalog_format
from csf_codec.inline import DELTA_BITS, exception_capacity, record_bytes_choices
from csf_codec.tile_layout import TILE_COLS

from .catalog import Catalog, MoEGeometry
from .mla_specs import MLA_DECODE, MLA_MERGE, sparse_mla_specs
from .moe_specs import (
    MOE_ALIGN_PLAN,
    MOE_ALIGN_SCATTER,
    MOE_COMBINE,
    MOE_FC1_FINISH,
    MOE_GEMM,
    moe_geometry_specs,
)
from .programs import ProgramSpec, TritonFamily

__all__ = ["EXPAND_INLINE", "FAMILIES", "TritonFamily", "catalog_specs", "inline_expansion_specs"]

FULL_TILES_PER_PROGRAM = 8  # full tiles per step: 8 tiles x 4 columns = 32 bytes of each row, one sector
# a program walks several steps of a row block while the grid keeps at least this many programs
# (a few waves of 132 SMs), so per-row-block work is shared without starving small routed expansions
EXPANSION_PROGRAMS = 8 * 132
TAIL_ROW_BLOCKS_PER_PROGRAM = 4  # a tail tile is one word per slot: a program takes several row blocks


EXPAND_INLINE = TritonFamily(
    kernel="expand.inline_tiles",
    version=2,
    module="csf_kernels.kernels.expand_inline",
    function="expand_inline_tiles",
    num_warps=4,
)
EXPAND_COMPACT = TritonFamily(
    kernel="expand.compact_segments",
    version=1,
    module="csf_kernels.kernels.expand_compact",
    function="expand_compact_segments",
    num_warps=4,
)
FAMILIES = {
    f.kernel: f
    for f in (
        EXPAND_INLINE,
        EXPAND_COMPACT,
        MOE_ALIGN_PLAN,
        MOE_ALIGN_SCATTER,
        MOE_GEMM,
        MOE_COMBINE,
        MOE_FC1_FINISH,
        MLA_DECODE,
        MLA_MERGE,
    )
}
# CuTe DSL: the inline-tile stage decoder (building block of the inline-scale wgmma GEMM)
CUTE_STAGE_DECODER = "stage.inline_decoder"
CUTE_STAGE_DECODER_VERSION = 1


def stage_decoder_spec(fmt: ScaleFormat, record_bytes: int) -> ProgramSpec:
    """The CuTe stage decoder for full tiles of one record size (row-base deltas in the format's width)."""
    return ProgramSpec.of(CUTE_STAGE_DECODER, CUTE_STAGE_DECODER_VERSION, S=record_bytes, DB=DELTA_BITS[fmt.name])


COMPACT_COLUMNS_PER_STEP = 64


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def inline_store_bytes(tile_cols: int, cols: int, col_start: int, out_ptr: int) -> int:
    """Widest store (4, 2 or 1 bytes) that every row segment of this column class stays aligned for."""
    for width in (4, 2):
        if tile_cols % width == 0 and cols % width == 0 and col_start % width == 0 and out_ptr % width == 0:
            return width
    return 1


def inline_tiles_per_program(tile_cols: int, class_tiles: int) -> int:
    """Full tiles per step: 8 (32 bytes of each row), or 4 when the plane has no more (no idle lanes)."""
    if tile_cols != TILE_COLS:
        return 1
    return FULL_TILES_PER_PROGRAM if class_tiles > FULL_TILES_PER_PROGRAM // 2 else FULL_TILES_PER_PROGRAM // 2


def inline_program_tiles(
    step_tiles: int, class_tiles: int, row_block_programs: int, min_programs: int = EXPANSION_PROGRAMS
) -> int:
    """Column tiles one program walks (a multiple of ``step_tiles``): the whole class when the grid still
    has ``min_programs`` programs, fewer when few row blocks are expanded (routed experts)."""
    steps = -(-class_tiles // step_tiles)
    per_program = max(1, min(steps, row_block_programs * steps // max(min_programs, 1)))
    return per_program * step_tiles


def inline_class_spec(
    fmt: ScaleFormat,
    record_bytes: int,
    tile_cols: int,
    store: int = 1,
    tiles_per_step: int | None = None,
    tail_cols: int = 0,
) -> ProgramSpec:
    """The expansion program of one column class (full 4-column tiles, or a tail of 1..3 columns).

    ``store``: bytes per store (see :func:`inline_store_bytes`); ``tiles_per_step``: see
    :func:`inline_tiles_per_program` (default: the most); ``tail_cols``: the full-tile program also
    decodes a tail tile of this many columns (a plane with both classes runs one program)."""
    if tail_cols and tile_cols != TILE_COLS:
        raise ValueError("only the full-tile program takes the plane's tail tile")
    ctg = tiles_per_step or inline_tiles_per_program(tile_cols, FULL_TILES_PER_PROGRAM)
    # the narrowest selectors leave the most room for exceptions
    capacity = max(1, exception_capacity(1, record_bytes, tile_cols))
    return ProgramSpec.of(
        EXPAND_INLINE.kernel,
        EXPAND_INLINE.version,
        S=record_bytes,
        TC=tile_cols,
        TTC=tail_cols,
        CTG=ctg,
        RBP=1 if tile_cols == TILE_COLS else TAIL_ROW_BLOCKS_PER_PROGRAM,
        EC=_pow2(capacity),
        DB=DELTA_BITS[fmt.name],
        STORE=store,
        # full tiles: two (tile, quad) elements per thread and step (sweep_expand.py, run 30: DS4.1 W2's
        # 4-tile steps 1.37x faster on 2 warps than on 4; W13's 8-tile steps fastest on 4)
        num_warps=ctg // 2 if tile_cols == TILE_COLS else EXPAND_INLINE.num_warps,
    )


def _class_specs(fmt: ScaleFormat, tile_cols: int, stores, ctgs, tail_cols: int = 0) -> list[ProgramSpec]:
    return [
        inline_class_spec(fmt, s, tile_cols, store, ctg, tail_cols)
        for s in record_bytes_choices(fmt, tile_cols)
        for store in stores
        for ctg in ctgs
    ]


def inline_expansion_specs(fmt: ScaleFormat, cols: int) -> list[ProgramSpec]:
    """Every record size a plane with ``cols`` scale columns may have chosen (assuming an aligned output
    plane, as torch allocates it): the full-tile program, which also takes the tail, or for planes
    narrower than one tile the tail program."""
    full, tail = divmod(cols, TILE_COLS)
    if full:
        store = inline_store_bytes(TILE_COLS, cols, 0, 0)
        return _class_specs(fmt, TILE_COLS, (store,), (inline_tiles_per_program(TILE_COLS, full),), tail)
    return _class_specs(fmt, tail, (inline_store_bytes(tail, cols, 0, 0),), (1,))


# the store widths a plane's rows allow, by its tail columns (cols % 4): odd tails leave odd-length rows
_ROW_STORES = {0: (1, 2, 4), 1: (1,), 2: (1, 2), 3: (1,)}


def format_expansion_specs(fmt: ScaleFormat) -> list[ProgramSpec]:
    """Expansion programs are geometry-independent: every record size, tail width, store width and
    tiles-per-step variant of a format, so any plane of it expands."""
    half = FULL_TILES_PER_PROGRAM // 2
    specs = []
    for tail, stores in _ROW_STORES.items():
        specs += _class_specs(fmt, TILE_COLS, stores, (half, FULL_TILES_PER_PROGRAM), tail)
        if tail:  # planes narrower than one tile
            specs += _class_specs(fmt, tail, stores, (1,))
    return specs


def compact_spec(width: int) -> ProgramSpec:
    """The compact-form expansion program for payloads of this selector width."""
    return ProgramSpec.of(
        EXPAND_COMPACT.kernel,
        EXPAND_COMPACT.version,
        W=width,
        CB=COMPACT_COLUMNS_PER_STEP,
        num_warps=EXPAND_COMPACT.num_warps,
    )


def geometry_specs(geo: MoEGeometry) -> list[ProgramSpec]:
    specs: list[ProgramSpec] = [compact_spec(w) for w in (1, 2, 4)]
    for shape, _group in geo.scale_planes().values():
        specs += inline_expansion_specs(geo.fmt, shape[-1])
    return specs + moe_geometry_specs(geo)


def catalog_specs(catalog: Catalog, *, cute: bool = True) -> dict[str, tuple[ProgramSpec, list[str]]]:
    """key -> (spec, the geometries that need it), deduplicated across the catalog.

    Each format in the catalog also gets every expansion program (a few dozen small cubins), so any
    plane of that format expands, not only the catalog's shapes."""
    out: dict[str, tuple[ProgramSpec, list[str]]] = {}
    for geo in catalog.moe:
        for spec in geometry_specs(geo):
            out.setdefault(spec.key, (spec, []))[1].append(geo.name)
    for fmt in sorted({g.fmt.name for g in catalog.moe}):
        for spec in format_expansion_specs(catalog_format(fmt)):
            out.setdefault(spec.key, (spec, []))[1].append(f"any/{fmt}")
    for spec in sparse_mla_specs(catalog.sparse_mla):
        out.setdefault(spec.key, (spec, []))[1].append("sparse_mla")
    if cute:
        for geo in catalog.moe:
            for s in record_bytes_choices(geo.fmt, TILE_COLS):
                spec = stage_decoder_spec(geo.fmt, s)
                out.setdefault(spec.key, (spec, []))[1].append(geo.name)
    return out
