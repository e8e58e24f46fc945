#!/usr/bin/env bash
# The GPU test suite, as run on the H200 (no nox, no installs there): every package's src on
# PYTHONPATH, the whole test suite (GPU tests included, on that machine's torch), a summary for
# validation/. Usage (from the repo root): bash scripts/gpu_suite.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${OUT:-out}
mkdir -p "$out_dir"
PYTHONPATH=$(printf '%s:' "$PWD"/packages/*/src)${PYTHONPATH:-}
export PYTHONPATH PYTHONUNBUFFERED=1
python3 -m pytest tests -q -p no:cacheprovider --junitxml "$out_dir/gpu-suite-junit.xml" "$@" 2>&1 | tee "$out_dir/gpu-suite.log"
rc=${PIPESTATUS[0]}
python3 scripts/validation_summary.py --junit "$out_dir/gpu-suite-junit.xml" --rc "$rc" \
    --command "bash scripts/gpu_suite.sh $*" --out "$out_dir/gpu-suite-summary.json"
exit "$rc"
