"""The ``engine`` fixture: a test that takes it runs once per serving engine (skipped where not installed); and
``wrapped``: the engine's safetensors iterators CSF-aware for the test."""

from __future__ import annotations

import pytest

from .engines import ENGINES, Engine, engine_named


@pytest.fixture(scope="module", params=ENGINES)
def engine(request) -> Engine:
    return engine_named(request.param)


@pytest.fixture
def wrapped(engine):
    """The wrapper installed for the test, and the process left as it was found."""
    was = engine.weight_iterators.installed()
    engine.weight_iterators.install()
    yield
    if not was:
        engine.weight_iterators.uninstall()


@pytest.fixture
def switches(monkeypatch):
    """Set csf's MoE GEMM switches for a test (``switches(MOE_ENGINE="1")``), both unset first whatever the caller's
    environment holds."""
    from csf_kernels import env

    for name in (env.MOE_ENGINE, env.MOE_W4A8):
        monkeypatch.delenv(name, raising=False)

    def set_(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(getattr(env, name), value)

    return set_
