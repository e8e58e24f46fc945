"""The W4A8 consumers' conversion on the CPU: the torch twin of the kernel's E4M3 tables and prmt (the same bit
operations as its PTX) applied to W4A8 panel words gives, at every wgmma A register position, the E4M3 byte
:mod:`csf_kernels.moe.w4a8_operands` makes of that weight, bit for bit; the promotion and row factors equal
w4a8_operands' for every byte pair."""

from __future__ import annotations

import pytest
import torch

from csf_codec.fp4 import unpack_fp4
from csf_kernels.moe.engine_panels import engine_scale_panel
from csf_kernels.moe.kernels.w4a8_convert import (
    E4M3_LUT,
    GROUP_PTX,
    LUT_BIAS,
    PLAIN_TABLE,
    PROMOTION_FACTOR_PTX,
    ROW_FACTOR_PTX,
    convert_group,
    lut_table,
    promotion_factor_bits,
    row_factor_bits,
)
from csf_kernels.moe.w4a8_operands import (
    FOLD_MAX,
    FOLD_MIN,
    e4m3_from_e2m1,
    promotion_factor,
    row_factor,
    tile_fold,
    w4a8_weights,
)
from csf_kernels.moe.w4a8_panels import w4a8_bases, w4a8_tile_flags, w4a8_weight_panel, w4a8_words


def test_tables_match_the_operand_bytes_for_every_code_and_folding_offset():
    codes = torch.arange(16, dtype=torch.int64)
    for d in range(FOLD_MIN, FOLD_MAX + 1):
        want, exact = e4m3_from_e2m1(codes.to(torch.uint8), d)
        assert bool(exact.all())
        # codes 0..7 and 8..15 as the four weights of groups A and B of two words
        words = w4a8_words(torch.stack((codes[0:8], codes[8:16])).view(2, 8))
        words_hi = w4a8_words(torch.stack((codes[4:8].repeat(2), codes[12:16].repeat(2))))
        lo, hi = lut_table(torch.tensor(d + LUT_BIAS))
        got = []
        for w in (*words, *words_hi):
            for group in (0, 1):
                v = int(convert_group(w, lo, hi, group))
                got.append([(v >> (8 * i)) & 0xFF for i in range(4)])
        # words: (0..3 | 4..7), (8..11 | 12..15); words_hi: (4..7 | 4..7), (12..15 | 12..15)
        flat = got[0] + got[1] + got[2] + got[3]
        assert flat == want.tolist(), f"offset {d}"
        assert got[4] == want[4:8].tolist() and got[7] == want[12:16].tolist()


def test_table_index_wraps_to_the_folding_window():
    assert len(E4M3_LUT) == 16 and E4M3_LUT[LUT_BIAS] == PLAIN_TABLE
    assert PLAIN_TABLE == (0x3C383000, 0x4C484440)  # 0, 0.5, 1, 1.5 | 2, 3, 4, 6


