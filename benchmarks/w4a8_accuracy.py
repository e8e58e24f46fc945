"""W4A8's accuracy trade (issue 47): relative error of the W4A8 layer's output against the W4A16 layer, both float32
references (``csf_moe.w4a8_reference``, ``csf_moe.reference``), per peer geometry, activation convention and
activation distribution, at several token counts.

Layers are ``csf_moe.synthetic`` experts of each peer geometry's shapes (H, N, top-k, activation, biases) with fewer
experts (``max(2 k, 8)``: the error is per route, and the full expert count only multiplies the CPU time); MXFP4
weights; W4A8's weight operands are exact, so every difference comes from the FP8 activations (FC1's input and FC2's
input). Activation rows (bf16):

* ``gaussian``: N(0, 1);
* ``heavy``: Student-t with 3 degrees of freedom, and 1% of the hidden channels (the same ones for every token)
  scaled by 20, as the outlier channels of LLM residual streams.

Reported per row: ``rel_fro`` = ||y8 - y16|| / ||y16|| over the whole output, ``rel_token_max`` = the largest
per-token ||y8_t - y16_t|| / ||y16_t||; and, for scale, the same figures for the W4A16 layer whose FC2 input is
rounded to bf16 (``bf16_intermediate``: what a bf16 engine rounds at least).

    python benchmarks/w4a8_accuracy.py --out benchmarks/results/w4a8-accuracy-DATE-COMMIT.json [--tokens 16 128 512]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance

from csf_kernels.catalog import load_catalog
from csf_kernels.moe.fp8_activations import ACTIVATION_CONVENTIONS
from csf_moe.reference import ExpertWeights, activation, moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from csf_moe.w4a8_reference import W4A8Experts, w4a8_moe_reference

PEERS = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))
SEED = 0


class _Kept:
    """W4A8 expert operands made once and reused across calls (``w4a8_moe_reference`` takes any such object)."""

    def __init__(self, w: W4A8Experts):
        self.experts, self.hidden = w.experts, w.hidden
        self._all = [w.expert(e) for e in range(w.experts)]

    def expert(self, e: int):
        return self._all[e]


def _activations(kind: str, tokens: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "gaussian":
        return torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    t = torch.distributions.StudentT(3.0).sample((tokens, hidden))  # global RNG: seeded in main
    channels = torch.randperm(hidden, generator=gen)[: max(1, hidden // 100)]
    t[:, channels] *= 20
    return t.to(torch.bfloat16)


def _bf16_intermediate(x, w: ExpertWeights, topk_weights, topk_ids, kind) -> torch.Tensor:
    """The W4A16 float32 layer with FC2's input rounded to bf16."""
    out = torch.zeros(x.shape[0], w.w2.shape[1])
    ids = topk_ids.long()
    for e in torch.unique(ids[(ids >= 0) & (ids < w.experts)]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w13, w2, b13, b2 = w.expert(e)
        h = x[tok].float() @ w13.T + (0 if b13 is None else b13.float())
        y = activation(h, kind).to(torch.bfloat16).float() @ w2.T + (0 if b2 is None else b2.float())
        out.index_add_(0, tok, y * topk_weights[tok, slot][:, None])
    return out


def _errors(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    per_token = (got - want).norm(dim=1) / want.norm(dim=1).clamp(min=1e-30)
    return {
        "rel_fro": float((got - want).norm() / want.norm()),
        "rel_token_max": float(per_token.max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512])
    args = ap.parse_args()
    torch.manual_seed(SEED)
    cat = load_catalog()
    rows = []
    started = time.time()
    for model, tp in PEERS:
        geo = cat.moe_geometry(model, tp, "mxfp4")
        geo = replace(geo, experts=max(2 * geo.top_k, 8))
        q = synthetic_layer(geo, seed=SEED).reference()
        w16 = ExpertWeights(
            w13=torch.stack([q.expert(e)[0] for e in range(q.experts)]),
            w2=torch.stack([q.expert(e)[1] for e in range(q.experts)]),
            b13=q.b13,
            b2=q.b2,
        )
        w8 = _Kept(W4A8Experts.of(q))
        gen = torch.Generator().manual_seed(SEED + 1)
        for tokens in args.tokens:
            _, ids, wts = synthetic_routing(geo, tokens, gen)
            for dist in ("gaussian", "heavy"):
                x = _activations(dist, tokens, geo.hidden, gen)
                want = moe_reference(x, w16, wts, ids, kind=geo.activation)
                row = {"geometry": geo.name, "experts": geo.experts, "tokens": tokens, "activations": dist}
                for conv in ACTIVATION_CONVENTIONS:
                    got = w4a8_moe_reference(x, w8, wts, ids, kind=geo.activation, convention=conv)
                    row[conv] = _errors(got, want)
                row["bf16_intermediate"] = _errors(_bf16_intermediate(x, w16, wts, ids, geo.activation), want)
                rows.append(row)
                print(json.dumps(row), flush=True)
        del q, w16, w8
    doc = {"provenance": provenance(), "rows": rows, "seconds": round(time.time() - started, 1)}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
