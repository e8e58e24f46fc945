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
from csf_kernels.expand.compact_tables import compact_tables
from csf_kernels.expand.kernels.triton_compact import expand_compact_segments
from csf_kernels.expand.launch import inline_expansion_launches
from csf_kernels.expand.specs import COMPACT_COLUMNS_PER_STEP
from csf_kernels.runtime import Launch
from tests.interpreter import run_launch

from .interpret_cases import cases


def expand_interpreted(inline, out, experts, store=None):
    """The runtime's own launches (programs, grids, arguments), run by the interpreter."""
    for launch in inline_expansion_launches(inline, out, experts=experts, store=store, engine="triton"):
        # the interpreter cannot take empty pointers (planes without raw tiles)
        args = tuple(
            a if not (torch.is_tensor(a) and a.numel() == 0) else torch.zeros(1, dtype=a.dtype) for a in launch.args
        )
        run_launch(Launch(launch.spec, launch.grid, args))


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
        tables.far_offsets,
        tables.escape_offsets,
        tables.segment_escapes,
        out,
        experts,
        rpe,
        spe,
        num_experts,
        tables.rows,
        shape[-1],
        tables.exceptions.numel(),
        W=tables.width,
        CB=COMPACT_COLUMNS_PER_STEP,
        num_warps=4,
    )


def main(seed: int) -> None:
    n = 0
    for plane, fmt, group, experts, record_bytes in cases(seed):
        fmt = {"mxfp4": MXFP4, "nvfp4": NVFP4}[fmt]
        inline = encode_inline(plane, fmt, row_group=group, record_bytes=record_bytes)
        ids = torch.arange(inline.geometry.experts, dtype=torch.int32) if experts is None else experts
        # inline: the plane's widest stores, and byte stores (the masked, unvectorised path)
        for form in ("inline", "inline-bytes", "compact"):
            out = torch.full(plane.shape, 0xAB, dtype=torch.uint8)  # poisoned
            if form.startswith("inline"):
                expand_interpreted(inline, out, ids, store=1 if form == "inline-bytes" else None)
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
