"""The inline-expansion Triton kernel, run by Triton's CPU interpreter, reproduces the native planes.

The GPU test runs the same cases from the AOT cache on the H200 (test_expand_gpu.py).
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


def test_interpreted_expansion_matches_the_planes():
    seed = random.randrange(1 << 20)  # fresh data every run; the seed is in the failure message
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    r = subprocess.run(
        [sys.executable, "-m", "tests.kernels.interpret_expand", str(seed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"seed {seed}: {r.stdout[-2000:]}{r.stderr[-4000:]}"
    assert r.stdout.strip().startswith("ok 6"), r.stdout
