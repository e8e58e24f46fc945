"""The cases of W4A8's FP8 activation programs, run by the interpreter entry point
(``tests/moe/interpret_w4a8_gather.py``) and the GPU test, every output poisoned first:

* FC1's gather by token, after the alignment (which writes each route's slot): each convention's FP8 bytes and
  scales at every routed slot equal the torch references (on the CPU) of its token's row, bit for bit; slots without
  a route (an expert's padding, blocks past those in use) keep the poison; padding routes (ids -1 and past ``E``)
  join no slot;
* FC2's row quantizer: the rows of the blocks in use equal the references row for row, bit for bit, the rest keep
  the poison;
* the combine through the routes' slots reads routed slots only: FC2's rows at every other slot NaN, its output
  equals the combine over the same rows in route order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from csf_kernels.moe.engine import combine_launch
from csf_kernels.moe.fp8_activations import ACTIVATION_CONVENTIONS, MX_BLOCK, quantize_activations
from csf_kernels.moe.launch import align_launches, max_blocks_for
from csf_kernels.moe.specs import experts_bins
from csf_kernels.moe.w4a8 import gather_fp8_launch, quantize_rows_fp8_launch
from csf_kernels.moe.w4a8_specs import w4a8_tile_n
from tests.moe.padding_routes import with_padding_routes

POISON = torch.iinfo(torch.int32).min
POISON_BYTE = 0xA5
# tokens, experts, hidden, top_k: expert counts of catalog geometries (gpt-oss-20b's 32, gpt-oss-120b's 128), whose
# alignment programs the AOT cache holds at every block size; (120, 32, ..) puts ~15 routes on an expert against
# 16-route blocks (experts over two blocks); the GPU adds a call aligned by three programs, in 128-route blocks
CASES = [(1, 32, 64, 2), (40, 32, 1056, 3), (120, 32, 160, 4), (300, 128, 2080, 2)]
GPU_CASES = [*CASES, (2000, 32, 1056, 4)]


def _poisoned(slots: int, hidden: int, convention: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    xq = torch.full((slots, hidden), POISON_BYTE, dtype=torch.uint8, device=device)
    if convention == "per_token":
        return xq, torch.full((slots,), float("nan"), device=device)
    return xq, torch.full((slots, hidden // MX_BLOCK), POISON_BYTE, dtype=torch.uint8, device=device)


def _untouched(xq: torch.Tensor, xs: torch.Tensor, convention: str) -> bool:
    scales = xs.isnan() if convention == "per_token" else xs == POISON_BYTE
    return bool((xq == POISON_BYTE).all()) and bool(scales.all())


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def _rows(g: torch.Generator, n: int, width: int, *, subnormals: bool) -> torch.Tensor:
    """bf16 rows with the conventions' edges: a row at the per-token scale's floor whose second block lies under
    2**-119 (MXFP8's exponent clamped at -127, a multiply by 2**127; with ``subnormals``, bf16 subnormals among them,
    which a flush-to-zero would break: Triton's CPU interpreter converts those to float32 wrongly, so its cases keep
    to normal values), a heavy-tailed one, a block of zeros, and a row of amax 13 holding 1.21875 * 2**e, whose
    quotients by its per-token scale round to other E4M3 bytes if multiplied by the scale's reciprocal (vLLM's
    kernel divides)."""
    r = torch.randn(n, width, generator=g)
    r[0] *= 2.0**-24
    tiny = r[0, MX_BLOCK : 2 * MX_BLOCK]
    if subnormals:
        tiny *= 2.0**-104  # about 2**-128: subnormals and the smallest normals
    else:
        tiny.copy_(tiny.sign() * (1 + torch.rand(tiny.shape, generator=g)) * 2.0**-124)  # normal, under 2**-123
    if n > 3:
        r[1] = torch.randn(width, generator=g) ** 3 * 50
        r[2, :MX_BLOCK] = 0
        r[3, 0] = 13.0
        r[3, 1:16] = 1.21875 * torch.exp2(torch.arange(-11.0, 4.0)) * (torch.randint(0, 2, (15,), generator=g) * 2 - 1)
    return r.to(torch.bfloat16)


def run_case(seed: int, tokens: int, experts: int, hidden: int, top_k: int, *, run: Callable, device: str) -> dict:
    """One routing's checks; ``run`` executes a launch on ``device``'s tensors. Returns what the case covered."""
    g = torch.Generator().manual_seed(seed)
    x = _rows(g, tokens, hidden, subnormals=device != "cpu")
    ids = torch.rand(tokens, experts, generator=g).topk(top_k, dim=1).indices.to(torch.int32).contiguous()
    ids = with_padding_routes(ids, experts)  # graph padding (the last route too when it is another token's)
    if tokens > 3:
        ids[tokens // 2, 0] = experts + 7  # an id far past E
    pairs = tokens * top_k
    bm = w4a8_tile_n(pairs / experts)
    blocks = max_blocks_for(pairs, experts, bm)
    slots = blocks * bm
    i32 = dict(dtype=torch.int32, device=device)
    x, ids = x.to(device), ids.to(device)
    s = {
        "cursor": torch.full((experts_bins(experts),), POISON, **i32),
        "block_expert": torch.full((blocks,), POISON, **i32),
        "active_experts": torch.full((min(pairs, experts),), POISON, **i32),
        "meta": torch.full((4,), POISON, **i32),
        "sorted_ids": torch.full((slots,), POISON, **i32),
        "route_slots": torch.full((pairs,), POISON, **i32),
    }
    for launch in align_launches(ids, num_experts=experts, bm=bm, **s):
        run(launch)
    used = int(s["meta"][0]) * bm
    sid = s["sorted_ids"][:used].long().cpu()
    route_slots = s["route_slots"].cpu()
    routed = (sid >= 0) & (sid < pairs)  # slots holding a route; the others of the blocks in use are padding
    live = ((ids >= 0) & (ids < experts)).reshape(-1).cpu()
    # what the gather relies on: each live route's slot, -1 for the others
    want_slots = torch.full((pairs,), -1, dtype=torch.int32)
    want_slots[sid[routed]] = routed.nonzero().flatten().to(torch.int32)
    assert torch.equal(route_slots, want_slots), (tokens, "route slots are not sorted_ids' inverse")
    assert torch.equal(route_slots >= 0, live), tokens
    slot_token = torch.full((slots,), -1, dtype=torch.int64)
    slot_token[:used][routed] = sid[routed] // top_k
    has_route = slot_token >= 0
    x_cpu = x.cpu()

    for conv in ACTIVATION_CONVENTIONS:
        xq, xs = _poisoned(slots, hidden, conv, device)
        run(gather_fp8_launch(x, s["route_slots"], xq, xs, top_k=top_k, convention=conv))
        xq, xs = xq.cpu(), xs.cpu()
        want_q, want_s = quantize_activations(x_cpu[slot_token[has_route]], conv)
        assert torch.equal(xq[has_route], want_q), (conv, tokens, hidden, "bytes")
        assert _same_bits(xs[has_route], want_s), (conv, tokens, hidden, "scales")
        assert _untouched(xq[~has_route], xs[~has_route], conv), (conv, tokens, "a slot without a route was written")

    # FC2's input: rows in block order (FC1's output, whatever it holds at padding slots) quantized where they lie
    inter = max(MX_BLOCK, hidden // 2 // MX_BLOCK * MX_BLOCK)
    a = _rows(g, slots, inter, subnormals=device != "cpu").to(device)
    for conv in ACTIVATION_CONVENTIONS:
        xq, xs = _poisoned(slots, inter, conv, device)
        run(quantize_rows_fp8_launch(a, s["meta"], xq, xs, bm=bm, convention=conv))
        xq, xs = xq.cpu(), xs.cpu()
        want_q, want_s = quantize_activations(a[:used].cpu(), conv)
        assert torch.equal(xq[:used], want_q) and _same_bits(xs[:used], want_s), (conv, tokens, inter)
        assert _untouched(xq[used:], xs[used:], conv), (conv, tokens, "rows past the blocks in use were written")

    # the combine through the routes' slots (W4A8's FC2 stores in block order) never reads a slot without a route
    y_slots = torch.full((slots, hidden), float("nan"), dtype=torch.bfloat16)
    y_slots[has_route] = torch.randn(int(has_route.sum()), hidden, generator=g).to(torch.bfloat16)
    y_routes = torch.full((pairs, hidden), float("nan"), dtype=torch.bfloat16)
    y_routes[live] = y_slots[route_slots[live].long()]
    weights = torch.rand(tokens, top_k, generator=g).to(device)
    outs = [torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16, device=device) for _ in range(2)]
    run(combine_launch(y_slots.to(device), None, ids, weights, outs[0], num_experts=experts,
                       inverse=s["route_slots"]))  # fmt: skip
    run(combine_launch(y_routes.to(device), None, ids, weights, outs[1], num_experts=experts))
    by_slot, by_route = (o.cpu() for o in outs)
    assert torch.isfinite(by_slot.float()).all(), (tokens, "the combine read a slot without a route")
    assert torch.equal(by_slot, by_route), tokens

    token_blocks = [{int(v) // bm for v in route_slots[t * top_k : (t + 1) * top_k] if v >= 0} for t in range(tokens)]
    block_expert = s["block_expert"][: used // bm].cpu()
    return {
        "padding routes": int((~live).sum()),
        "padding slots": int((~routed).sum()),
        "tokens over several blocks": sum(len(b) > 1 for b in token_blocks),
        "experts over several blocks": int((block_expert.bincount(minlength=experts) > 1).sum()),
    }
