"""Route alignment in Triton's CPU interpreter (a subprocess entry point): the one-program form (routes
scattered by the plan program, calls of at most one route chunk) groups routes as the two-program form does;
a one-token call's routes become blocks of their own, with the plan program's experts, routes and active list.

Usage: python -m tests.moe.interpret_align SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys

import torch

from csf_kernels.moe.launch import align_launches, max_blocks_for
from csf_kernels.moe.specs import (
    ALIGN_CHUNK,
    SCATTER_CHUNK,
    align_count_programs,
    align_count_spec,
    align_plan_spec,
    align_scatter_spec,
    experts_bins,
)
from csf_kernels.runtime import Launch, placeholder
from tests.interpreter import run_launch


def _scratch(pairs: int, experts: int, bm: int) -> dict[str, torch.Tensor]:
    blocks = max_blocks_for(pairs, experts, bm)
    # the count programs' rows of the three-program form land in sorted_ids too (calls over one chunk hold them)
    slots = max(blocks * bm, align_count_programs(pairs) * experts_bins(experts))
    poison = torch.iinfo(torch.int32).min  # nothing read may come from a previous call
    return {
        "cursor": torch.full((experts_bins(experts),), poison, dtype=torch.int32),
        "block_expert": torch.full((blocks,), poison, dtype=torch.int32),
        "active_experts": torch.full((experts,), poison, dtype=torch.int32),
        "meta": torch.full((1,), poison, dtype=torch.int32),
        "sorted_ids": torch.full((slots,), poison, dtype=torch.int32),
    }


def _two_programs(ids: torch.Tensor, experts: int, bm: int, s: dict) -> list[Launch]:
    """The count programs, the plan program without its scatter, then the scatter program (the form of calls above
    one chunk)."""
    ids64 = ids.dtype == torch.int64
    pairs = ids.numel()
    count = Launch(align_count_spec(experts, ids64), (align_count_programs(pairs),), (ids, s["sorted_ids"], pairs,
                                                                                        experts))  # fmt: skip
    no_slots = placeholder(ids.device)  # route slots are not asked for (INV=0)
    plan_args = (ids, s["cursor"], s["block_expert"], s["active_experts"], s["meta"], s["sorted_ids"], no_slots, pairs,
                 experts, s["active_experts"].numel())  # fmt: skip
    plan = Launch(align_plan_spec(experts, bm, ids64, scatter=False), (1,), plan_args)
    scatter = (ids, s["cursor"], s["sorted_ids"], no_slots, pairs, experts)
    return [count, plan, Launch(align_scatter_spec(ids64), (-(-pairs // SCATTER_CHUNK),), scatter)]


def _groups(ids: torch.Tensor, experts: int, bm: int, s: dict) -> dict[str, object]:
    blocks = int(s["meta"][0])
    block_expert = s["block_expert"][:blocks]
    routes = s["sorted_ids"][: blocks * bm].view(blocks, bm)
    pairs = ids.numel()
    flat = ids.reshape(-1).to(torch.int64)
    for b in range(blocks):  # every route of a block is one of its expert's, the rest are the sentinel
        live = routes[b][routes[b] != pairs].to(torch.int64)
        assert bool((flat[live] == block_expert[b]).all()), (b, live)
    return {
        "blocks": blocks,
        "block_expert": block_expert.tolist(),
        "active": s["active_experts"].tolist(),
        "cursor": s["cursor"][:experts].tolist(),
        "routes": [sorted(r.tolist()) for r in routes],  # order within a block is the atomics'
    }


def _one_token(ids: torch.Tensor, experts: int, bm: int) -> int:
    """Align one token's routes by the one-token program and by the plan program (in one chunk); check that
    each valid route is a block of its own with its expert, and that both list the same active experts."""
    pairs = ids.numel()
    mine, plans = _scratch(pairs, experts, bm), _scratch(pairs, experts, bm)
    launches = align_launches(ids, num_experts=experts, bm=bm, **mine)
    assert [la.spec.kernel for la in launches] == ["moe.align_routes"], launches
    run_launch(launches[0])
    # the plan program scattering the routes itself, as for calls of more tokens
    plan = align_plan_spec(experts, bm, ids.dtype == torch.int64, scatter=True)
    s = plans
    no_slots = placeholder(ids.device)
    args = (ids, s["cursor"], s["block_expert"], s["active_experts"], s["meta"], s["sorted_ids"], no_slots, pairs,
            experts, s["active_experts"].numel())  # fmt: skip
    run_launch(Launch(plan, (1,), args))
    flat = ids.reshape(-1).to(torch.int64)
    valid = [r for r in range(pairs) if 0 <= int(flat[r]) < experts]
    blocks = int(mine["meta"][0])
    assert blocks == len(valid), (blocks, valid)
    routes = mine["sorted_ids"][: blocks * bm].view(blocks, bm)
    assert routes[:, 0].tolist() == valid and bool((routes[:, 1:] == pairs).all()), routes
    assert mine["block_expert"][:blocks].tolist() == [int(flat[r]) for r in valid]
    assert sorted(mine["active_experts"].tolist()) == sorted(plans["active_experts"].tolist())
    first = list(dict.fromkeys(int(flat[r]) for r in valid))  # distinct experts, in route order
    assert mine["active_experts"][: len(first)].tolist() == first
    return 1


def main(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    cases = 0
    for experts, k, tokens, bm in ((8, 3, 5, 16), (40, 6, 37, 8), (384, 8, ALIGN_CHUNK // 8, 16)):
        for dtype in (torch.int32, torch.int64):
            ids = torch.randint(-2, experts + 2, (tokens, k), generator=gen).to(dtype)  # padding ids too
            pairs = ids.numel()
            one, two = _scratch(pairs, experts, bm), _scratch(pairs, experts, bm)
            launches = align_launches(ids, num_experts=experts, bm=bm, **one)
            assert len(launches) == 1 and launches[0].spec.fact["SCATTER"] == 1, launches
            for launch in launches:
                run_launch(launch)
            for launch in _two_programs(ids, experts, bm, two):
                run_launch(launch)
            got, want = _groups(ids, experts, bm, one), _groups(ids, experts, bm, two)
            assert got == want, (experts, k, tokens, dtype)
            valid = int(((ids >= 0) & (ids < experts)).sum())
            assert sum(len([r for r in b if r != pairs]) for b in got["routes"]) == valid
            cases += 1
    # calls of several count programs (four chunks each), the last one partial, and more than the plan sums a
    # load (nine): every valid route in exactly one block of its expert, each expert's routes in ceil(count / bm)
    # blocks
    for experts, k, tokens, bm in ((64, 4, (8 * ALIGN_CHUNK + 37) // 4, 32), (40, 6, 5 * ALIGN_CHUNK // 6, 8),
                                   (384, 8, (36 * ALIGN_CHUNK - 5) // 8, 128)):  # fmt: skip
        ids = torch.randint(-1, experts + 1, (tokens, k), generator=gen, dtype=torch.int32)
        s = _scratch(ids.numel(), experts, bm)
        launches = align_launches(ids, num_experts=experts, bm=bm, **s)
        kernels = [launch.spec.kernel for launch in launches]
        assert kernels == ["moe.align_count", "moe.align_plan", "moe.align_scatter"], kernels
        assert launches[0].grid == (align_count_programs(ids.numel()),), launches[0].grid
        for launch in launches:
            run_launch(launch)
        got = _groups(ids, experts, bm, s)
        flat = ids.reshape(-1)
        counts = torch.bincount(flat[(flat >= 0) & (flat < experts)].long(), minlength=experts)
        assert got["blocks"] == int(((counts + bm - 1) // bm).sum()), got["blocks"]
        assert sorted(got["block_expert"]) == sorted(e for e in range(experts) for _ in range(-(-int(counts[e]) // bm)))
        live = sorted(r for block in got["routes"] for r in block if r != ids.numel())
        assert live == [r for r in range(ids.numel()) if 0 <= int(flat[r]) < experts]
        cases += 1
    # one token: distinct experts (a router's top-k), then padding ids and a repeated expert
    for experts, k, bm in ((128, 4, 8), (384, 6, 16), (40, 10, 8)):
        for dtype in (torch.int32, torch.int64):
            ids = torch.randperm(experts, generator=gen)[:k].view(1, k).to(dtype)
            cases += _one_token(ids, experts, bm)
            odd = ids.clone()
            odd[0, 1], odd[0, -1] = -1, experts  # vLLM's padding
            odd[0, 2] = odd[0, 0]  # the same expert twice: two blocks, one active entry
            cases += _one_token(odd, experts, bm)
    print(f"ok {cases}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
