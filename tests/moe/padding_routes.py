"""Padding routes for the MoE tests: route ids outside ``[0, E)`` (-1, ``E``, an id type's extremes) that a served
engine's routing holds for CUDA-graph padding, other expert-parallel ranks' experts and masked tokens, and that
every layer must skip (no slot, no row, nothing in the output)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def with_padding_routes(
    ids: torch.Tensor,
    experts: int,
    *,
    invalid: Sequence[int] | None = None,
    fraction: float = 0.0,
    gen: torch.Generator | None = None,
    empty_token: bool = False,
) -> torch.Tensor:
    """A copy of the route ids ``ids`` [T, k] (k >= 2) with padding routes, whose ids come from ``invalid`` (each
    outside ``[0, experts)`` and inside the ids' type; default ``(-1, experts)``):

    - always the first route (token 0, slot 0), ``invalid[0]``; with two tokens or more and two ids or more, also
      the last route (token T-1, slot k-1), ``invalid[1]``: the flattened routes' edges, placed without drawing;
    - ``fraction`` > 0: random routes drawn from the seeded ``gen`` (on its device) make the padding routes
      ``round(fraction * T * k)`` in all, their ids cycling through ``invalid`` (so each id appears once
      ``len(invalid)`` routes are drawn);
    - ``empty_token``: every route of the last token (one token: the whole call), ids cycling through ``invalid``.

    Every token but the empty one keeps at least one live route (``fraction`` is capped there). Without
    ``fraction`` nothing is drawn: ``gen`` may be None and a caller's stream of random data stays as it was."""
    t, k = ids.shape
    bad = [-1, experts] if invalid is None else [int(b) for b in invalid]
    info = torch.iinfo(ids.dtype)
    assert bad and all(not 0 <= b < experts and info.min <= b <= info.max for b in bad), f"not padding ids: {bad}"
    assert t >= 1 and k >= 2, f"[{t}, {k}] routes: a token of one route keeps no live route beside its padding"
    assert 0.0 <= fraction < 1.0, fraction
    out = ids.clone()
    pad = torch.zeros(t, k, dtype=torch.bool)
    out[0, 0], pad[0, 0] = bad[0], True
    if t > 1 and len(bad) > 1:
        out[-1, -1], pad[-1, -1] = bad[1], True
    if empty_token:
        out[-1] = torch.tensor([bad[i % len(bad)] for i in range(k)], dtype=ids.dtype).to(out.device)
        pad[-1] = True
    more = round(fraction * t * k) - int(pad.sum())
    if more > 0:
        assert gen is not None, "padding a fraction of the routes draws them from a seeded generator"
        score = torch.rand(t, k, generator=gen, device=gen.device).cpu()
        score[pad] = -1.0
        free = ~pad
        free[torch.arange(t), score.argmax(dim=1)] = False  # each token's live route: a random one not padded
        free_routes = free.flatten().nonzero().flatten()
        order = torch.randperm(free_routes.numel(), generator=gen, device=gen.device).cpu()
        drawn = free_routes[order[:more]]
        values = torch.tensor([bad[i % len(bad)] for i in range(drawn.numel())], dtype=ids.dtype)
        out[(drawn // k).to(out.device), (drawn % k).to(out.device)] = values.to(out.device)
    return out
