"""Registration through SGLang's own plugin machinery: the entry point, repeated loads, the SGLANG_PLUGINS list."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang")

from csf_serving_adapters.sglang import register, weight_iterators

# a fresh process per case: plugin registration is process-wide state
_PROBE = """
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


def test_the_entry_point_is_declared_and_loads_register():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert eps["csf"].value == "csf_serving_adapters.sglang:register"
    assert eps["csf"].load() is register


@pytest.mark.parametrize(("allow", "registered"), [(None, True), ("csf", True), ("other", False)])
def test_sglang_loads_the_plugin_and_honours_its_allow_list(allow, registered):
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"}
    if allow is not None:
        env["SGLANG_PLUGINS"] = allow
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    want = {"calls": 2 * registered, "first": "csf" if registered else got["first"], "listed": int(registered),
            "choices": int(registered), "iterators": registered}  # fmt: skip
    assert got == want
    assert registered or got["first"] != "csf"


def test_register_is_idempotent_in_process():
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    from csf_serving_adapters.sglang.config import CsfConfig

    register()
    before = len(QUANTIZATION_METHODS)
    for _ in range(3):
        register()
    assert next(iter(QUANTIZATION_METHODS)) == "csf" and list(QUANTIZATION_METHODS).count("csf") == 1
    assert len(QUANTIZATION_METHODS) == before  # nothing else was lost or duplicated by the reordering
    assert QUANTIZATION_CHOICES.count("csf") == 1
    assert QUANTIZATION_METHODS["csf"] is CsfConfig
    from sglang.srt.utils import cpu_has_amx_support, is_cpu

    if not (is_cpu() and cpu_has_amx_support()):  # SGLang serves only its CPU list on an AMX CPU
        assert get_quantization_config("csf") is CsfConfig
    assert weight_iterators.installed()
    import sglang.srt.model_loader.loader as loader

    wrapped = loader.safetensors_weights_iterator
    register()
    assert loader.safetensors_weights_iterator is wrapped  # a wrapper is not wrapped again
