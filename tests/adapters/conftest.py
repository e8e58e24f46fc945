"""The ``engine`` fixture: a test that takes it runs once per serving engine (skipped where not installed)."""

from __future__ import annotations

import pytest

from .engines import ENGINES, Engine, engine_named


@pytest.fixture(scope="module", params=ENGINES)
def engine(request) -> Engine:
    return engine_named(request.param)
