"""Shared test configuration: GPU tests are marked ``gpu`` and skipped without CUDA."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the GPU suite on the H200: see README)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def frozen_runtime():
    """Serving conditions for a GPU test: programs only from the AOT cache, nothing compiles (checked)."""
    from csf_kernels import runtime

    runtime.freeze()
    before = runtime.compilations()
    yield
    assert runtime.compilations() == before == 0
    runtime.unfreeze()
