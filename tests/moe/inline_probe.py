"""A scale probe for the engine's inline source: a GEMM whose output is its scale bytes, one per (row, K block), so
the scale slots the decoder warp fills are observable and a wrong byte is named by where the decoder made it.

Every weight is E2M1 1.0 and every probe route row of ``x`` holds a single 1.0, at the first K of one scale block
``kb`` of its block's expert. So ``out[q, r] = bf16(1.0 * factor(s[e, r, kb]))`` exactly (MXFP4 ``2^(s - 127)``,
NVFP4 the E4M3 value, global scale 1), which :meth:`Probe.exposed` maps back to the byte. NaN scales would spread
through the zero products of a row, so probe planes hold none (:func:`probe_planes`).

:func:`report` compares the exposed bytes with the twin's (:mod:`csf_kernels.moe.engine_record_panel`) and names
each mismatch by unit (route block, 128-row tile), tile row, K block, the K step and the CTA's ring position (its
stage modulo the ring's depth), the record (row block, column tile, mode, exceptions, length), the decoder lane and
slot, the CTA's staging slot, and what the record says of the position (selector, raw, or the exception code);
then counts mismatches per kind of position, which is what points at the decoder's faulty branch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from csf_codec.engine_record_layout import (
    CODE_SHIFT,
    COUNT_MASK,
    COUNT_SHIFT,
    MODE_RAW,
    MODE_WIDTH,
    ORIGIN_SHIFT,
    POSITION_MASK,
    UNITS_MASK,
    UNITS_SHIFT,
    entry_bytes,
    selector_bytes,
)
from csf_codec.engine_records import EngineRecords
from csf_codec.tile_layout import TILE_COLS, TILE_ROWS
from csf_kernels.moe.engine_panels import panel_scales
from csf_kernels.moe.engine_record_panel import decode_record_step, empty_scale_panel
from csf_kernels.moe.engine_rows import DECODER_WARPS
from csf_kernels.moe.kernels.engine_record_lanes import RECORD_SLOTS, first_dealt

__all__ = ["Probe", "make_probe", "probe_planes", "report", "twin_scales"]

BLOCK = {"mxfp4": 32, "nvfp4": 16}
_ONES = 0x22  # two E2M1 1.0 nibbles
_NAN = {"mxfp4": (255,), "nvfp4": (0x7F, 0xFF)}


def factor_bits(fmt: str) -> torch.Tensor:
    """int16 [256]: the bf16 bits each scale byte's factor multiplies 1.0 into (NaN codes: their NaN)."""
    b = torch.arange(256)
    if fmt == "mxfp4":
        f = torch.exp2((b - 127).to(torch.float64)).to(torch.float32)
        f[255] = float("nan")
    else:
        f = b.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    return f.to(torch.bfloat16).view(torch.int16)


def probe_planes(planes: torch.Tensor, fmt: str) -> torch.Tensor:
    """``planes`` with NaN codes moved to the nearest finite byte (MXFP4 254, NVFP4 +-448), and NVFP4's -0 (0x80)
    to +0: the probe reads a scale from a sum that starts at +0, which a -0 product leaves +0, so the output cannot
    tell the two apart (the GEMM tests hold -0 scales bit for bit)."""
    out = planes.clone()
    for nan in _NAN[fmt]:
        out[out == nan] = nan - 1
    if fmt == "nvfp4":
        out[out == 0x80] = 0
    return out


