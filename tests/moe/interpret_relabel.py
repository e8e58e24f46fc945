"""The relabelled K order in Triton's CPU interpreter (a subprocess entry point): FC1's input copied into it
(``moe_relabel``) and FC2's written in it by the FC1 finish, both against ``csf_kernels.moe.relabel``'s reference.

Usage: python -m tests.moe.interpret_relabel SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys

import torch

import tests.interpreter  # noqa: F401  (switches the interpreter on before triton is imported)
from csf_codec import scale_format
from csf_kernels.moe.launch import GemmOperand, fc1_finish_launch, relabel_launch
from csf_kernels.moe.relabel import padded_k, relabel_reference
from tests.interpreter import run_launch


def check_input(fmt, k: int, gen: torch.Generator) -> None:
    x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
    out = torch.full((5, padded_k(k, fmt)), float("nan"), dtype=torch.bfloat16)
    run_launch(relabel_launch(x, out, fmt=fmt))
    assert torch.equal(out, relabel_reference(x, fmt)), f"{fmt.name} K={k}: relabelled input"


def check_finish(fmt, n: int, activation: str, gen: torch.Generator) -> None:
    experts, pairs, splits = 3, 7, 2
    ids = torch.randint(0, experts, (pairs,), generator=gen, dtype=torch.int32)
    ids[2] = -1  # a padding route: its row is never written
    fc1 = GemmOperand(
        values=torch.zeros(experts, 2 * n, 16, dtype=torch.uint8),
        scales=None,
        global_scale=torch.rand(experts, generator=gen) + 0.5 if fmt.name == "nvfp4" else None,
        bias=torch.randn(experts, 2 * n, generator=gen) if activation == "swiglu_oai" else None,
    )
    part = torch.randn(splits, pairs, 2 * n, generator=gen)
    outs = []
    for relabel in (0, 4 * fmt.block_size):
        width = padded_k(n, fmt) if relabel else n
        out = torch.full((pairs, width), float("nan"), dtype=torch.bfloat16)
        run_launch(fc1_finish_launch(part, ids, out, fc1=fc1, activation=activation, splits=splits,
                                     num_experts=experts, relabel=relabel))  # fmt: skip
        outs.append(out)
    live = ids >= 0
    want = relabel_reference(outs[0][live], fmt)
    assert torch.equal(outs[1][live], want), f"{fmt.name} N={n} {activation}: relabelled finish"
    assert outs[1][~live].isnan().all(), "a padding route's row was written"


def main() -> None:
    gen = torch.Generator().manual_seed(int(sys.argv[1]))
    cases = 0
    for name in ("mxfp4", "nvfp4"):
        fmt = scale_format(name)
        for k in (64, 160, 320, 576):  # whole and partial K steps of both formats
            check_input(fmt, k, gen)
            cases += 1
        for n, activation in ((160, "silu"), (96, "swiglu_oai")):
            check_finish(fmt, n, activation, gen)
            cases += 1
    print(f"ok {cases}")


if __name__ == "__main__":
    main()
