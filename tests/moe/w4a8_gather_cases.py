"""The cases of W4A8's gather-and-quantize programs, run by the interpreter entry point
(``tests/moe/interpret_w4a8_gather.py``) and the GPU test: after the alignment, each convention's FP8 bytes and
scales equal the torch references (on the CPU) on the gathered rows, bit for bit; empty slots quantize zeros, slots
past the blocks in use stay untouched, padding routes join no slot."""

from __future__ import annotations

from collections.abc import Callable

import torch

from csf_kernels.moe.engine_specs import engine_tile_n
from csf_kernels.moe.fp8_activations import ACTIVATION_CONVENTIONS, quantize_activations
from csf_kernels.moe.launch import align_launches, max_blocks_for
from csf_kernels.moe.specs import experts_bins
from csf_kernels.moe.w4a8 import gather_fp8_launch
from tests.moe.padding_routes import with_padding_routes

POISON = torch.iinfo(torch.int32).min
# tokens, experts, hidden, top_k: expert counts of catalog geometries (gpt-oss-20b's 32, gpt-oss-120b's 128), whose
# alignment programs the AOT cache holds at every block size; the GPU adds a case of 256-route blocks
CASES = [(1, 32, 64, 2), (40, 32, 1056, 3), (300, 128, 2080, 2)]
GPU_CASES = [*CASES, (2000, 32, 1056, 4)]


def run_case(seed: int, tokens: int, experts: int, hidden: int, top_k: int, *, run: Callable, device: str) -> None:
    """One routing's check; ``run`` executes a launch on ``device``'s tensors."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    x[0] *= 2.0**-24  # per-token scale at its floor; MXFP8 exponents clamped
    if tokens > 2:
        x[1] = torch.randn(hidden, generator=g) ** 3 * 50  # heavy-tailed, from the seeded generator
        x[2, :32] = 0
    x = x.to(torch.bfloat16)
    ids = torch.rand(tokens, experts, generator=g).topk(top_k, dim=1).indices.to(torch.int32).contiguous()
    ids = with_padding_routes(ids, experts)  # graph padding (the last route too when it is another token's)
    pairs = tokens * top_k
    bm = engine_tile_n(pairs / experts)
    blocks = max_blocks_for(pairs, experts, bm)
    i32 = dict(dtype=torch.int32, device=device)
    x, ids = x.to(device), ids.to(device)
    s = {
        "cursor": torch.full((experts_bins(experts),), POISON, **i32),
        "block_expert": torch.full((blocks,), POISON, **i32),
        "active_experts": torch.full((min(pairs, experts),), POISON, **i32),
        "meta": torch.full((4,), POISON, **i32),
        "sorted_ids": torch.full((blocks * bm,), POISON, **i32),
    }
    for launch in align_launches(ids, num_experts=experts, bm=bm, **s):
        run(launch)
    used = int(s["meta"][0]) * bm
    sid = s["sorted_ids"][:used].long().cpu()
    live = (sid >= 0) & (sid < pairs)
    gathered = torch.where(live[:, None], x.cpu()[sid.clamp(0, pairs - 1) // top_k], 0)
    for conv in ACTIVATION_CONVENTIONS:
        xq = torch.full((blocks * bm, hidden), 0xA5, dtype=torch.uint8, device=device)
        if conv == "per_token":
            xs = torch.full((blocks * bm,), float("nan"), device=device)
        else:
            xs = torch.full((blocks * bm, hidden // 32), 0xA5, dtype=torch.uint8, device=device)
        inverse = torch.full((pairs,), POISON, **i32)
        run(gather_fp8_launch(x, s["sorted_ids"], s["meta"], xq, xs, inverse, top_k=top_k, bm=bm, convention=conv))
        xq, xs, inverse = xq.cpu(), xs.cpu(), inverse.cpu()
        want_q, want_s = quantize_activations(gathered, conv)
        assert torch.equal(xq[:used], want_q), (conv, tokens, hidden)
        assert torch.equal(xs[:used].view(torch.uint8), want_s.contiguous().view(torch.uint8)), (conv, tokens)
        untouched = xs[used:].isnan() if conv == "per_token" else xs[used:] == 0xA5
        assert (xq[used:] == 0xA5).all() and untouched.all(), conv
        slots = torch.arange(used)[live]
        routes = sid[live]
        assert torch.equal(inverse[routes].long(), slots), conv
        dead = torch.ones(pairs, dtype=torch.bool)
        dead[routes] = False
        assert (inverse[dead] == POISON).all(), conv  # padding routes: no slot
