"""The MoE engine's operand panels: FP4 weights and their scale bytes rearranged so that a stage of the engine's
GEMM is one contiguous copy and each consumer thread reads its wgmma A fragments with one 16-byte load.

Terms (``docs/moe-engine.md`` §4.3): a *step* is 64 values of K (two MXFP4 scale blocks, four NVFP4 ones); a *row
block* is 64 weight rows, the M of one ``wgmma.m64nNk16``; a consumer warpgroup converts one row block per step.

**Weight panel** ``uint64 [steps, row blocks, 256]`` (2048 bytes a row block and step). Within one, thread ``t``
of the warpgroup (warp ``w = t // 32``, lane ``l``, ``g = l // 4``, ``q = l % 4``) owns bytes ``16 t .. 16 t + 15``:
four 32-bit words, word ``j`` for K slice ``j`` (16 values) of the step. Word ``j`` holds eight E2M1 values, in
nibble order, of rows ``r0 = 16 w + g`` and ``r1 = r0 + 8`` at ``k = 16 j + 2 q``::

    (r0, k) (r0, k+1) (r1, k) (r1, k+1) (r0, k+8) (r0, k+9) (r1, k+8) (r1, k+9)

which is the order of the wgmma A fragment's four bf16 pairs (PTX ``a0 .. a7``), with each word's bits then
permuted as :func:`csf_kernels.moe.fp4_words.gemm_words` places them (pair ``p`` = nibbles ``2p, 2p+1``). A
thread's 16 bytes are contiguous and the warp's 32 threads read 512 contiguous bytes: no bank conflicts. Slice
``j`` spans K ``16 j .. 16 j + 15`` of the step: half of MXFP4 block ``j // 2``, all of NVFP4 block ``j``.

**Scale panel** ``uint8 [steps, rows * b]`` with ``b`` scale blocks a step (:class:`PanelScales`: MXFP4 two E8M0
bytes, NVFP4 four E4M3 bytes): the step's bytes of each row, rows in order, so that a stage of ``M`` rows is ``b M``
contiguous bytes (NVFP4: one 32-bit word a row, byte ``j`` for slice ``j``).

Rows past the matrix's end (to a whole row block) and K past its end (to a whole step) are zero weights with the
scale byte of 1.0 (E8M0 127, E4M3 0x38): they contribute exact zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_kernels.moe.fp4_words import place_bits, unplace_bits

__all__ = [
    "ENGINE_SCALES",
    "FC1_SLAB",
    "PANEL_STEP_K",
    "PANEL_WORDS",
    "ROW_BLOCK",
    "PanelScales",
    "engine_scale_panel",
    "engine_weight_panel",
    "fc1_engine_rows",
    "fragment_codes",
    "panel_scales",
    "panel_scales_to_plane",
    "panel_words_to_plane",
    "words_to_panel",
]

PANEL_STEP_K = 64  # K values a step: two MXFP4 scale blocks, one 128-byte swizzle row of bf16 activations
ROW_BLOCK = 64  # weight rows a consumer warpgroup converts a step (the M of wgmma)
PANEL_BYTES = ROW_BLOCK * PANEL_STEP_K // 2  # one row block's step of FP4 values: 2048
PANEL_WORDS = PANEL_BYTES // 8  # the same as the uint64 words a TMA box of the panel counts
FC1_SLAB = 8  # outputs a slab of 16 engine rows: a wgmma accumulator thread holds rows r and r + 8 of each


@dataclass(frozen=True)
class PanelScales:
    """A weight format's scale bytes as panels hold them."""

    fmt: str  # the catalog's format name
    block: int  # K values a scale byte covers
    neutral: int  # the byte of 1.0, for padding

    @property
    def per_step(self) -> int:
        """Scale bytes a row a step."""
        return PANEL_STEP_K // self.block


ENGINE_SCALES = {"mxfp4": PanelScales("mxfp4", 32, 127), "nvfp4": PanelScales("nvfp4", 16, 0x38)}  # E8M0, E4M3


def panel_scales(fmt: str) -> PanelScales:
    if fmt not in ENGINE_SCALES:
        raise ValueError(f"the engine's panels hold {sorted(ENGINE_SCALES)} scales; got {fmt!r}")
    return ENGINE_SCALES[fmt]


