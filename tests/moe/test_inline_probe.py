"""The inline scale probe on the CPU: a float32 emulation of the probe GEMM shows every scale byte of the plane, and
the report names a wrong byte by its place in the decoder (unit, row, K block, record, kind of position)."""

from __future__ import annotations

import torch

from csf_codec.engine_records import encode_engine_records
from csf_codec.quantize import dequantize_mxfp4, dequantize_nvfp4
from csf_codec.synthetic import DOWN_PROJ_DENSE, synthetic_scale_plane

from .inline_probe import make_probe, probe_planes, report, twin_scales


def _planes(fmt: str, experts: int, rows: int, cols: int) -> torch.Tensor:
    planes = synthetic_scale_plane((experts, rows, cols), fmt, DOWN_PROJ_DENSE if fmt == "mxfp4" else None, seed=3)
    planes[0] = torch.randint(0, 256, (rows, cols), generator=torch.Generator().manual_seed(4)).to(torch.uint8)
    return probe_planes(planes, fmt)


def _emulated(probe, planes: torch.Tensor) -> torch.Tensor:
    """What the probe GEMM computes: each valid block's rows of ``x`` times its expert's dequantized weights."""
    out = torch.zeros(probe.x.shape[0], probe.rows, dtype=torch.bfloat16)
    for b, e in enumerate(probe.block_expert.tolist()):
        if 0 <= e < probe.experts:
            if probe.fmt == "mxfp4":
                w = dequantize_mxfp4(probe.packed[e], planes[e]).to(torch.bfloat16).float()
            else:
                w = dequantize_nvfp4(probe.packed[e], planes[e], 1.0)
            rows = slice(b * probe.tile_n, (b + 1) * probe.tile_n)
            out[rows] = (probe.x[rows].float() @ w.T).to(torch.bfloat16)
    return out


def test_probe_shows_every_scale_byte():
    for fmt, k in (("mxfp4", 1088), ("nvfp4", 576)):
        experts, rows = 3, 320
        probe = make_probe(fmt, experts, rows, k, tile_n=16)
        planes = _planes(fmt, experts, rows, probe.cols)
        got = probe.exposed(_emulated(probe, planes))
        want = planes.to(torch.int16)
        if fmt == "nvfp4":  # +0 and -0 both sum to +0
            want = torch.where(want == 0x80, 0, want)
        assert torch.equal(got, want), fmt
        records = encode_engine_records(planes, fmt, row_group=rows)
        assert torch.equal(twin_scales(records, experts, rows, probe.cols), planes.to(torch.int16))


def test_report_locates_a_wrong_scale():
    fmt, experts, rows, k = "mxfp4", 3, 320, 1088
    probe = make_probe(fmt, experts, rows, k, tile_n=16)
    planes = _planes(fmt, experts, rows, probe.cols)
    records = encode_engine_records(planes, fmt, row_group=rows)
    want = twin_scales(records, experts, rows, probe.cols)
    assert report(probe.exposed(_emulated(probe, planes)), want, probe, records, ctas=5, stages=8) == ""
    wrong = planes.clone()
    wrong[2, 200, 17] = want[2, 200, 17] + 1  # expert 2, tile 1 row 72, record 4 (the tail: columns 16-17)
    text = report(probe.exposed(_emulated(probe, wrong)), want, probe, records, ctas=5, stages=8)
    # expert 2's blocks are route blocks 8-10 (3 an expert, an invalid block after experts 0 and 1): K block 17 is
    # block 9's; unit 28 is CTA 3's sixth (units 3, 8, 13, 18, 23 before it: 4 valid, 9 records each)
    w = int(want[2, 200, 17])
    assert f"expert 2 row 200 K block 17: got {w + 1}, want {w} [" in text
    assert (
        "unit 28 (route block 9, tile 1) on CTA 3, tile row 72, K block 17 (step 8, ring position 93 (stage 5, "
        "parity 1)); record 4 of row block 7 (w " in text
    )
    # record 49 of CTA 3's walk (turn 5 of 9 records, record 4) goes to decoder warp 49 % 3 = 1, whose 13th staged
    # record it is (three of each valid unit's nine, and record 1 of this one): its slot 1, parity 0
    assert "slot 3 (lane 0, word 3), column 1, decoder warp 1 of 3, its staging slot 1 (parity 0)" in text
    assert text.splitlines()[-1].startswith("  1 of ")
