"""The GEMM switches (``CSF_MOE_ENGINE``, ``CSF_MOE_W4A8``; csf_serving_adapters.gemm_choice) and the ledger's forms,
without a serving engine (``test_engine_gemm_switch.py`` holds them in each engine's layers)."""

from __future__ import annotations

import pytest

from csf_serving_adapters.accounting import FORMS, LayerScaleMemory, ScaleMemoryLedger
from csf_serving_adapters.gemm_choice import ENGINE, TRITON, W4A8, gemm_choice


@pytest.mark.parametrize(
    "values, fmt, want",
    [
        ({}, "mxfp4", TRITON),
        ({"MOE_ENGINE": "0"}, "mxfp4", TRITON),
        ({"MOE_ENGINE": "1"}, "mxfp4", ENGINE),
        ({"MOE_ENGINE": "on"}, "nvfp4", ENGINE),
        ({"MOE_W4A8": "true"}, "mxfp4", W4A8),  # W4A8 implies the engine
        ({"MOE_W4A8": "1", "MOE_ENGINE": "yes"}, "mxfp4", W4A8),
        ({"MOE_W4A8": "off", "MOE_ENGINE": "1"}, "mxfp4", ENGINE),
    ],
)
def test_the_switches_pick_the_gemm(switches, values, fmt, want):
    switches(**values)
    assert gemm_choice(fmt) == want


@pytest.mark.parametrize(
    "values, fmt, error",
    [
        ({"MOE_W4A8": "1", "MOE_ENGINE": "0"}, "mxfp4", "CSF_MOE_ENGINE is set falsy"),
        ({"MOE_W4A8": "1"}, "nvfp4", "stays W4A16"),
        ({"MOE_ENGINE": "engine"}, "mxfp4", "CSF_MOE_ENGINE='engine' is neither true"),
        ({"MOE_W4A8": "2"}, "mxfp4", "CSF_MOE_W4A8='2' is neither true"),
    ],
)
def test_contradictions_and_typos_are_refused(switches, values, fmt, error):
    switches(**values)
    with pytest.raises(ValueError, match=error):
        gemm_choice(fmt)


def test_the_ledger_records_each_layers_form():
    assert set(FORMS) >= {"triton-inline", "engine-inline", "engine-w4a8-native"}
    with pytest.raises(ValueError, match="form 'cuda'"):
        LayerScaleMemory(layer="x", native_bytes=1, stored_bytes=1, form="cuda")
    w4a8 = LayerScaleMemory(layer="x", native_bytes=100, stored_bytes=103, form="engine-w4a8-native")
    assert w4a8.returned_bytes == -3  # panels, bases and fold flags: more than the native planes

    ledger = ScaleMemoryLedger()
    ledger.record(LayerScaleMemory(layer="a", native_bytes=100, stored_bytes=30, form="engine-inline"))
    ledger.record(w4a8)
    report = ledger.report()
    assert [r["form"] for r in report["layers"]] == ["engine-inline", "engine-w4a8-native"]
    assert report["total"] == {"layer": "total", "form": "engine-inline+engine-w4a8-native", "native": 200,
                               "stored": 133, "returned": 67}  # fmt: skip