def _fragment_bytes(panel: torch.Tensor, s_panel: torch.Tensor, bases: torch.Tensor, plain: bool) -> torch.Tensor:
    """The E4M3 byte each thread's A registers hold, placed at (row, k) by the PTX fragment of ``wgmma.m64nNk32``
    with 8-bit A (register ``v``: row ``16 w + g + 8 (v % 2)``, k ``4 q + 16 (v // 2) + byte``), converted by the
    twin: scale bytes from the scale panel, table index ``(s + LUT_BIAS - base) & 15`` (``plain``: d = 0)."""
    steps, blocks = panel.shape[:2]
    words = panel.contiguous().view(torch.int32).view(steps, blocks, 128, 4).to(torch.int64) & 0xFFFFFFFF
    rows, kk = blocks * 64, steps * 64
    out = torch.zeros(rows, kk, dtype=torch.int64)
    sc = s_panel.view(steps, -1, 2).to(torch.int64)  # [steps, rows, 2]
    t = torch.arange(128)
    w, g, q = t // 32, (t % 32) // 4, t % 4
    for blk in range(blocks):
        for v in range(4):
            row = blk * 64 + 16 * w + g + 8 * (v % 2)
            for step in range(steps):
                for j in range(2):
                    s = sc[step, row, j]
                    index = torch.full_like(s, LUT_BIAS) if plain else s + LUT_BIAS - bases[row].to(torch.int64)
                    lo, hi = lut_table(index)
                    reg = convert_group(words[step, blk, :, 2 * j + v // 2], lo, hi, v % 2)
                    for byte in range(4):
                        k = step * 64 + 32 * j + 4 * q + 16 * (v // 2) + byte
                        out[row, k] = (reg >> (8 * byte)) & 0xFF
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_panel_conversion_equals_w4a8_operands_bit_for_bit(seed):
    g = torch.Generator().manual_seed(seed)
    rows, k = 192, 192  # a partial 128-row tile and three steps
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(120, 125, (rows, k // 32), dtype=torch.uint8, generator=g)
    scales[5, 2] = 120 - 40  # far below its row: the first tile promotes
    scales[150, 1] = 255  # NaN: the second tile promotes too
    scales[7, 0] = scales[7].min() - 8  # the edges of the folding window stay folded
    scales[9, 1] = scales[9].max() + 6
    bases = w4a8_bases(scales)
    ops = w4a8_weights(packed, scales, bases)
    flags = w4a8_tile_flags(scales, bases)
    assert flags.tolist() == [0, 0]
    assert torch.equal(flags.bool(), tile_fold(ops.fold, 32).all(dim=-1))
    panel, s_panel = w4a8_weight_panel(packed), engine_scale_panel(scales)
    # folded blocks: the table's bytes carry the offset, as w4a8_operands folds it
    got = _fragment_bytes(panel, s_panel, bases, plain=False)[:rows, :k]
    fold = ops.fold.repeat_interleave(32, dim=-1)
    assert torch.equal(got[fold], ops.codes.to(torch.int64)[fold])
    # promoted tiles: plain E2M1 bytes, as w4a8_operands gives promoted blocks (and the factor the kernel uses)
    plain = _fragment_bytes(panel, s_panel, bases, plain=True)[:rows, :k]
    want_plain, _ = e4m3_from_e2m1(unpack_fp4(packed), 0)
    assert torch.equal(plain, want_plain.to(torch.int64))
    assert torch.equal(plain[~fold], ops.codes.to(torch.int64)[~fold])


def test_all_folding_scales_flag_every_tile():
    g = torch.Generator().manual_seed(3)
    scales = torch.randint(126, 128, (256, 8), dtype=torch.uint8, generator=g)
    assert w4a8_tile_flags(scales, w4a8_bases(scales)).tolist() == [1, 1]


def test_promotion_and_row_factors_equal_the_operands_for_every_byte():
    s = torch.arange(256, dtype=torch.int64).view(1, -1).expand(255, 256)  # [rows (bases), blocks]
    b = torch.arange(255, dtype=torch.int64).view(-1, 1).expand(255, 256)
    want = promotion_factor(s.to(torch.uint8), b[:, 0].to(torch.uint8)).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(promotion_factor_bits(s, b), want)
    base = torch.arange(255, dtype=torch.int64)
    assert torch.equal(row_factor_bits(base), row_factor(base.to(torch.uint8)).view(torch.int32).to(torch.int64))


def _run_ptx(asm: str, *args: int) -> int:
    """A small interpreter of the straight-line PTX these conversions use, on Python ints (32-bit registers)."""
    regs = {f"${i + 1}": a & 0xFFFFFFFF for i, a in enumerate(args)}

    def val(x: str) -> int:
        x = x.strip()
        return regs[x] if x in regs else int(x, 0) & 0xFFFFFFFF

    def signed(v: int) -> int:
        return v - (1 << 32) if v >= 1 << 31 else v

    for line in asm.replace("{", "").replace("}", "").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        pred = None
        if line.startswith("@"):
            pred, line = line[1:].split(" ", 1)
            if not regs[pred]:
                continue
        op, rest = line.split(" ", 1)
        dst, *src = [s.strip() for s in rest.split(",")]
        name = op.split(".")[0]
        a = [val(s) for s in src] if name not in ("setp", "selp") else None
        if name == "and":
            r = a[0] & a[1]
        elif name == "or":
            r = a[0] | a[1]
        elif name == "shl":
            r = (a[0] << a[1]) & 0xFFFFFFFF if a[1] < 32 else 0
        elif name == "shr":
            r = a[0] >> a[1] if a[1] < 32 else 0
        elif name == "mov":
            r = a[0]
        elif name in ("add", "sub"):
            r = (a[0] + a[1] if name == "add" else a[0] - a[1]) & 0xFFFFFFFF
        elif name == "neg":
            r = -a[0] & 0xFFFFFFFF
        elif name in ("min", "max"):
            pick = min if name == "min" else max
            r = pick(signed(a[0]), signed(a[1])) & 0xFFFFFFFF
        elif name == "prmt":
            pool = a[0] | (a[1] << 32)
            r = sum(((pool >> (8 * ((a[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
            assert all(not (a[2] >> (4 * i + 3)) & 1 for i in range(4)), "selector mode bits set"
        elif name == "setp":
            cmp, x, y = op.split(".")[1], val(src[0]), val(src[1])
            if op.endswith(".s32"):
                x, y = signed(x), signed(y)
            r = {"eq": x == y, "ge": x >= y, "lt": x < y}[cmp]
        elif name == "selp":
            r = val(src[0]) if regs[src[2]] else val(src[1])
        else:
            raise AssertionError(f"unexpected PTX {line!r}")
        regs[dst] = r
    return regs["$0"]


def test_ptx_computes_what_the_twins_compute():
    g = torch.Generator().manual_seed(5)
    words = torch.randint(0, 1 << 32, (64,), dtype=torch.int64, generator=g)
    index = torch.randint(0, 15, (64,), dtype=torch.int64, generator=g)
    lo, hi = lut_table(index)
    for group in (0, 1):
        want = convert_group(words, lo, hi, group)
        got = [_run_ptx(GROUP_PTX[group], int(w), int(a), int(b)) for w, a, b in zip(words, lo, hi, strict=True)]
        assert got == want.tolist()
    for s, b in [(0, 0), (0, 254), (127, 127), (128, 1), (255, 3), (254, 0), (10, 150), (1, 128), (3, 150)]:
        assert _run_ptx(PROMOTION_FACTOR_PTX, s, b) == int(promotion_factor_bits(torch.tensor(s), torch.tensor(b)))
    for b in (0, 1, 127, 254):
        assert _run_ptx(ROW_FACTOR_PTX, b) == int(row_factor_bits(torch.tensor(b)))
