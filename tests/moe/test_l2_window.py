"""L2 residency of the expanded scale planes (``runtime.l2_residency``, ``MoELayer.l2_window``): the window's
sizing and which calls run in it, on the CPU. The GPU suite checks that the window reaches the kernels (captured
into a graph's kernel nodes), that each stream's own window is restored, and that outputs do not change."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from csf_kernels import env
from csf_kernels.catalog import load_catalog
from csf_kernels.runtime.l2_residency import L2Window, window_over
from csf_moe import bind, plan
from csf_moe.layer import MoELayer, scale_planes_span

from .tiny_layer import tiny_layer

MIB = 1 << 20


def test_a_window_smaller_than_the_set_aside_persists_every_line():
    w = window_over(0x1000, 19 * MIB, set_aside=30 * MIB, max_window_bytes=128 * MIB)
    assert (w.base, w.num_bytes, w.hit_ratio) == (0x1000, 19 * MIB, 1.0)


def test_a_window_wider_than_the_set_aside_persists_the_fraction_that_fits():
    w = window_over(0x1000, 100 * MIB, set_aside=30 * MIB, max_window_bytes=128 * MIB)
    assert w.num_bytes == 100 * MIB and w.hit_ratio == pytest.approx(0.3)


def test_a_window_is_at_most_the_devices_largest():
    w = window_over(0x1000, 212 * MIB, set_aside=30 * MIB, max_window_bytes=128 * MIB)
    assert w.num_bytes == 128 * MIB and w.hit_ratio == pytest.approx(30 / 128)


@pytest.mark.parametrize("set_aside, size", [(0, MIB), (MIB, 0)])
def test_no_set_aside_or_no_region_means_no_window(set_aside, size):
    assert window_over(0x1000, size, set_aside=set_aside, max_window_bytes=128 * MIB) is None


@pytest.mark.parametrize("kwargs", [dict(base=0), dict(num_bytes=0), dict(hit_ratio=0.0), dict(hit_ratio=1.5)])
def test_a_window_out_of_range_is_refused(kwargs):
    with pytest.raises(ValueError):
        L2Window(**(dict(base=0x1000, num_bytes=MIB, hit_ratio=1.0) | kwargs))


@pytest.mark.parametrize("model, tp, fmt", [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "nvfp4")])
def test_the_span_is_both_expanded_planes_and_nothing_else(model, tp, fmt):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    p = plan(geo, 64, scale_source="inline")
    start, end = scale_planes_span(p)
    w13, w2 = p.scratch.w13_scales, p.scratch.w2_scales
    assert start == w13[0] and end == w2[0] + w2[1]
    assert w13[1] == torch.Size(geo.w13_scale_shape).numel() and w2[1] == torch.Size(geo.w2_scale_shape).numel()
    assert end - start - w13[1] - w2[1] < 256  # W2's region right after W13's (alignment aside)
    assert scale_planes_span(plan(geo, 64, scale_source="native")) is None


def test_a_span_with_w2_before_the_end_of_w13_is_refused():
    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    p = plan(geo, 8, scale_source="inline")
    w13 = p.scratch.w13_scales
    bad = replace(p, scratch=replace(p.scratch, w2_scales=(w13[0] + 256, 64)))
    with pytest.raises(ValueError, match="before the end"):
        scale_planes_span(bad)


WINDOW = L2Window(base=0x1000, num_bytes=MIB, hit_ratio=1.0)


def _tiny_plan():
    """A tiny inline layer's plan and weights; its calls of 1-2 tokens read records, larger ones expand."""
    _, layer = tiny_layer("mxfp4", "inline", seed=5, inline_token_limit=2)
    return layer.plan, layer.weights


def _aligned_scratch(p) -> torch.Tensor:
    """CPU scratch at a 256-byte address, as bind() requires of device scratch."""
    buf = torch.empty(p.scratch_bytes + 256, dtype=torch.uint8)
    start = -buf.data_ptr() % 256
    return buf[start : start + p.scratch_bytes]


def test_only_calls_expanding_into_the_layers_planes_run_in_its_window():
    p, weights = _tiny_plan()
    layer = MoELayer(plan=p, weights=weights, scratch=torch.empty(p.scratch_bytes, dtype=torch.uint8),
                     l2_window=WINDOW)  # fmt: skip
    assert not layer.expands(2) and layer.expands(8)
    assert layer.l2_window_for(2) is None  # reads the records: no plane
    assert layer.l2_window_for(8) == WINDOW
    planes = (torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8))
    assert layer.l2_window_for(8, scale_planes=planes) is None  # the caller's planes, the caller's placement
    assert replace(layer, l2_window=None).l2_window_for(8) is None


@pytest.mark.parametrize("argument, windowed", [(None, False), (False, False), (True, True)])
def test_bind_keeps_a_window_only_when_asked(monkeypatch, argument, windowed):
    """Off by default; the bind argument turns it on (the engine adapters pass ``CSF_L2_SCALES``, read at the
    edge: the layer reads no environment)."""
    import csf_moe.layer as layer_module

    asked = []
    monkeypatch.setattr(layer_module.runtime, "program", lambda spec, geometry=None: None)  # no GPU here
    monkeypatch.setattr(layer_module, "scale_planes_window", lambda p, scratch: asked.append(p) or WINDOW)
    monkeypatch.setenv(env.L2_SCALES, "1")  # ignored below the edge
    p, weights = _tiny_plan()
    kwargs = {} if argument is None else {"l2_resident_scales": argument}
    layer = bind(p, weights, _aligned_scratch(p), **kwargs)
    assert (layer.l2_window == WINDOW) is windowed and len(asked) == int(windowed)


def test_the_stream_attribute_carries_the_window_as_persisting_hits_and_normal_misses():
    """The driver structure the streams are given (built without a GPU; the GPU suite reads it back off kernel
    nodes)."""
    from cuda.bindings import driver

    from csf_kernels.runtime import l2_residency

    value = l2_residency._attr_value(L2Window(base=0x7F00_0000_0000, num_bytes=19 * MIB, hit_ratio=0.25))
    w = value.accessPolicyWindow
    assert (int(w.base_ptr), int(w.num_bytes)) == (0x7F00_0000_0000, 19 * MIB)
    assert w.hitRatio == pytest.approx(0.25)
    assert (w.hitProp, w.missProp) == (
        driver.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING,
        driver.CUaccessProperty.CU_ACCESS_PROPERTY_NORMAL,
    )
    for ids in (driver.CUstreamAttrID, driver.CUkernelNodeAttrID):
        attr = l2_residency._window_attr(ids)
        assert isinstance(attr, ids) and attr.name.endswith("ACCESS_POLICY_WINDOW")


def test_bind_warns_where_the_device_keeps_no_persisting_lines(monkeypatch):
    import csf_moe.layer as layer_module

    monkeypatch.setattr(layer_module.runtime, "program", lambda spec, geometry=None: None)  # no GPU here
    monkeypatch.setattr(layer_module, "scale_planes_window", lambda p, scratch: None)  # no set-aside on the device
    p, weights = _tiny_plan()
    with pytest.warns(UserWarning, match="keeps no persisting L2 lines"):
        layer = bind(p, weights, _aligned_scratch(p), l2_resident_scales=True)
    assert layer.l2_window is None
