"""L2 residency of the expanded scale planes on the GPU (``csf_kernels.runtime.l2_residency``, ``bind(...,
l2_resident_scales=True)``): the set-aside is raised, every kernel of an expanding call captured into a graph carries
the window over the layer's planes (and none of a call without it), each stream's own window is restored after a
call, and the outputs stay native's bits, eager with poisoned scratch and in graph replays."""

from __future__ import annotations

import os

import pytest
import torch
from cuda.bindings import driver

from csf_kernels.catalog import load_catalog
from csf_kernels.expand.layer import side_stream
from csf_kernels.runtime import l2_residency
from csf_moe import bind, plan, prepare_weights
from csf_moe.layer import scale_planes_span
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from tests.cuda_graphs import replay_allocating_nothing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")  # fresh data every run; in every failure message
MAX_TOKENS = 1024
# 1: FC1 on W13's records, W2's expansion beside it; 8: the routed experts' expansions (chained, or forked where
# W13 is wide); 700: every expert's, W13's forked onto the side stream
TOKENS = (1, 8, 700)
GEOMETRIES = [("qwen3-30b-a3b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "nvfp4"), ("gpt-oss-120b", 1, "mxfp4")]
PERSISTING = driver.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
WINDOW_ATTR = l2_residency._window_attr()
NODE_WINDOW_ATTR = l2_residency._window_attr(driver.CUkernelNodeAttrID)


def _ok(result):
    err, *value = result if isinstance(result, tuple) else (result,)
    assert int(err) == 0, f"CUDA driver: {err!r}"
    return value[0] if len(value) == 1 else value


def _layers(geo, data):
    layers = {}
    for arm, source, l2 in (("native", "native", False), ("inline", "inline", False), ("inline_l2", "inline", True)):
        p = plan(geo, MAX_TOKENS, scale_source=source)
        scratch = torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda")
        layers[arm] = bind(p, prepare_weights(p, **data.weight_kwargs()), scratch, l2_resident_scales=l2)
    return layers


def _poisoned_run(layer, x, ids, w):
    layer.scratch.fill_(0xFF)
    return layer.run(x, ids, w, out=torch.full_like(x, float("nan")))


def _stream_window(stream: torch.cuda.Stream):
    w = _ok(driver.cuStreamGetAttribute(driver.CUstream(stream.cuda_stream), WINDOW_ATTR)).accessPolicyWindow
    return int(w.base_ptr), int(w.num_bytes)


def _kernel_windows(graph: torch.cuda.CUDAGraph) -> list[tuple[int, int, float, object]]:
    """(base, bytes, hit ratio, hit property) of the window of every kernel node of a kept graph."""
    g = driver.CUgraph(graph.raw_cuda_graph())
    _, count = _ok(driver.cuGraphGetNodes(g, 0))
    nodes, _ = _ok(driver.cuGraphGetNodes(g, count))
    out = []
    for node in nodes:
        if _ok(driver.cuGraphNodeGetType(node)) != driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
            continue
        w = _ok(driver.cuGraphKernelNodeGetAttribute(node, NODE_WINDOW_ATTR)).accessPolicyWindow
        out.append((int(w.base_ptr), int(w.num_bytes), float(w.hitRatio), w.hitProp))
    return out


def test_the_devices_l2_keeps_persisting_lines():
    lim = l2_residency.limits(torch.cuda.current_device())
    assert 0 < lim.max_persisting_bytes <= lim.l2_bytes and lim.max_window_bytes > 0, lim


@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES)
def test_windowed_calls_are_native_bits_and_restore_the_streams_window(model, tp, fmt):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    layers = _layers(geo, data)
    layer = layers["inline_l2"]
    window, device = layer.l2_window, torch.cuda.current_device()
    assert window is not None and layers["inline"].l2_window is None
    start, end = scale_planes_span(layer.plan)
    lim = l2_residency.limits(device)
    assert window.base == layer.scratch.data_ptr() + start
    assert window.num_bytes == min(end - start, lim.max_window_bytes)
    set_aside = _ok(driver.cuCtxGetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE))
    assert set_aside >= min(end - start, lim.max_persisting_bytes), set_aside
    assert window.hit_ratio == pytest.approx(min(1.0, set_aside / window.num_bytes))
    # a window of the caller's own on the current stream: a call runs in the layer's, then gives the caller's back
    own = torch.empty(4096, dtype=torch.uint8, device="cuda")
    mine = l2_residency._attr_value(l2_residency.L2Window(own.data_ptr(), own.numel(), 0.5))
    stream = torch.cuda.current_stream()
    handle = driver.CUstream(stream.cuda_stream)
    _ok(driver.cuStreamSetAttribute(handle, WINDOW_ATTR, mine))
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    try:
        for t in TOKENS:
            x, ids, w = synthetic_routing(geo, t, gen)
            want = _poisoned_run(layers["native"], x, ids, w).clone()
            for arm in ("inline", "inline_l2"):
                got = _poisoned_run(layers[arm], x, ids, w)
                assert torch.equal(got, want), f"seed {SEED} {geo.name} T={t}: {arm} != native"
            assert _stream_window(stream) == (own.data_ptr(), own.numel()), f"T={t}: the caller's window is lost"
            assert _stream_window(side_stream(device)) == (0, 0), f"T={t}: the side stream kept the layer's window"
    finally:
        _ok(driver.cuStreamSetAttribute(handle, WINDOW_ATTR, driver.CUstreamAttrValue()))  # no window, as before
        l2_residency.reset(device)


@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES[:2])
def test_every_kernel_of_a_captured_expanding_call_carries_the_window(model, tp, fmt):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    layers = _layers(geo, data)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    try:
        for t in TOKENS:
            x, ids, w = synthetic_routing(geo, t, gen)
            graphs, outs = {}, {}
            for arm in ("inline", "inline_l2"):
                layer, out = layers[arm], torch.empty_like(x)
                layer.run(x, ids, w, out=out)  # bind outside capture (eager warm-up, as engines do)
                torch.cuda.synchronize()
                graphs[arm], outs[arm] = torch.cuda.CUDAGraph(keep_graph=True), out
                with torch.cuda.graph(graphs[arm]):
                    layer.run(x, ids, w, out=out)
                graphs[arm].instantiate()  # a kept graph is instantiated on request (or at its first replay)
            window = layers["inline_l2"].l2_window
            windows = _kernel_windows(graphs["inline_l2"])
            assert len(windows) >= 3, f"T={t}: {len(windows)} kernel nodes"
            for base, size, ratio, prop in windows:
                assert (base, size, prop) == (window.base, window.num_bytes, PERSISTING), f"{geo.name} T={t}"
                assert ratio == pytest.approx(window.hit_ratio, rel=1e-6)
            assert all(size == 0 for _, size, _, _ in _kernel_windows(graphs["inline"])), f"T={t}: a window leaked"
            for _ in range(2):  # the replays: new routes, poisoned scratch, native's bits
                nx, nids, nw = synthetic_routing(geo, t, gen)
                x.copy_(nx), ids.copy_(nids), w.copy_(nw)
                want = _poisoned_run(layers["native"], x, ids, w).clone()
                for arm in graphs:
                    layers[arm].scratch.fill_(0xFF)
                    outs[arm].fill_(float("nan"))
                    replay_allocating_nothing(graphs[arm])
                    assert torch.equal(outs[arm], want), f"seed {SEED} {geo.name} T={t}: {arm} replay != native"
    finally:
        l2_residency.reset(torch.cuda.current_device())
