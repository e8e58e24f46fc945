#!/usr/bin/env bash
# An A/B tree for the GPU machine: a commit's packages, benchmarks, tests and scripts with the AOT cache built for
# its kernel sources, packed into .ab/<label>.tgz (gitignored) for scripts/ab_run.sh. Built here, with the tests
# venv (`nox -s tests --install-only`: it has nvidia-cutlass-dsl) into the aot_cache root, unless that root holds
# the tree's cache key already: a full build, 35-40 s here with the compilers' own caches warm (minutes cold).
#
#   bash scripts/ab_pack.sh <commit> <label>      # e.g. main base, HEAD new; keep the trees within 64 MiB in all
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: ab_pack.sh <commit> <label>}
label=${2:?usage: ab_pack.sh <commit> <label>}
python=${PYTHON:-$PWD/.nox/tests/bin/python}
root=${CSF_AOT_CACHE:-$PWD/aot_cache}
sha=$(git rev-parse --short=7 "$commit^{commit}")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
git archive "$sha" packages benchmarks tests scripts pyproject.toml ':(exclude)benchmarks/results' | tar x -C "$stage"
echo "$sha" > "$stage/AB_COMMIT"
srcpath=$(printf '%s:' "$stage"/packages/*/src)
# the toolchain module moved into csf_kernels.runtime (trees from before the move have it at the top)
key=$(PYTHONPATH=$srcpath "$python" -c "
try:
    from csf_kernels.runtime.toolchain import cache_key
except ImportError:
    from csf_kernels.toolchain import cache_key
print(cache_key())")
if [ ! -f "$root/$key/manifest.json" ]; then
    PYTHONPATH=$srcpath "$python" -m csf_kernels.aot.build --out "$root" --jobs "${JOBS:-2}" --no-progress
fi
mkdir -p "$stage/aot_cache" .ab
cp -r "$root/$key" "$stage/aot_cache/"
tar czf ".ab/$label.tgz" -C "$stage" .
echo "ab_pack: .ab/$label.tgz = $sha, cache $key ($(du -h ".ab/$label.tgz" | cut -f1))"
