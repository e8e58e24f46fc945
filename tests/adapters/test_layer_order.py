"""The served model's MoE layer order (for the side-stream expansion prefetch) and its switch (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_serving_adapters.layer_order import PREFETCH_SWITCH, LayerOrder, prefetch_enabled


def test_layers_keep_their_forward_order_and_place_on_reload():
    order = LayerOrder()
    layers = [torch.nn.Module() for _ in range(3)]
    assert [order.add(m) for m in layers] == [0, 1, 2]
    assert order.add(layers[1]) == 1  # processed again (a weight reload): same place
    assert [order.index(m) for m in layers] == [0, 1, 2]
    assert order.after(0) is layers[1] and order.after(1) is layers[2] and order.after(2) is None
    with pytest.raises(RuntimeError, match="not processed"):
        order.index(torch.nn.Module())
    order.clear()
    with pytest.raises(RuntimeError, match="not processed"):
        order.index(layers[0])
    assert order.add(layers[2]) == 0


def test_a_layer_of_another_order_is_registered_anew():
    first, second = LayerOrder(), LayerOrder()
    m = torch.nn.Module()
    first.add(torch.nn.Module())
    assert first.add(m) == 1
    assert second.add(m) == 0  # its recorded index does not point at it in this order
    assert second.after(0) is None


def test_the_prefetch_switch_is_off_by_default_and_strict(monkeypatch):
    monkeypatch.delenv(PREFETCH_SWITCH, raising=False)
    assert not prefetch_enabled()
    monkeypatch.setenv(PREFETCH_SWITCH, "1")
    assert prefetch_enabled()
    monkeypatch.setenv(PREFETCH_SWITCH, "0")
    assert not prefetch_enabled()
    monkeypatch.setenv(PREFETCH_SWITCH, "sometimes")
    with pytest.raises(ValueError, match=PREFETCH_SWITCH):
        prefetch_enabled()
