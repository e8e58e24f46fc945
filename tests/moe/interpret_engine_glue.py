"""The engine layer's passes around its GEMMs in Triton's CPU interpreter (a subprocess entry point): align,
the gather pass, activation and combine, with torch standing in for the two grouped GEMMs (FC1 fed by the twin of
its producer's gather, :mod:`csf_kernels.moe.engine_rows`, which the gather pass must equal; FC2 stored by the
twin of its scattering epilogue into ``[pairs, H]``),
against a per-token torch model of the same roundings. The alignment's slots are checked as the GEMMs rely on them:
every route of an expert in ``[0, E)`` in exactly one slot of a block of its expert, each 16-byte chunk of its row
fetched by exactly one producer thread each K step and stored exactly once; empty slots fetch zeros and store
nothing; ids outside ``[0, E)`` contribute nothing; each route's slot (the gather pass's input) is sorted_ids' inverse.

Usage: python -m tests.moe.interpret_engine_glue SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys

import torch

from csf_kernels.moe.engine import act_launch, combine_launch, gather_tokens_launch
from csf_kernels.moe.engine_rows import (
    GATHER_THREADS,
    ROW_CHUNKS,
    gather_chunks,
    gathered_x,
    scattered_rows,
    slot_tokens,
    unit_walk,
)
from csf_kernels.moe.engine_specs import ENGINE_TILE_M, engine_tile_n
from csf_kernels.moe.launch import align_launches, max_blocks_for
from csf_kernels.moe.specs import experts_bins
from csf_moe.reference import activation
from tests.interpreter import run_launch
from tests.moe.padding_routes import with_padding_routes


def _case(seed: int, tokens: int, experts: int, hidden: int, inter: int, top_k: int, act: str, bias: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    ids = torch.rand(tokens, experts, generator=g).topk(top_k, dim=1).indices.to(torch.int32).contiguous()
    ids = with_padding_routes(ids, experts)  # graph padding (the last route too when it is another token's)
    wts = torch.rand(tokens, top_k, generator=g)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).to(torch.bfloat16)
    b13 = torch.randn(experts, 2 * inter, generator=g) if bias else None
    b2 = torch.randn(experts, hidden, generator=g) if bias else None
    pairs = tokens * top_k
    bm = engine_tile_n(pairs / experts)
    blocks = max_blocks_for(pairs, experts, bm)
    poison = torch.iinfo(torch.int32).min
    i32 = dict(dtype=torch.int32)
    s = {
        "cursor": torch.full((experts_bins(experts),), poison, **i32),
        "block_expert": torch.full((blocks,), poison, **i32),
        "active_experts": torch.full((min(pairs, experts),), poison, **i32),
        "meta": torch.full((4,), poison, **i32),
        "sorted_ids": torch.full((blocks * bm,), poison, **i32),
        "route_slots": torch.full((pairs,), poison, **i32),
    }
    for launch in align_launches(ids, num_experts=experts, bm=bm, **s):
        run_launch(launch)
    used = int(s["meta"][0])
    _check_slots(ids, s, used, bm, top_k, experts, hidden)
    # each route's slot, as the token-order gather pass reads them: the slot holding it, -1 where none does
    want_slots = torch.full((pairs,), -1, **i32)
    held = (s["sorted_ids"][: used * bm] >= 0) & (s["sorted_ids"][: used * bm] < pairs)
    want_slots[s["sorted_ids"][: used * bm][held].long()] = held.nonzero().flatten().to(torch.int32)
    assert torch.equal(s["route_slots"], want_slots), "the alignment's route slots are not sorted_ids' inverse"
    xs = gathered_x(x, s["sorted_ids"], used, bm, top_k)  # what FC1's stages hold
    # the gather pass (FC1 reading block-order rows by TMA) writes the same rows at the routes' slots, nothing else
    passed = torch.full((blocks * bm, hidden), float("nan"), dtype=torch.bfloat16)
    run_launch(gather_tokens_launch(x, s["route_slots"], passed, top_k=top_k))
    routed = torch.zeros(blocks * bm, dtype=torch.bool)
    routed[: used * bm] = (s["sorted_ids"][: used * bm] >= 0) & (s["sorted_ids"][: used * bm] < pairs)
    assert torch.equal(passed[routed], xs[: used * bm][routed[: used * bm]]), "the pass's rows differ from FC1's"
    assert torch.isnan(passed[~routed].float()).all(), "the gather pass wrote a slot without a route"
    h = torch.full((blocks * bm, 2 * inter), float("nan"), dtype=torch.bfloat16)
    for b in range(used):  # the FC1 GEMM's stand-in: bf16 rows in block order
        e = int(s["block_expert"][b])
        rows = slice(b * bm, (b + 1) * bm)
        h[rows] = (xs[rows].float() @ w13[e].float().T).to(torch.bfloat16)
    a = torch.full((blocks * bm, inter), float("nan"), dtype=torch.bfloat16)
    run_launch(act_launch(h, s["block_expert"], s["meta"], b13, a, num_experts=experts, bm=bm, activation=act))
    y_slots = torch.full((blocks * bm, hidden), float("nan"), dtype=torch.bfloat16)
    for b in range(used):
        e = int(s["block_expert"][b])
        rows = slice(b * bm, (b + 1) * bm)
        y_slots[rows] = (a[rows].float() @ w2[e].float().T).to(torch.bfloat16)
    y = torch.full((pairs, hidden), float("nan"), dtype=torch.bfloat16)  # rows of dropped routes stay NaN
    stores = scattered_rows(y_slots, s["sorted_ids"], used, bm, y)
    live = ((ids >= 0) & (ids < experts)).reshape(-1)
    assert torch.equal(stores, live.to(torch.int64)), "FC2 stores each live route's row once, nothing else"
    out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
    run_launch(combine_launch(y, b2, ids, wts, out, num_experts=experts))
    # W4A8's form: FC2's rows left in block order, each route found through the alignment's slot (dropped routes:
    # -1, never read)
    by_slot = torch.full_like(out, float("nan"))
    run_launch(combine_launch(y_slots, b2, ids, wts, by_slot, num_experts=experts, inverse=s["route_slots"]))
    assert torch.equal(by_slot, out), "the combine through each route's slot equals the one over routes"

    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            if not 0 <= e < experts:
                continue
            hh = (x[t].float() @ w13[e].float().T).to(torch.bfloat16).float()
            if bias:
                hh = hh + b13[e]
            aa = activation(hh[None], act)[0].to(torch.bfloat16).float()
            yy = (aa @ w2[e].float().T).to(torch.bfloat16).float()
            if bias:
                yy = yy + b2[e]
            want[t] += wts[t, j] * yy
    err = (out.float() - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= 1e-2 * scale + 1e-3, (tokens, experts, act, bias, err, scale)


def _check_slots(ids, s, used, bm, top_k, experts, hidden) -> None:
    """The alignment's slots as the gathering FC1 and the scattering FC2 read them."""
    tokens, pairs = ids.shape[0], ids.numel()
    slots = s["sorted_ids"][: used * bm]
    routes = slots[(slots >= 0) & (slots < pairs)]
    live = ((ids >= 0) & (ids < experts)).reshape(-1).nonzero().flatten()
    assert torch.equal(routes.sort().values, live.to(torch.int32)), "each live route in exactly one slot"
    experts_of = s["block_expert"][:used].repeat_interleave(bm)
    held = (slots >= 0) & (slots < pairs)
    assert torch.equal(experts_of[held], ids.reshape(-1)[slots[held].long()].to(torch.int32)), "slots of its expert"
    token = slot_tokens(slots, top_k, tokens)
    assert torch.equal(token[~held], torch.full_like(token[~held], tokens)), "empty slots fetch the zero row"
    assert torch.equal(token[held], slots[held].long() // top_k)
    chunks = sorted(rc for t in range(GATHER_THREADS) for rc in gather_chunks(bm, t))  # each K step, each once
    assert chunks == [(i, c) for i in range(bm) for c in range(ROW_CHUNKS)]
    tiles_m = -(-hidden // ENGINE_TILE_M)
    walked = sorted(u for cta in unit_walk(used, tiles_m, ctas=7) for u in cta)
    assert walked == [(b, t) for b in range(used) for t in range(tiles_m)], "every unit once"


def main(seed: int) -> None:
    cases = [
        (1, 8, 128, 64, 2, "silu", False),
        (40, 8, 128, 128, 3, "swiglu_oai", True),
        (300, 4, 64, 64, 2, "silu", True),
        (700, 8, 64, 64, 2, "silu", False),  # 1400 routes: the count, plan and scatter programs
    ]
    for case in cases:
        _case(seed, *case)
    print(f"ok {len(cases)}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
