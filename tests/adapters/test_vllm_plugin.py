"""Registration through vLLM's own plugin machinery: the entry point, repeated loads, the VLLM_PLUGINS allow-list."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from csf_serving_adapters.vllm import register, weight_iterators

# a fresh process per case: plugin registration is process-wide state
_PROBE = """
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


def test_the_entry_point_is_declared_and_loads_register():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert eps["csf"].value == "csf_serving_adapters.vllm:register"
    assert eps["csf"].load() is register


@pytest.mark.parametrize(("allow", "registered"), [(None, True), ("csf", True), ("other", False)])
def test_vllm_loads_the_plugin_once_and_honours_its_allow_list(allow, registered):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    if allow is not None:
        env["VLLM_PLUGINS"] = allow
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {"calls": ["csf"] * registered, "listed": int(registered), "iterators": registered}


def test_register_is_idempotent_in_process():
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    from csf_serving_adapters.vllm.config import CsfConfig

    for _ in range(3):
        register()
    assert QUANTIZATION_METHODS.count("csf") == 1
    assert get_quantization_config("csf") is CsfConfig
    assert weight_iterators.installed()
    import vllm.model_executor.model_loader.default_loader as dl

    wrapped = dl.safetensors_weights_iterator
    register()
    assert dl.safetensors_weights_iterator is wrapped  # a wrapper is not wrapped again
