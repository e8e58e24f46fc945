"""The expansion's program specs: which program expands a plane, and where each kernel's source lives.

Nothing here imports triton or cutlass: the build imports a family's source module when it compiles,
and the unfrozen development runtime when it JIT-compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from csf_codec import ScaleFormat
from csf_codec.inline import DELTA_BITS, exception_capacity, record_bytes_choices
from csf_codec.tile_layout import TILE_COLS
from csf_kernels.runtime.programs import ProgramSpec, TritonFamily

__all__ = [
    "CUTE_ROW_BLOCK_EXPANDER",
    "CUTE_ROW_EXPANDER",
    "EXPAND_COMPACT",
    "EXPAND_INLINE",
    "compact_spec",
    "format_expansion_specs",
    "inline_class_spec",
    "inline_expansion_specs",
    "inline_plane_spec",
    "row_block_expander_spec",
    "row_expander_spec",
    "stage_decoder_spec",
]

# full tiles per program by store width (bytes), preferred first: 16-byte stores need 4 consecutive tiles of
# a row in one thread, 8-byte stores 2; 16 tiles give each row 64 bytes per program, so a write request to
# the L2 carries two sectors (measured faster than 8 or 32, whose masked waste costs more;
# ``docs/archive/perf-log.md``, "Scale expansion, DS4.1-TP4 layer")
TILES_BY_STORE = {16: (16, 8, 4), 8: (2,), 4: (8, 4), 2: (8, 4), 1: (8, 4)}
# warps by full tiles per program (eight 32-bit words per thread; 16 tiles: sixteen; two for tail-only
# planes)
_WARPS_BY_TILES = {16: 2, 8: 4, 4: 2, 2: 1, 1: 2}


def _narrow_warps(tail_cols: int) -> int:
    """Narrow planes: row pairs (2-column tails) on one warp, rows of halves on two: the warp counts a sweep
    measured fastest (``docs/archive/perf-log.md``, "Scale expansion, DS4.1-TP4 layer")."""
    return 1 if tail_cols == 2 else 2


EXPAND_INLINE = TritonFamily(
    kernel="expand.inline_tiles",
    version=3,
    module="csf_kernels.expand.kernels.triton_inline",
    function="expand_inline_tiles",
    num_warps=4,
)
EXPAND_COMPACT = TritonFamily(
    kernel="expand.compact_segments",
    version=3,  # 3: exceptions take the row base from the scan, not from out (an expert routed twice)
    module="csf_kernels.expand.kernels.triton_compact",
    function="expand_compact_segments",
    num_warps=4,
)
# CuTe DSL: the inline-tile stage decoder (building block of the inline-scale wgmma GEMM)
CUTE_STAGE_DECODER = "stage.inline_decoder"
CUTE_STAGE_DECODER_VERSION = 1


def stage_decoder_spec(fmt: ScaleFormat, record_bytes: int) -> ProgramSpec:
    """The CuTe stage decoder for full tiles of one record size (row-base deltas in the format's width)."""
    return ProgramSpec.of(CUTE_STAGE_DECODER, CUTE_STAGE_DECODER_VERSION, S=record_bytes, DB=DELTA_BITS[fmt.name])


# CuTe DSL: inline expansion through a shared-memory image of whole rows (csf_kernels/cute/inline_row_expander.py)
CUTE_ROW_EXPANDER = "expand.inline_rows"
CUTE_ROW_EXPANDER_VERSION = 2  # 2: narrow planes (GT=8) one warp per row block
# full tiles per column group: planes of at most 8 full tiles (one warp per row block), and wider (a CTA)
ROW_EXPANDER_GROUP_TILES = PER_WARP_GROUP_TILES, CTA_GROUP_TILES = (8, 32)
ROW_EXPANDER_STORES = (4, 2)  # bytes per image store: rows of 4k columns, or of even columns


def row_expander_spec(fmt: ScaleFormat, group_tiles: int, store: int) -> ProgramSpec:
    """The row expander of a format (its delta width and largest records) for one column-group size and
    image store width."""
    return ProgramSpec.of(
        CUTE_ROW_EXPANDER,
        CUTE_ROW_EXPANDER_VERSION,
        GT=group_tiles,
        STORE=store,
        DB=DELTA_BITS[fmt.name],
        MAXS=max(record_bytes_choices(fmt, TILE_COLS)),
        MAXST=max(max(record_bytes_choices(fmt, tc)) for tc in range(1, TILE_COLS)),
    )


@dataclass(frozen=True)
class RowImageLayout:
    """How the row expander covers a plane: ``groups`` column groups of ``group_tiles`` full tiles, rows
    imaged ``flat`` (one group holding whole rows, any even column count) or padded (16-byte multiple
    columns), words stored ``store`` bytes at a time."""

    group_tiles: int
    groups: int
    flat: bool
    store: int

    @property
    def per_warp(self) -> bool:
        """Expanded one warp per row block (csf_kernels/cute/narrow_row_expander.py)."""
        return self.group_tiles == PER_WARP_GROUP_TILES


# CuTe DSL: one program per plane shape, a 128-row block per warp, or per CTA where rows split into column
# groups (csf_kernels/cute/row_block_expander.py)
CUTE_ROW_BLOCK_EXPANDER = "expand.row_blocks"
CUTE_ROW_BLOCK_EXPANDER_VERSION = 3  # 2: the pdl argument; 3: column groups of rows that are not 16-byte multiples
# whole rows: a warp's own image of 128 rows, 20 KiB at most; rows split into column groups: the CTA's image, 56 KiB
# at most (Kimi-K2 TP16 NVFP4's W13, 14 warps and ~98 KiB of shared memory a CTA: two an SM). Wider planes, and
# wide rows no group size divides, take the row expanders
ROW_BLOCK_MAX_WHOLE_COLS = 160
ROW_BLOCK_MAX_COLS = 448


ROW_BLOCK_MAX_GROUP_TILES = 8  # a warp decodes 32-byte row segments: 32 warps per SM
# rows that are not 16-byte multiples are imaged 16 or 32 bits at a time, so their groups need not be multiples of
# four tiles: up to this many, at least four (a warp's serial decode bounds a few-expert expansion's latency)
ROW_BLOCK_MAX_FLAT_GROUP_TILES = 12


def row_block_group_tiles(cols: int) -> int:
    """Full tiles per item of the row-block expander: whole rows (tail included) up to
    ``ROW_BLOCK_MAX_GROUP_TILES`` tiles; wider rows split into equal column groups, the last one taking the tail:
    16-byte multiples into groups of a multiple of four tiles (whole 16-byte image stores; DS4.1-TP4 W13: five
    groups of 8), other rows into the fewest groups of 4 to ``ROW_BLOCK_MAX_FLAT_GROUP_TILES`` tiles (gpt-oss's
    90 columns: two of 11, the tail in the second), or whole where none divides them."""
    full = cols // TILE_COLS
    if full <= ROW_BLOCK_MAX_GROUP_TILES:
        return full
    if cols % 16 == 0:
        return max(gt for gt in range(4, ROW_BLOCK_MAX_GROUP_TILES + 1, 4) if full % gt == 0)
    return max((gt for gt in range(4, ROW_BLOCK_MAX_FLAT_GROUP_TILES + 1) if full % gt == 0), default=full)


def row_block_groups(cols: int) -> int:
    """Column groups a row of ``cols`` columns splits into for the row-block expander (1: whole rows)."""
    return (cols // TILE_COLS) // row_block_group_tiles(cols)


def row_block_warps(cols: int) -> int:
    """Warps per CTA of the row-block expander: one per column group where rows split (the CTA images whole
    rows together), else four for rows up to 32 bytes and two above (each warp its own rows)."""
    groups = row_block_groups(cols)
    if groups > 1:
        return groups
    return 4 if cols <= 32 else 2


def row_block_covers(cols: int, plane_bytes: int, out_ptr: int = 0) -> bool:
    """Whether the row-block expander takes a plane: even columns, at most ``ROW_BLOCK_MAX_WHOLE_COLS`` or, in
    column groups, ``ROW_BLOCK_MAX_COLS``, output in 16-byte chunks."""
    if cols % 2 or not 0 < cols <= ROW_BLOCK_MAX_COLS or plane_bytes % 16 or out_ptr % 16:
        return False
    return cols <= ROW_BLOCK_MAX_WHOLE_COLS or row_block_groups(cols) > 1


def row_block_expander_spec(fmt: ScaleFormat, cols: int) -> ProgramSpec:
    """The row-block expander of a format's planes of ``cols`` columns (any record size of the format)."""
    return ProgramSpec.of(
        CUTE_ROW_BLOCK_EXPANDER,
        CUTE_ROW_BLOCK_EXPANDER_VERSION,
        COLS=cols,
        GT=row_block_group_tiles(cols),
        DB=DELTA_BITS[fmt.name],
        MAXS=max(record_bytes_choices(fmt, TILE_COLS)),
        MAXST=max(max(record_bytes_choices(fmt, tc)) for tc in range(1, TILE_COLS)),
    )


def row_image_layout(cols: int, plane_bytes: int, out_ptr: int = 0) -> RowImageLayout | None:
    """The row expander's layout for a plane of ``cols`` scale columns, or None where only the Triton
    expansion applies (its output is not 16-byte chunked, rows of an odd column count, or rows wider than a
    group without 16-byte rows)."""
    if plane_bytes % 16 or out_ptr % 16 or cols % 2:
        return None
    store = 4 if cols % 4 == 0 else 2
    full = cols // TILE_COLS
    gt = PER_WARP_GROUP_TILES if full <= PER_WARP_GROUP_TILES else CTA_GROUP_TILES
    if cols % 16 == 0:
        return RowImageLayout(gt, -(-full // gt), flat=False, store=store)
    if full > CTA_GROUP_TILES:
        return None
    return RowImageLayout(gt, 1, flat=True, store=store)


COMPACT_COLUMNS_PER_STEP = 64


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def inline_store_bytes(cols: int, out_ptr: int = 0) -> int:
    """Widest store (16, 8, 4, 2 or 1 bytes) that every row of a ``cols``-byte plane stays aligned for."""
    for width in (16, 8, 4, 2):
        if cols % width == 0 and out_ptr % width == 0:
            return width
    return 1


def inline_tiles_per_program(full_tiles: int, store: int) -> int:
    """Full tiles per program: the most the store width allows that the plane fills at least once (a
    program past the plane's last tile is masked)."""
    choices = TILES_BY_STORE[store]
    return next((t for t in choices if t <= full_tiles), choices[-1])


NARROW_COLS = 32  # planes at most this wide, with 2-byte aligned rows, store whole rows (see below)


def inline_narrow(cols: int, out_ptr: int = 0, rows: int = 2, row_group: int = 2) -> bool:
    """Whether a plane's program holds every full tile of a row block and stores them row by row: narrow
    planes whose rows are 2- but not 8-byte aligned (wider alignments take vector stores of their tile
    words), at least one tile wide. Rows per expert and per row group must be even (programs store row
    pairs)."""
    even = rows % 2 == 0 and row_group % 2 == 0
    return even and 4 <= cols <= NARROW_COLS and cols % 2 == 0 and cols % 8 != 0 and out_ptr % 4 == 0


def inline_row_words(cols: int) -> int:
    """Full tiles a narrow plane's program decodes (all of its row block's): a power of two."""
    return _pow2(max(1, cols // TILE_COLS))


def _widest_selectors(record_bytes: int) -> int:
    return max(w for w in (1, 2, 4) if exception_capacity(w, record_bytes) >= 0)


def inline_class_spec(
    fmt: ScaleFormat,
    record_bytes: int,
    tail_cols: int = 0,
    store: int = 16,
    tiles_per_program: int | None = None,
    num_warps: int | None = None,
    narrow: bool = False,
) -> ProgramSpec:
    """The expansion program of a plane whose full tiles have records of ``record_bytes`` (0: the plane
    is narrower than one tile) and whose last ``tail_cols`` columns (0..3) form a tail tile.

    ``store``: bytes per store (see :func:`inline_store_bytes`); ``tiles_per_program``: see
    :func:`inline_tiles_per_program` (default: the most the store allows); ``num_warps``: sweeps only;
    ``narrow``: see :func:`inline_narrow` (then ``tiles_per_program`` is :func:`inline_row_words`)."""
    if record_bytes:
        tiles = tiles_per_program or TILES_BY_STORE[store][0]
        maxw = _widest_selectors(record_bytes)
        # the narrowest selectors leave the most room for exceptions
        entries = _pow2(max(1, exception_capacity(1, record_bytes)))
    else:
        tiles, maxw, entries = 1, 0, 1
    return ProgramSpec.of(
        EXPAND_INLINE.kernel,
        EXPAND_INLINE.version,
        S=record_bytes,
        CT=tiles,
        MAXW=maxw,
        EC=entries,
        TTC=tail_cols,
        DB=DELTA_BITS[fmt.name],
        STORE=store,
        NARROW=_pow2(2 * tiles + -(-tail_cols // 2)) if narrow else 0,  # halves a row may need
        num_warps=num_warps or (_narrow_warps(tail_cols) if narrow else _WARPS_BY_TILES[tiles]),
    )


def inline_plane_spec(fmt: ScaleFormat, record_bytes: int, cols: int, store: int, narrow: bool) -> ProgramSpec:
    """The expansion program of a plane of ``cols`` scale columns whose full tiles have records of
    ``record_bytes``, stored ``store`` bytes at a time; ``narrow``: see :func:`inline_narrow` (the caller
    knows the rows and the output pointer)."""
    full, tail = divmod(cols, TILE_COLS)
    if not full:
        return inline_class_spec(fmt, 0, tail, store)
    if narrow:
        return inline_class_spec(fmt, record_bytes, tail, store, inline_row_words(cols), narrow=True)
    return inline_class_spec(fmt, record_bytes, tail, store, inline_tiles_per_program(full, store))


def inline_expansion_specs(fmt: ScaleFormat, cols: int) -> list[ProgramSpec]:
    """Every record size a plane with ``cols`` scale columns may have chosen (assuming an aligned output
    plane, as torch allocates it)."""
    store, narrow = inline_store_bytes(cols), inline_narrow(cols)
    if cols < TILE_COLS:
        return [inline_plane_spec(fmt, 0, cols, store, narrow)]
    return [inline_plane_spec(fmt, s, cols, store, narrow) for s in record_bytes_choices(fmt, TILE_COLS)]


# the store widths a plane's rows allow, by its tail columns (cols % 4): odd tails leave odd-length rows
_ROW_STORES = {0: (1, 2, 4, 8, 16), 1: (1,), 2: (1, 2), 3: (1,)}


def format_expansion_specs(fmt: ScaleFormat) -> list[ProgramSpec]:
    """Expansion programs are geometry-independent: every record size, tail width, store width and
    tiles-per-program variant of a format, so any plane of it expands."""
    specs = []
    for tail, stores in _ROW_STORES.items():
        for store in stores:
            specs += [
                inline_class_spec(fmt, s, tail, store, tiles)
                for s in record_bytes_choices(fmt, TILE_COLS)
                for tiles in TILES_BY_STORE[store]
            ]
            if tail:  # planes narrower than one tile
                specs.append(inline_class_spec(fmt, 0, tail, store))
    for cols in range(2, NARROW_COLS + 1, 2):  # narrow planes, stored by rows
        if inline_narrow(cols):
            specs += inline_expansion_specs(fmt, cols)
    return list({spec.key: spec for spec in specs}.values())


def compact_spec(width: int) -> ProgramSpec:
    """The compact-form expansion program for payloads of this selector width."""
    return ProgramSpec.of(
        EXPAND_COMPACT.kernel,
        EXPAND_COMPACT.version,
        W=width,
        CB=COMPACT_COLUMNS_PER_STEP,
        num_warps=EXPAND_COMPACT.num_warps,
    )
