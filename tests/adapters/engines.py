"""What differs between the serving engines, for adapter tests written once and run against each.

Every engine has an :class:`Engine` (built in ``<name>_engine.py``, which imports the engine); the ``engine``
fixture (conftest.py) gives a test each installed engine in turn, with the engine's name as the case's id, so
``pytest -k sglang`` selects every SGLang case. A test about one engine only takes ``@only("<name>")``.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

__all__ = ["ENGINES", "Engine", "engine_named", "only", "run_probe"]

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Engine:
    name: str  # the engine's import name and its cases' id
    adapter: ModuleType  # csf_serving_adapters.<name>: its ``register`` is the plugin's entry point
    config: type  # the adapter's CsfConfig
    moe_method: type  # the adapter's CsfMoEMethod
    bound_attr: str  # where process_weights_after_loading leaves the bound csf-moe layer
    weight_iterators: ModuleType  # the adapter's CSF-aware safetensors iterators
    loader: ModuleType  # where the engine's model loader looks its safetensors iterators up
    weight_utils: ModuleType  # where the engine defines them
    iterator_args: tuple  # what the loader passes an iterator after the file list
    quantization_methods: Collection[str]  # the engine's registry of method names (register changes it in place)
    registered_config: Callable[[], type]  # the class the engine serves "csf" with
    resolve: Callable[..., str | None]  # the engine's checkpoint-method resolution: (quant_config, user_quant)
    make_experts: Callable[..., torch.nn.Module]  # a real MoE layer on the CPU (see ``<name>_engine.py``)
    load_expert_tensors: Callable[..., set[str]]  # (layer, checkpoint pairs, experts) -> parameters written
    make_linear: Callable[[], torch.nn.Module]  # a linear layer of the engine
    unquantized_linear: type  # the engine's method for unquantized linear layers
    scale_quant_method: str  # the scales' ``quant_method`` attribute in the engine's own FP4 MoE methods
    weight_prefix: str  # the weight name a model's load_weights passes the weight_loader, before the parameter
    apply: Callable[..., torch.Tensor]  # (layer, x, topk weights, topk ids) through the engine's apply signature
    entry_point_group: str  # the entry-point group the engine loads plugins from

    @property
    def register(self) -> Callable[[], None]:
        return self.adapter.register


def engine_named(name: str) -> Engine:
    """The engine's facts; skips the test where the engine is not installed."""
    pytest.importorskip(name)
    return importlib.import_module(f"{__package__}.{name}_engine").ENGINE


def only(name: str):
    """Marks a test about one engine's behaviour: it runs against that engine alone."""
    assert name in ENGINES, name
    return pytest.mark.parametrize("engine", [name], indirect=True)


def run_probe(script: str, env: dict[str, str], timeout: int = 300) -> dict:
    """``script`` in a fresh Python (registration is process-wide state); the JSON its last line prints."""
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
