"""Summarise a test run (junit XML) with its provenance: command, commit, GPU, torch, outcome."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

SLOWEST = 25


def _git(*args: str) -> str:
    try:
        return subprocess.check_output(["git", *args], text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _gpu() -> dict:
    try:
        import torch

        info = {"torch": torch.__version__, "cuda": torch.version.cuda}
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(name=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
        q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True
        )
        if smi.returncode == 0:
            info["nvidia_smi"] = smi.stdout.strip()
        return info
    except Exception as e:  # a summary must still be written when the GPU stack is broken
        return {"error": repr(e)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", required=True)
    ap.add_argument("--rc", type=int, required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, skipped_gpu, times = [], 0, []
    path = Path(a.junit)
    if path.exists():
        for suite in ET.parse(path).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
        for case in ET.parse(path).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
            times.append((float(case.get("time") or 0.0), f"{case.get('classname')}::{case.get('name')}"))
            sk = case.find("skipped")
            if sk is not None and "CUDA" in (sk.get("message") or ""):
                skipped_gpu += 1
    summary = {
        "command": a.command,
        # the device machine gets a copy of the tree without .git: the caller passes the commit
        "commit": os.environ.get("CSF_COMMIT") or _git("rev-parse", "HEAD"),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "gpu": _gpu(),
        "exit_code": a.rc,
        "outcome": "passed" if a.rc == 0 else "failed",
        "counts": {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]},
        "gpu_tests_skipped_for_lack_of_cuda": skipped_gpu,
        "failed": failed,
        "seconds": round(sum(t for t, _ in times), 1),
        # where a device call's time goes: the next run's timeout and what to make faster
        "slowest": [{"seconds": round(t, 2), "test": name} for t, name in sorted(times, reverse=True)[:SLOWEST]],
    }
    Path(a.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("outcome", "counts", "commit")}))


if __name__ == "__main__":
    main()
