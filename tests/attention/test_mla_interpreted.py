"""Sparse MLA decode and merge programs in Triton's CPU interpreter, against the float32 reference.

The GPU tests run the same programs from the AOT cache on the H200 (test_mla_gpu.py).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_interpreted_decode_matches_the_reference_with_splits_sinks_packed_queries_and_a_late_maximum():
    seed = random.randrange(1 << 20)  # fresh data every run; the seed is in the failure message
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    r = subprocess.run(
        [sys.executable, "-m", "tests.attention.interpret_mla", str(seed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, f"seed {seed}: {r.stdout[-2000:]}{r.stderr[-4000:]}"
    assert r.stdout.strip().startswith("ok 15"), r.stdout
