"""Registration through each engine's own plugin machinery: the entry point, repeated loads, the allow-list."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

from .engines import only, run_probe

# each probe runs in a fresh process: plugin registration is process-wide state
_VLLM_PROBE = """
import json
import vllm.plugins as plugins
from vllm.model_executor.layers import quantization as q
from csf_serving_adapters.vllm import weight_iterators
calls, original = [], q.register_quantization_config
def spy(name):
    calls.append(name)
    return original(name)
q.register_quantization_config = spy
plugins.load_general_plugins()
plugins.plugins_loaded = False  # load again, as vLLM does in each process it starts
plugins.load_general_plugins()
print(json.dumps({"calls": calls, "listed": q.QUANTIZATION_METHODS.count("csf"),
                  "iterators": weight_iterators.installed()}))
"""

_SGLANG_PROBE = """
import json
import sglang.srt.plugins as plugins
from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
from sglang.srt.layers.quantization import QUANTIZATION_METHODS
import csf_serving_adapters.sglang as csf_plugin
from csf_serving_adapters.sglang import weight_iterators
calls, original = [], csf_plugin.register
def spy():
    calls.append("csf")
    return original()
csf_plugin.register = spy  # the entry point resolves the attribute when SGLang loads it
plugins.load_plugins()
plugins.load_plugins()  # SGLang's own guard: a second call in one process does nothing
plugins._plugins_loaded = False  # as a fresh scheduler process would: load again
plugins.load_plugins()
print(json.dumps({"calls": len(calls), "first": next(iter(QUANTIZATION_METHODS)),
                  "listed": list(QUANTIZATION_METHODS).count("csf"), "choices": QUANTIZATION_CHOICES.count("csf"),
                  "iterators": weight_iterators.installed()}))
"""

ALLOW_LISTS = [(None, True), ("csf", True), ("other", False)]


def _env(variable: str, allow: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != variable}
    if allow is not None:
        env[variable] = allow
    return env


def test_the_entry_point_is_declared_and_loads_register(engine):
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=engine.entry_point_group)}
    assert eps["csf"].value == f"csf_serving_adapters.{engine.name}:register"
    assert eps["csf"].load() is engine.register


@only("vllm")
@pytest.mark.parametrize(("allow", "registered"), ALLOW_LISTS)
def test_vllm_loads_the_plugin_once_and_honours_its_allow_list(engine, allow, registered):
    got = run_probe(_VLLM_PROBE, _env("VLLM_PLUGINS", allow))
    assert got == {"calls": ["csf"] * registered, "listed": int(registered), "iterators": registered}


@only("sglang")
@pytest.mark.parametrize(("allow", "registered"), ALLOW_LISTS)
def test_sglang_loads_the_plugin_and_honours_its_allow_list(engine, allow, registered):
    got = run_probe(_SGLANG_PROBE, _env("SGLANG_PLUGINS", allow), timeout=600)
    want = {"calls": 2 * registered, "first": "csf" if registered else got["first"], "listed": int(registered),
            "choices": int(registered), "iterators": registered}  # fmt: skip
    assert got == want
    assert registered or got["first"] != "csf"


def test_register_is_idempotent_in_process(engine):
    for _ in range(3):
        engine.register()
    assert list(engine.quantization_methods).count("csf") == 1
    assert engine.registered_config() is engine.config
    assert engine.weight_iterators.installed()
    wrapped = engine.loader.safetensors_weights_iterator
    engine.register()
    assert engine.loader.safetensors_weights_iterator is wrapped  # a wrapper is not wrapped again


@only("sglang")
def test_sglang_register_puts_csf_first_and_keeps_every_other_method(engine):
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.layers.quantization import get_quantization_config
    from sglang.srt.utils import cpu_has_amx_support, is_cpu

    engine.register()
    before = len(engine.quantization_methods)
    for _ in range(3):
        engine.register()
    assert next(iter(engine.quantization_methods)) == "csf"
    assert len(engine.quantization_methods) == before  # nothing else was lost or duplicated by the reordering
    assert QUANTIZATION_CHOICES.count("csf") == 1
    if not (is_cpu() and cpu_has_amx_support()):  # SGLang serves only its CPU list on an AMX CPU
        assert get_quantization_config("csf") is engine.config
