"""The FP4 weight words the MoE GEMMs read: packed E2M1 with each word's 32 bits permuted for conversion.

A 32-bit word holds eight E2M1 weights, weight ``i`` in nibble ``i`` (bits ``4i .. 4i + 3``: mantissa,
two exponent bits, sign), as stored by MXFP4 / NVFP4 checkpoints. The GEMMs turn a word into four bf16
pairs (weights 2k, 2k + 1 in the low and high halves) by placing each weight's four bits where a bf16
keeps them: sign at bit 15, exponent bits at 8..7, mantissa at bit 6 (+16 for the high half). That bf16
is the weight times 2**-126 exactly (E2M1's zero exponent lands on bf16's subnormals, which keep the
0.5), so one multiply by the block scale times 2**126 gives the scaled weight, rounded once as before.

Weight preparation permutes each word's bits (a bijection: :func:`checkpoint_words` restores the bytes)
so that the placement is cheap: pair 0's bits are already in place (one AND), pairs 1 and 2 are one
shift or rotation away (two instructions each), pair 3 needs two shifts (four). ``BIT_POSITIONS[i]``
are the word bits of weight ``i``'s (mantissa, exponent low, exponent high, sign). The conversion's PTX
(``kernels/moe_gemm.py``) spells these shifts and masks literally; tests/kernels/test_fp4_words.py holds
it to the constants here.

The words are also stored in **panel order** within each block of ``PANEL_ROWS`` (64) rows of an expert: panels of
one GEMM K step (``PANEL_SCALE_BLOCKS`` scale blocks: 64 bytes a row for MXFP4, 32 for NVFP4) one after another,
each a [64 rows, panel bytes] row-major tile; a last panel narrower where the row ends mid-step. A program of a GEMM
reads 64 rows x one K step, so each step is one contiguous 4 KB (2 KB) tile, and the eight lanes of a 16-byte access
phase (two rows of four 16-byte quads, the MMA fragments' order) read 128 contiguous bytes (16-byte column panels of
64 rows would split each phase into four one-sector requests). Tiles stream at nearly copy bandwidth where
checkpoint row order does not (``docs/perf-notes.md``, "Weights are stored as one row-major tile per K step of a
64-row block"). The word of row ``r`` at byte ``b`` of its row lies at :func:`panel_offset` (which the kernels spell
out). The shape is unchanged ([..., rows, row_bytes]), so weights can be rearranged where they are.
"""

from __future__ import annotations

import torch

__all__ = [
    "BIT_POSITIONS",
    "PAIR3_MASKS",
    "PAIR3_SHIFTS",
    "PAIR_ROTATIONS",
    "PANEL_ROWS",
    "PANEL_SCALE_BLOCKS",
    "PLACED",
    "PLACED_MASK",
    "checkpoint_words",
    "gemm_words",
    "panel_bytes",
    "panel_offset",
    "place_bits",
    "unplace_bits",
]

PANEL_SCALE_BLOCKS = 4  # a panel's width in scale blocks: one K step of the GEMMs
PANEL_ROWS = 64  # rows per panel block: the decode GEMM's rows per program

PLACED = (6, 7, 8, 15)  # where a bf16 (low half) keeps E2M1's mantissa, exponent low / high bit, sign
PLACED_MASK = sum(1 << b for b in PLACED) * 0x10001  # both halves of a bf16 pair: 0x81C081C0


def _moved(dest: tuple[int, ...], left: int) -> tuple[int, ...]:
    """The word bits that a rotation left by ``left`` brings to ``dest``."""
    return tuple((d - left) % 32 for d in dest)


