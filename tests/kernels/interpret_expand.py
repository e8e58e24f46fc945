"""Run the inline-expansion Triton kernel in Triton's CPU interpreter (a subprocess entry point).

Usage: python -m tests.kernels.interpret_expand SEED  -> prints "ok <cases>" or raises.
TRITON_INTERPRET must be set before triton is imported, hence the separate process.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch

from csf_codec import MXFP4, NVFP4, encode_compact, encode_inline
from csf_kernels.compact_tables import compact_tables
from csf_kernels.families import (
    COMPACT_COLUMNS_PER_STEP,
    inline_class_spec,
    inline_store_bytes,
    inline_tiles_per_program,
)
from csf_kernels.kernels.expand_compact import expand_compact_segments
from csf_kernels.kernels.expand_inline import expand_inline_tiles

from .interpret_cases import cases


def expand_interpreted(inline, out, experts):
    geo = inline.geometry
    bpe = geo.row_blocks // geo.experts
    classes = [(inline.records, inline.raw, inline.record_bytes, 4, geo.full_col_tiles, 0)]
    if geo.tail_cols:
        classes.append(
            (inline.tail, inline.tail_raw, inline.tail_record_bytes, geo.tail_cols, 1, geo.full_col_tiles * 4)
        )
    for rec, raw, s, tc, ct, c0 in classes:
        if ct == 0:
            continue
        store = inline_store_bytes(tc, inline.geometry.cols, c0, out.data_ptr())
        f = inline_class_spec(inline.fmt, s, tc, store, inline_tiles_per_program(tc, ct)).fact
        grid = (experts.numel() * bpe, -(-ct // f["CTG"]))
        raw = raw if raw.numel() else torch.zeros(1, dtype=torch.uint8)
        expand_inline_tiles[grid](
            inline.base_ref,
            inline.base_delta,
            rec,
            raw,
            out,
            experts,
            bpe,
            geo.blocks_per_group,
            geo.row_group,
            geo.rows,
            geo.cols,
            c0,
            ct,
            geo.experts,
            S=s,
            TC=tc,
            CTG=f["CTG"],
            EP=f["EP"],
            DB=f["DB"],
            STORE=f["STORE"],
            num_warps=4,
        )


def expand_compact_interpreted(tables, out, experts):
    shape = tables.shape
    num_experts = shape[0] if len(shape) == 3 else 1
    rpe = tables.rows // num_experts
    spe = -(-rpe // 128) + (1 if rpe % 128 else 0)
    empty = torch.zeros(1, dtype=torch.uint8)
    nz = lambda t: t if t.numel() else empty  # noqa: E731  (the interpreter cannot take empty pointers)
    expand_compact_segments[(experts.numel() * spe,)](
        nz(tables.codes),
        nz(tables.escapes),
        nz(tables.selectors),
        nz(tables.counts),
        nz(tables.exceptions),
        tables.chunk_offsets,
        tables.segment_escapes,
        out,
        experts,
        rpe,
        spe,
        num_experts,
        tables.rows,
        shape[-1],
        W=tables.width,
        CB=COMPACT_COLUMNS_PER_STEP,
        num_warps=4,
    )


def main(seed: int) -> None:
    n = 0
    for plane, fmt, group, experts in cases(seed):
        fmt = {"mxfp4": MXFP4, "nvfp4": NVFP4}[fmt]
        inline = encode_inline(plane, fmt, row_group=group)
        ids = torch.arange(inline.geometry.experts, dtype=torch.int32) if experts is None else experts
        for form in ("inline", "compact"):
            out = torch.full(plane.shape, 0xAB, dtype=torch.uint8)  # poisoned
            if form == "inline":
                expand_interpreted(inline, out, ids)
            else:
                expand_compact_interpreted(compact_tables(encode_compact(plane, fmt).payload), out, ids)
            _check(plane, out, ids, inline.geometry.experts, f"{form} case {n} ({fmt.name}, group {group})")
        n += 1
    print(f"ok {n}")


def _check(plane, out, ids, num_experts, what):
    live = [int(e) for e in ids.tolist() if 0 <= e < num_experts]
    want = torch.full_like(plane, 0xAB)
    view = want.view(-1, *plane.shape[-2:]) if plane.dim() == 3 else want.unsqueeze(0)
    src = plane.view(-1, *plane.shape[-2:]) if plane.dim() == 3 else plane.unsqueeze(0)
    for e in live:
        view[e] = src[e]
    if not torch.equal(out, want):
        bad = (out != want).nonzero()[:5].tolist()
        raise SystemExit(f"mismatch in {what} {tuple(plane.shape)}: first at {bad}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
