"""Load a script of this repository that is not part of a package (benchmarks/, scripts/) as a module, for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, name: str):
    """The module at ``ROOT / relative_path``, registered as ``name`` (its dataclasses resolve annotations by it)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
