#!/usr/bin/env bash
# Put OpenAI's triton_kernels (the peer of bench_moe's `triton_kernels` arm) under .peers/ (git-ignored, never
# committed), for `carry` to the H200, which has no network:
#
#   bash scripts/stage_triton_kernels.sh                     # vLLM 0.33.0's own copy (vllm/third_party/triton_kernels)
#   TRITON_SRC=/path/to/triton bash scripts/stage_triton_kernels.sh   # a triton checkout's python/triton_kernels
#
# then on the device: PYTHONPATH=...:$PWD/.peers python3 benchmarks/bench_moe.py --arms ...,triton_kernels
# .peers/SOURCE says where the copy came from; bench_moe records it with the copy's tree hash.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.peers
rm -rf "$dest/triton_kernels" && mkdir -p "$dest"
if [[ -n "${TRITON_SRC:-}" ]]; then
    cp -r "$TRITON_SRC/python/triton_kernels/triton_kernels" "$dest/triton_kernels"
    echo "triton checkout $(git -C "$TRITON_SRC" describe --tags --always 2>/dev/null || echo "$TRITON_SRC"): python/triton_kernels" >"$dest/SOURCE"
else
    version=${VLLM_VERSION:-0.33.0}
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download --quiet --no-deps "vllm==$version" -d "$work"
    wheel=$(ls "$work"/vllm-"$version"-*.whl)
    python3 - "$wheel" "$work/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("vllm/third_party/triton_kernels/")])
PY
    cp -r "$work/x/vllm/third_party/triton_kernels" "$dest/triton_kernels"
    echo "vllm $version wheel ($(basename "$wheel"), sha256 $(sha256sum "$wheel" | cut -c1-16)): vllm/third_party/triton_kernels" >"$dest/SOURCE"
fi
find "$dest/triton_kernels" -name __pycache__ -prune -exec rm -rf {} +
echo "staged $(find "$dest/triton_kernels" -name '*.py' | wc -l) files: $(cat "$dest/SOURCE")"
