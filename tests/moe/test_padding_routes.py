"""The tests' padding routes (``tests/moe/padding_routes.py``): ids outside [0, E) where asked, the rest of the
routing untouched, at least one padding route, a live route left to every token but the empty one, each invalid id
used, and a seeded generator's draws reproducible."""

from __future__ import annotations

import pytest
import torch

from .padding_routes import with_padding_routes

E = 8


def _routing(tokens: int, k: int, dtype: torch.dtype, seed: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, E, generator=g).topk(k, dim=1).indices.to(dtype).contiguous()


def _check(ids: torch.Tensor, padded: torch.Tensor, invalid: list[int], empty_token: bool) -> torch.Tensor:
    """The invariants every call keeps; returns the padding routes' mask."""
    pad = (padded < 0) | (padded >= E)
    assert padded.dtype == ids.dtype and padded.shape == ids.shape and padded.data_ptr() != ids.data_ptr()
    assert pad[0, 0], "the first route is always padding"
    assert torch.equal(padded[~pad], ids[~pad]), "a live route changed"
    assert set(padded[pad].tolist()) <= set(invalid), "a padding id not asked for"
    live = (~pad).any(dim=1)
    if empty_token:
        assert not live[-1], "the empty token kept a live route"
        live = live[:-1]
    assert live.all(), "a token lost every route"
    return pad


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("tokens", [1, 2, 7, 300])
def test_without_a_fraction_the_edges_are_padded_and_nothing_is_drawn(tokens, dtype):
    ids = _routing(tokens, 3, dtype)
    before = ids.clone()
    gen = torch.Generator().manual_seed(11)
    state = gen.get_state()
    padded = with_padding_routes(ids, E, gen=gen)
    assert torch.equal(ids, before), "the caller's ids changed"
    assert torch.equal(gen.get_state(), state), "a draw without a fraction"
    pad = _check(ids, padded, [-1, E], empty_token=False)
    assert padded[0, 0] == -1
    if tokens > 1:  # the last route on another token than the first: the first token keeps its others
        assert padded[-1, -1] == E and int(pad.sum()) == 2
    else:
        assert int(pad.sum()) == 1
    one = with_padding_routes(ids, E, invalid=[-1])
    assert one[0, 0] == -1 and int(_check(ids, one, [-1], empty_token=False).sum()) == 1


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("tokens", "k", "fraction"), [(5, 8, 0.15), (600, 8, 0.15), (40, 2, 0.3), (3, 4, 0.5)])
def test_a_fraction_of_random_padding_routes_uses_every_invalid_id(tokens, k, fraction, dtype):
    ids = _routing(tokens, k, dtype)
    invalid = [-1, E, torch.iinfo(dtype).max, torch.iinfo(dtype).min]
    padded = with_padding_routes(ids, E, invalid=invalid, fraction=fraction, gen=torch.Generator().manual_seed(7))
    pad = _check(ids, padded, invalid, empty_token=False)
    assert int(pad.sum()) == round(fraction * tokens * k)
    assert set(padded[pad].tolist()) == set(invalid), "an invalid id unused"
    again = with_padding_routes(ids, E, invalid=invalid, fraction=fraction, gen=torch.Generator().manual_seed(7))
    assert torch.equal(padded, again), "the same seed drew other routes"


@pytest.mark.parametrize("tokens", [1, 3, 600])
def test_the_empty_token_has_no_live_route(tokens):
    ids = _routing(tokens, 8, torch.int64)
    invalid = [-1, E, 2**62]
    for fraction in (0.0, 0.15):
        gen = torch.Generator().manual_seed(3)
        padded = with_padding_routes(ids, E, invalid=invalid, fraction=fraction, gen=gen, empty_token=True)
        pad = _check(ids, padded, invalid, empty_token=True)
        assert int(pad.sum()) == max(round(fraction * tokens * 8), 8 + (tokens > 1))
        assert set(padded[-1].tolist()) == set(invalid), "the empty token's ids cycle through the invalid ones"


def test_a_fraction_too_large_leaves_each_token_one_live_route():
    ids = _routing(50, 4, torch.int32)
    padded = with_padding_routes(ids, E, fraction=0.99, gen=torch.Generator().manual_seed(1))
    pad = _check(ids, padded, [-1, E], empty_token=False)
    assert ((~pad).sum(dim=1) == 1).all()


def test_ids_that_are_no_padding_or_a_fraction_without_a_generator_are_refused():
    ids = _routing(4, 2, torch.int32)
    for bad in ([0], [E - 1, -1], [-1, 2**31]):  # a live expert's id; not an int32
        with pytest.raises(AssertionError, match="not padding ids"):
            with_padding_routes(ids, E, invalid=bad)
    with pytest.raises(AssertionError, match="seeded generator"):
        with_padding_routes(ids, E, fraction=0.5)
    with pytest.raises(AssertionError, match="one route"):
        with_padding_routes(ids[:, :1], E)
