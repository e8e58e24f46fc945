"""Provenance for every benchmark JSON: command, commit, machine, toolchain."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone

import torch

from csf_kernels.runtime import l2_residency


def _git(*args: str) -> str:
    try:
        return subprocess.check_output(["git", *args], text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance() -> dict:
    info = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "commit": os.environ.get("CSF_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": _git("status", "--porcelain", "--untracked-files=no") not in ("", "unknown"),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        # csf's switches (csf_kernels.env), e.g. CSF_PDL=0 for a run without programmatic dependent launches
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("CSF_") and k != "CSF_COMMIT"},
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": p.name, "sms": p.multi_processor_count, "cuda": torch.version.cuda}
        info["gpu"]["l2"] = dataclasses.asdict(l2_residency.limits(torch.cuda.current_device()))
        q = "clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True)
        info["gpu"]["clocks"] = smi.stdout.strip() if smi.returncode == 0 else "nvidia-smi unavailable"
    return info
