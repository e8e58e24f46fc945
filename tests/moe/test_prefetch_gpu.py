"""Side-stream expansion of the next layer's scales (csf_moe.prefetch) on the GPU: a stack of MoE layers
gives the same bits with and without the prefetcher, while the side stream is held back and the slots
are poisoned (a missing wait would read poison); nothing carries across forward passes; under graph
capture the prefetcher steps aside."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels.catalog import load_catalog
from csf_moe import ExpansionPrefetcher, bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")
LAYERS = 3
MAX_TOKENS = 1024
TOKENS = 700  # above the inline token limit: every layer's call expands its scales
HOLD_CYCLES = 20_000_000  # ~10 ms of the side stream's time before each prefetch


@pytest.fixture(scope="module")
def stack():
    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    # records read in the GEMM at one token (the default expands at every count): a bucket that does not expand
    p = plan(geo, MAX_TOKENS, scale_source="inline", inline_token_limit=1)
    scratch = torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda")  # shared, as the engines do
    layers = [bind(p, prepare_weights(p, **synthetic_layer(geo, seed=SEED + i, device="cuda").weight_kwargs()), scratch)
              for i in range(LAYERS)]  # fmt: skip
    assert all(layer.expands(TOKENS) for layer in layers) and not layers[0].expands(1)
    return geo, layers


def _attention_stand_in(x: torch.Tensor) -> torch.Tensor:
    """Work on the current stream between two MoE calls, as the engine's attention would be (its result is
    dropped: the MoE input stays the previous layer's output)."""
    torch.nn.functional.silu(x.float() @ torch.ones(x.shape[1], 256, device=x.device))
    return x


def _forward(layers, x, routes, prefetcher=None, hold=False):
    outs = []
    for i, layer in enumerate(layers):
        ids, w = routes[i]
        x = _attention_stand_in(x)
        if prefetcher is None:
            y = layer.run(x, ids, w)
        else:
            if hold:  # hold the side stream back: the next expansion lands late
                with torch.cuda.stream(prefetcher.stream):
                    torch.cuda._sleep(HOLD_CYCLES)
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            y = prefetcher.run(i, layer, x, ids, w, next_layer=nxt)
        outs.append(y)
        x = y
    return outs


def _routes(geo, gen, t=TOKENS):
    x, _, _ = synthetic_routing(geo, t, gen)
    return x, [synthetic_routing(geo, t, gen)[1:] for _ in range(LAYERS)]


def test_prefetched_expansions_give_the_same_bits_even_when_late(stack):
    geo, layers = stack
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    x, routes = _routes(geo, gen)
    want = _forward(layers, x, routes)
    pf = ExpansionPrefetcher("cuda")
    for rep in range(3):
        for planes in pf._slots:  # stale slots between passes: every read must wait for its expansion
            if planes is not None:
                for p in planes:
                    p.fill_(0xFF)
        got = _forward(layers, x, routes, pf, hold=True)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"seed {SEED} pass {rep} layer {i}: prefetched output differs"
        assert pf.prefetched_calls == (rep + 1) * (LAYERS - 1)  # every layer but each pass's first


def test_nothing_carries_across_forward_passes_or_token_counts(stack):
    geo, layers = stack
    gen = torch.Generator(device="cuda").manual_seed(SEED + 1)
    x, routes = _routes(geo, gen)
    pf = ExpansionPrefetcher("cuda")
    want = _forward(layers, x, routes)
    # a pass cut short after layer 0 (its prefetch for layer 1 pending), then a new pass from layer 0
    pf.run(0, layers[0], x, *routes[0], next_layer=layers[1])
    assert pf.prefetched_calls == 0
    got = _forward(layers, x, routes, pf)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), f"seed {SEED}"
    assert pf.prefetched_calls == LAYERS - 1
    # a prefetch made for one token count is not read by a call with another
    x2, routes2 = _routes(geo, gen, t=TOKENS + 40)
    pf.run(0, layers[0], x, *routes[0], next_layer=layers[1])
    y = pf.run(1, layers[1], x2, *routes2[1], next_layer=None)
    assert pf.prefetched_calls == LAYERS - 1
    assert torch.equal(y, layers[1].run(x2, *routes2[1]))


def test_scale_planes_are_refused_where_the_bucket_does_not_expand(stack):
    geo, layers = stack
    gen = torch.Generator(device="cuda").manual_seed(SEED + 2)
    x, ids, w = synthetic_routing(geo, 1, gen)  # one token: the records are read inline, nothing expands
    planes = (torch.empty(geo.w13_scale_shape, dtype=torch.uint8, device="cuda"),
              torch.empty(geo.w2_scale_shape, dtype=torch.uint8, device="cuda"))  # fmt: skip
    with pytest.raises(ValueError, match="does not expand"):
        layers[0].run(x, ids, w, scale_planes=planes)
    with pytest.raises(ValueError, match="w2 plane must be"):
        layers[0].expansion_launches(planes[0], planes[0])


def test_under_graph_capture_the_prefetcher_steps_aside(stack):
    geo, layers = stack
    gen = torch.Generator(device="cuda").manual_seed(SEED + 3)
    x, routes = _routes(geo, gen)
    want = _forward(layers, x, routes)
    pf = ExpansionPrefetcher("cuda")
    _forward(layers, x, routes, pf)  # warm: bindings made eagerly
    calls = pf.prefetched_calls
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = _forward(layers, x, routes, pf)
    torch.cuda.current_stream().wait_stream(stream)
    g.replay()
    torch.cuda.synchronize()
    assert pf.prefetched_calls == calls  # no side-stream work was captured
    assert all(torch.equal(a, b) for a, b in zip(outs, want, strict=True)), f"seed {SEED}"
