"""Run code in a fresh process: an interpreter entry point (``python -m tests.<module> SEED``), as the CPU
tests of the GPU programs do (Triton's interpreter is switched on by an environment variable read at
import), or a script that JIT-compiles variants outside the AOT cache (the frozen tests' zero-compilation
check in the calling process stays whole)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(module: str, expect: str, timeout: int = 900) -> None:
    """Fresh random data every run (the seed is in any failure message); the entry point prints
    ``ok <cases>``, which must start with ``expect``."""
    seed = random.randrange(1 << 20)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    r = subprocess.run([sys.executable, "-m", module, str(seed)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)  # fmt: skip
    assert r.returncode == 0, f"seed {seed}: {r.stdout[-2000:]}{r.stderr[-4000:]}"
    assert r.stdout.strip().startswith(expect), f"seed {seed}: {r.stdout}"


def run_script(script: str, seed: int, timeout: int = 900) -> None:
    """``python -c script seed``; the script prints ``ok`` last."""
    done = subprocess.run([sys.executable, "-c", script, str(seed)], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"seed {seed}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