def _fragment_index() -> torch.Tensor:
    """[128 threads, 4 slices, 8 nibbles] -> (row in the block, k in the step), as one flat index r * 64 + k."""
    t = torch.arange(128).view(128, 1, 1)
    j = torch.arange(4).view(1, 4, 1)
    n = torch.arange(8).view(1, 1, 8)
    w, lane = t // 32, t % 32
    g, q = lane // 4, lane % 4
    row = 16 * w + g + 8 * ((n // 2) % 2)  # nibbles 2, 3, 6, 7: row r1
    k = 16 * j + 2 * q + (n % 2) + 8 * (n // 4)  # nibbles 4..7: k + 8
    return row * PANEL_STEP_K + k


def _padded(t: torch.Tensor, rows: int, cols: int, fill: int) -> torch.Tensor:
    if t.shape == (rows, cols):
        return t
    out = torch.full((rows, cols), fill, dtype=t.dtype, device=t.device)
    out[: t.shape[0], : t.shape[1]] = t
    return out


def _shape(rows: int, k: int) -> tuple[int, int]:
    return -(-rows // ROW_BLOCK), -(-k // PANEL_STEP_K)


def fragment_codes(packed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Checkpoint FP4 bytes ``[rows, K / 2]`` (value ``2i`` in byte ``i``'s low nibble) -> int64 codes ``[steps, row
    blocks, 128, 4, 8]``: a thread's four words of eight values a step, taken at ``index`` (``[128, 4, 8]`` flat
    ``row * 64 + k`` in the row block's step); rows and K past the end are zeros."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"packed FP4 weights must be uint8 [rows, K / 2]; got {packed.dtype} {tuple(packed.shape)}")
    rows, k = packed.shape[0], packed.shape[1] * 2
    blocks, steps = _shape(rows, k)
    nib = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(rows, k)
    nib = _padded(nib, blocks * ROW_BLOCK, steps * PANEL_STEP_K, 0)
    # [blocks, 64, steps, 64] -> [steps, blocks, 64 * 64] (row, k) flat
    tiles = nib.view(blocks, ROW_BLOCK, steps, PANEL_STEP_K).permute(2, 0, 1, 3).reshape(steps, blocks, -1)
    return tiles[:, :, index.reshape(-1).to(nib.device)].view(steps, blocks, 128, 4, 8).to(torch.int64)


def words_to_panel(words: torch.Tensor) -> torch.Tensor:
    """int64 words (unsigned 32-bit values) ``[steps, row blocks, 128, 4]`` -> the panel ``uint64 [steps, row blocks,
    256]``."""
    steps, blocks = words.shape[:2]
    signed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return signed.contiguous().view(torch.uint8).view(steps, blocks, PANEL_BYTES).view(torch.int64).view(torch.uint64)


def engine_weight_panel(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint FP4 bytes ``[rows, K / 2]`` (value ``2i`` in byte ``i``'s low nibble) -> the weight panel
    ``uint64 [steps, row blocks, 256]`` (see the module docstring)."""
    frag = fragment_codes(packed, _fragment_index())
    words = (frag << (4 * torch.arange(8, device=frag.device))).sum(-1)  # nibble n at bits 4n..4n+3
    signed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    placed = place_bits(signed.view(-1)).to(torch.int64) & 0xFFFFFFFF
    return words_to_panel(placed.view(words.shape))


def panel_words_to_plane(panel: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Inverse of :func:`engine_weight_panel` (for tests): the checkpoint bytes ``[rows, K / 2]``."""
    blocks, steps = _shape(rows, k)
    words = unplace_bits(panel.contiguous().view(torch.int32).view(-1)).to(torch.int64) & 0xFFFFFFFF
    nib = (words.view(steps, blocks, 128 * 4, 1) >> (4 * torch.arange(8, device=panel.device))) & 0xF
    flat = torch.empty(steps, blocks, ROW_BLOCK * PANEL_STEP_K, dtype=torch.int64, device=panel.device)
    flat[:, :, _fragment_index().reshape(-1).to(panel.device)] = nib.view(steps, blocks, -1)
    full = flat.view(steps, blocks, ROW_BLOCK, PANEL_STEP_K).permute(1, 2, 0, 3).reshape(blocks * ROW_BLOCK, -1)
    full = full[:rows, :k].to(torch.uint8)
    return full[:, 0::2] | (full[:, 1::2] << 4)


def engine_scale_panel(scales: torch.Tensor, fmt: str = "mxfp4") -> torch.Tensor:
    """Scale bytes ``[rows, K / block]`` of ``fmt`` -> the scale panel ``uint8 [steps, row blocks * 64 * b]``."""
    kind = panel_scales(fmt)
    if scales.dtype != torch.uint8 or scales.dim() != 2:
        raise ValueError(f"scales must be uint8 [rows, K / {kind.block}]; got {scales.dtype} {tuple(scales.shape)}")
    rows, k = scales.shape[0], scales.shape[1] * kind.block
    blocks, steps = _shape(rows, k)
    b = kind.per_step
    full = _padded(scales, blocks * ROW_BLOCK, steps * b, kind.neutral)
    return full.view(blocks * ROW_BLOCK, steps, b).permute(1, 0, 2).reshape(steps, -1).contiguous()


def panel_scales_to_plane(panel: torch.Tensor, rows: int, k: int, fmt: str = "mxfp4") -> torch.Tensor:
    """Inverse of :func:`engine_scale_panel` (for tests)."""
    kind = panel_scales(fmt)
    steps, b = panel.shape[0], kind.per_step
    return panel.view(steps, -1, b).permute(1, 0, 2).reshape(-1, steps * b)[:rows, : k // kind.block]


def fc1_engine_rows(inter: int, interleaved: bool) -> torch.Tensor:
    """W13's rows in engine order, for FC1 with its activation in the GEMM's epilogue: ``perm`` (int64 ``[2N]``)
    such that engine row ``j`` is W13's row ``perm[j]``. Each slab of 16 engine rows holds the gate rows of 8
    outputs, then their up rows, so the thread holding accumulator row ``r`` holds ``r + 8`` too: output ``n``'s
    gate and up. W13's own order is [gate; up] (SiLU) or ``interleaved`` gate, up pairs (gpt-oss)."""
    if inter % FC1_SLAB:
        raise ValueError(f"FC1's fused activation needs N a multiple of {FC1_SLAB}; got {inter}")
    n = torch.arange(inter).view(-1, FC1_SLAB)
    gate, up = (2 * n, 2 * n + 1) if interleaved else (n, inter + n)
    return torch.cat((gate, up), dim=1).reshape(-1)