@dataclass(frozen=True, eq=False)
class Probe:
    """The probe GEMM's operands: ``packed`` uint8 [E, R, K / 2] (all 1.0), ``x`` bf16 [NX, K], ``block_expert``
    int32 [blocks]; route row ``q`` probes scale block ``probe_block[q]`` of expert ``probe_expert[q]`` (-1: none)."""

    fmt: str
    experts: int
    rows: int
    cols: int
    tile_n: int
    packed: torch.Tensor
    x: torch.Tensor
    block_expert: torch.Tensor
    probe_expert: torch.Tensor
    probe_block: torch.Tensor

    @property
    def tiles_m(self) -> int:
        return -(-self.rows // TILE_ROWS)

    @property
    def k_steps(self) -> int:
        return self.cols // panel_scales(self.fmt).per_step

    def exposed(self, out: torch.Tensor) -> torch.Tensor:
        """int16 [E, R, cols]: the scale byte each (row, K block) shows in ``out`` (bf16 [NX, R]); -1 where no
        byte's factor has those bits, -2 where no route row probes it."""
        lut = torch.full((1 << 16,), -1, dtype=torch.int16)
        bits = factor_bits(self.fmt).to(torch.int64) & 0xFFFF
        for byte in reversed(range(256)):  # the lower byte of an ambiguous pair (NVFP4 +-0 both sum to +0)
            lut[bits[byte]] = byte
        lut[0] = 0
        got = torch.full((self.experts, self.rows, self.cols), -2, dtype=torch.int16)
        out_bits = out.detach().cpu().view(torch.int16).to(torch.int64) & 0xFFFF
        for q in torch.nonzero(self.probe_expert >= 0).flatten().tolist():
            got[self.probe_expert[q], :, self.probe_block[q]] = lut[out_bits[q, : self.rows]]
        return got


def make_probe(fmt: str, experts: int, rows: int, k: int, tile_n: int) -> Probe:
    """Each expert's scale blocks over as many route blocks as they take (``tile_n`` a block), with an invalid
    block (-1) after expert 0's and an out-of-range one (``E``) after expert 1's, which compute zeros."""
    cols = k // BLOCK[fmt]
    per = -(-cols // tile_n)
    experts_of_blocks, local = [], []
    for e in range(experts):
        experts_of_blocks += [e] * per
        local += list(range(per))
        if e < 2:
            experts_of_blocks.append(-1 if e == 0 else experts)
            local.append(-1)
    nx = len(experts_of_blocks) * tile_n
    x = torch.zeros(nx, k, dtype=torch.bfloat16)
    probe_expert = torch.full((nx,), -1, dtype=torch.int64)
    probe_block = torch.full((nx,), -1, dtype=torch.int64)
    for b, (e, m) in enumerate(zip(experts_of_blocks, local, strict=True)):
        if not 0 <= e < experts:
            continue
        for j in range(tile_n):
            kb = m * tile_n + j
            if kb < cols:
                q = b * tile_n + j
                x[q, kb * BLOCK[fmt]] = 1.0
                probe_expert[q], probe_block[q] = e, kb
    packed = torch.full((experts, rows, k // 2), _ONES, dtype=torch.uint8)
    block_expert = torch.tensor(experts_of_blocks, dtype=torch.int32)
    return Probe(fmt, experts, rows, cols, tile_n, packed, x, block_expert, probe_expert, probe_block)


def twin_scales(records: EngineRecords, experts: int, rows: int, cols: int) -> torch.Tensor:
    """int16 [E, R, cols]: the scale bytes the torch twin of the decoder writes, step by step."""
    per_step = panel_scales(records.fmt.name).per_step
    panel = empty_scale_panel(records)
    for step in range(panel.shape[0]):
        for block in range(records.geometry.row_blocks):
            decode_record_step(records, block, step, panel)
    by_row = panel.view(panel.shape[0], -1, per_step)[:, : experts * rows]  # [steps, E R, per_step]
    return by_row.permute(1, 0, 2).reshape(experts, rows, cols).to(torch.int16)


def _exceptions(rec: torch.Tensor, tc: int) -> tuple[str, dict[int, str]]:
    rec = rec.to(torch.int64)
    header = int(rec[0] | rec[1] << 8 | rec[2] << 16 | rec[3] << 24)
    mode, units = header & 3, (header >> UNITS_SHIFT) & UNITS_MASK
    if mode == MODE_RAW:
        return f"raw ({16 * units} B)", {}
    w, count = MODE_WIDTH[mode], (header >> COUNT_SHIFT) & COUNT_MASK
    origin = ((header >> ORIGIN_SHIFT) & 0xFF ^ 0x80) - 0x80
    at0 = 4 + selector_bytes(w, tc)
    kinds = {}
    for i in range(count):
        at = at0 + (3 * i) // 2
        entry = ((int(rec[at]) | int(rec[at + 1]) << 8) >> (4 * (i & 1))) & 0xFFF
        code = entry >> CODE_SHIFT
        kind = "escape" if code == 7 else (f"below {code}" if code < 4 else f"above {code}")
        kinds[entry & POSITION_MASK] = kind
    summary = f"w {w}, origin {origin}, {count} exceptions ({entry_bytes(count)} B of entries), {16 * units} B"
    return summary, kinds


def report(
    got: torch.Tensor, want: torch.Tensor, probe: Probe, records: EngineRecords, *, ctas: int, stages: int | None,
    limit: int = 8,
) -> str:  # fmt: skip
    """Empty when ``got`` equals ``want`` wherever probed, else the first ``limit`` mismatches located and, per kind
    of position (selector, raw, an exception's code), how many of the probed positions of that kind differ."""
    probed = got != -2
    differ = probed & (got != want)
    if not differ.any():
        return ""
    geo = records.geometry
    per_step = panel_scales(probe.fmt).per_step
    slot_of = {}  # flattened plane row -> (row block, slot)
    for rb, rows in enumerate(geo.block_rows().tolist()):
        slot_of |= {row: (rb, slot) for slot, row in enumerate(rows) if row >= 0}
    first_block = {}  # each expert's first route block
    for b, e in enumerate(probe.block_expert.tolist()):
        first_block.setdefault(e, b)
    valid = ((probe.block_expert >= 0) & (probe.block_expert < probe.experts)).tolist()
    parsed = {}

    def record(rb: int, j: int) -> tuple[str, dict[int, str], int]:
        if (rb, j) not in parsed:
            tc = TILE_COLS if j < geo.full_col_tiles else geo.tail_cols
            parsed[rb, j] = (*_exceptions(records.record(rb, j), tc), tc)
        return parsed[rb, j]

    def kind(e: int, r: int, kb: int) -> str:
        rb, slot = slot_of[e * probe.rows + r]
        summary, kinds, tc = record(rb, kb // TILE_COLS)
        return "raw" if summary.startswith("raw") else kinds.get(slot * tc + kb % TILE_COLS, "selector")

    def locate(e: int, r: int, kb: int) -> str:
        tm, row = divmod(r, TILE_ROWS)
        b = first_block[e] + kb // probe.tile_n
        u = b * probe.tiles_m + tm
        step = kb // per_step
        c, turn = u % ctas, u // ctas
        pos = turn * probe.k_steps + step
        ring = f"ring position {pos}" + (
            "" if stages is None else f" (stage {pos % stages}, parity {pos // stages % 2})"
        )
        rb, slot = slot_of[e * probe.rows + r]
        j, col = divmod(kb, TILE_COLS)
        summary = record(rb, j)[0]
        # records dealt round-robin over the CTA's walk to the decoder warps
        warps = len(DECODER_WARPS)
        slots = RECORD_SLOTS
        rank = (turn * geo.col_tiles + j) % warps
        staged = sum(
            len(range(first_dealt(rank, t * geo.col_tiles, warps), geo.col_tiles, warps))
            for t in range(turn)
            if valid[(c + ctas * t) // probe.tiles_m]
        ) + len(range(first_dealt(rank, turn * geo.col_tiles, warps), j, warps))
        return (f"unit {u} (route block {b}, tile {tm}) on CTA {c}, tile row {row}, K block {kb} (step {step}, "
                f"{ring}); record {j} of row block {rb} ({summary}), slot {slot} (lane {slot // 4}, word "
                f"{slot % 4}), column {col}, decoder warp {rank} of {warps}, its staging slot {staged % slots} "
                f"(parity {staged // slots % 2})")  # fmt: skip

    lines = []
    for e, r, kb in torch.nonzero(differ)[:limit].tolist():
        lines.append(f"  expert {e} row {r} K block {kb}: got {int(got[e, r, kb])}, want {int(want[e, r, kb])} "
                     f"[{kind(e, r, kb)}] at {locate(e, r, kb)}")  # fmt: skip
    bad, seen = Counter(), Counter()
    for (e, r, kb), d in zip(torch.nonzero(probed).tolist(), differ[probed].tolist(), strict=True):
        k = kind(e, r, kb)
        seen[k] += 1
        bad[k] += d
    per_kind = ", ".join(f"{k} {bad[k]}/{seen[k]}" for k in sorted(seen))
    lines.append(
        f"  {int(differ.sum())} of {int(probed.sum())} probed scales differ; per kind (differ/probed): {per_kind}"
    )
    return "\n".join(lines)