def _pair(left: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return _moved(PLACED, left), _moved(tuple(d + 16 for d in PLACED), left)


# pairs 0-2: the word rotated left by these bits, then masked with PLACED_MASK
PAIR_ROTATIONS = (0, 4, 10)
# pair 3: mantissa, exponent low and sign from the word shifted left by 6, exponent high from the word
# shifted right by 2; the masks of what each shift contributes
PAIR3_SHIFTS = (6, 2)
_LEFT_SHIFTED = (True, True, False, True)  # which of (mantissa, exponent low, exponent high, sign)
PAIR3_MASKS = tuple(
    sum(1 << b for b, by_left in zip(PLACED, _LEFT_SHIFTED, strict=True) if by_left == left) * 0x10001
    for left in (True, False)
)  # (0x80C080C0, 0x01000100)
_PAIR3_LO = tuple(
    d - PAIR3_SHIFTS[0] if left else d + PAIR3_SHIFTS[1] for d, left in zip(PLACED, _LEFT_SHIFTED, strict=True)
)
BIT_POSITIONS = (*(b for r in PAIR_ROTATIONS for b in _pair(r)), _PAIR3_LO, tuple(b + 16 for b in _PAIR3_LO))
assert sorted(b for w in BIT_POSITIONS for b in w) == list(range(32)), "the layout must be a bijection"
_CHUNK_WORDS = 1 << 24  # words per pass (64 MiB): bounds the temporaries on large expert stacks


def _moves(to_gemm: bool) -> dict[int, int]:
    """{left shift: mask of destination bits} taking checkpoint words to GEMM words (or back)."""
    moves: dict[int, int] = {}
    for i, bits in enumerate(BIT_POSITIONS):
        for j, placed in enumerate(bits):
            src, dst = (4 * i + j, placed) if to_gemm else (placed, 4 * i + j)
            moves[dst - src] = moves.get(dst - src, 0) | (1 << dst)
    return moves


def _permute(words: torch.Tensor, moves: dict[int, int]) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF  # as unsigned 32-bit values: no sign fill, no overflow
    out = torch.zeros_like(w)
    for left, mask in moves.items():
        out |= (w << left if left >= 0 else w >> -left) & mask
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


def place_bits(words: torch.Tensor) -> torch.Tensor:
    """Checkpoint words (int32, nibble ``i`` = weight ``i``) -> the same words with bits permuted for conversion
    (no panel reordering: for layouts that arrange words themselves)."""
    return _permute(words, _moves(True))


def unplace_bits(words: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`place_bits`."""
    return _permute(words, _moves(False))


def panel_bytes(block_size: int) -> int:
    """A panel's bytes a row for scale blocks of ``block_size`` weights (MXFP4 32: 64 bytes; NVFP4 16: 32)."""
    return PANEL_SCALE_BLOCKS * block_size // 2


def panel_offset(row: int, byte: int, rows: int, row_bytes: int, block_size: int) -> int:
    """Where byte ``byte`` of row ``row`` lies in an expert's ``rows`` x ``row_bytes`` words in panel order."""
    width = panel_bytes(block_size)
    block, panel = row // PANEL_ROWS, byte // width
    n = min(PANEL_ROWS, rows - block * PANEL_ROWS)  # the block's rows
    this_width = min(width, row_bytes - panel * width)  # narrower: the row's last, partial panel
    return block * PANEL_ROWS * row_bytes + panel * (n * width) + (row % PANEL_ROWS) * this_width + byte % width


def _block_rows(t: torch.Tensor, start: int, stop: int, n: int) -> torch.Tensor:
    """Rows ``start .. stop`` of every expert of ``t`` [b, rows, row_bytes] as [b, blocks of n rows, n *
    row_bytes] (a view)."""
    b, rows, row_bytes = t.shape
    return t.view(b, rows * row_bytes)[:, start * row_bytes : stop * row_bytes].view(b, -1, n * row_bytes)


def _reorder(src: torch.Tensor, dst: torch.Tensor, width: int, to_panels: bool) -> None:
    """Rows of experts ``src`` [b, rows, row_bytes] -> panel order in ``dst`` (or back): whole 64-row
    blocks, then a last partial block; in each block the whole panels, then the narrower last one."""
    b, rows, row_bytes = src.shape
    panels, full = row_bytes // width, rows // PANEL_ROWS * PANEL_ROWS
    for start, stop in ((0, full), (full, rows)):
        if stop <= start:
            continue
        n = min(PANEL_ROWS, stop - start)
        rows_first = _block_rows(src if to_panels else dst, start, stop, n)
        panels_first = _block_rows(dst if to_panels else src, start, stop, n)
        blocks = rows_first.shape[1]
        by_row = rows_first.view(b, blocks, n, row_bytes)
        pairs = (  # (row-major part, panel-major part) of the whole panels, then of the last one
            (by_row[..., : panels * width].unflatten(-1, (panels, width)).transpose(2, 3),
             panels_first[..., : n * panels * width].view(b, blocks, panels, n, width)),
            (by_row[..., panels * width :], panels_first[..., n * panels * width :].view(b, blocks, n, -1)),
        )  # fmt: skip
        for by_rows, by_panels in pairs:
            if to_panels:
                by_panels.copy_(by_rows)
            else:
                by_rows.copy_(by_panels)


def _apply(
    values: torch.Tensor, moves: dict[int, int], out: torch.Tensor | None, block_size: int, to_panels: bool
) -> torch.Tensor:
    if values.dtype != torch.uint8 or values.dim() < 2 or values.shape[-1] % 16 or not values.is_contiguous():
        raise ValueError(
            f"packed FP4 values must be contiguous uint8 [..., rows, 16n], got {values.dtype} {tuple(values.shape)}"
        )
    if out is None:
        out = torch.empty_like(values)
    elif (out.dtype, out.shape, out.device) != (torch.uint8, values.shape, values.device) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous uint8 {tuple(values.shape)} tensor on {values.device}")
    rows, row_bytes = values.shape[-2:]
    experts = values.view(-1, rows, row_bytes)
    into = out.view(-1, rows, row_bytes)
    # experts in chunks of about _CHUNK_WORDS words: each chunk maps onto itself, so ``out`` may be ``values``
    per_chunk = max(1, _CHUNK_WORDS * 4 // max(rows * row_bytes, 1))
    for start in range(0, experts.shape[0], per_chunk):
        chunk = experts[start : start + per_chunk]
        permuted = _permute(chunk.reshape(-1).view(torch.int32), moves).view(torch.uint8).view(chunk.shape)
        _reorder(permuted, into[start : start + per_chunk], panel_bytes(block_size), to_panels)
    return out


def gemm_words(values: torch.Tensor, block_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Checkpoint FP4 bytes [..., rows, 16n] -> the GEMMs' words (bits permuted, panel order for scale blocks
    of ``block_size`` weights), into ``out`` (default: a new tensor; may be ``values`` itself). The temporaries
    are allocated while this runs, so a caller may run it inside a private memory pool with ``out`` allocated
    outside."""
    return _apply(values, _moves(True), out, block_size, to_panels=True)


def checkpoint_words(values: torch.Tensor, block_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of :func:`gemm_words`."""
    return _apply(values, _moves(False), out, block_size, to_panels=False)
