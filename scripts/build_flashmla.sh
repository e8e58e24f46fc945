#!/usr/bin/env bash
# On the device, inside the call that runs bench_mla: build FlashMLA's SM90 sparse FP8 decode (staged by
# scripts/stage_flashmla.sh, carried as .peers) for sm_90a with this machine's nvcc and python3's torch, into
# .peers/flashmla/build/flash_mla: FlashMLA's own Python package, whose `flash_mla.cuda` is the module built from
# scripts/flashmla/sparse_decode_api.cpp (its sparse_decode_fwd alone). Prints the build's time.
#
#   bash scripts/build_flashmla.sh [--objects]      # --objects: compile the objects only (no torch CUDA libraries)
#
# FLASHMLA_STAGED names the staged folder (default .peers/flashmla beside this script's tree); PYTHON the Python
# whose torch the module is for (default python3). A build of the same staged tree, sources, flags, nvcc and torch
# is reused. The five objects compile in parallel (the two 64- and 128-head programs take the longest).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/flashmla/flags.sh
staged=${FLASHMLA_STAGED:-.peers/flashmla}
python=${PYTHON:-python3}
objects_only=$([ "${1:-}" = --objects ] && echo 1 || echo 0)
build=$staged/build
t0=$(date +%s)

"$python" scripts/flashmla/manifest.py check "$staged" "$FLASHMLA_COMMIT" || exit 2
cuda=$(flashmla_cuda_home)
stamp=$({
    cat "$staged/MANIFEST.json" "$FLASHMLA_SHIM" scripts/flashmla/flags.sh "$0"
    nvcc --version
    "$python" -c 'import torch; print(torch.__version__)'
} | sha256sum | cut -c1-16)
if [ "$objects_only" = 0 ] && [ -f "$build/flash_mla/cuda.so" ] && [ "$(cat "$build/STAMP" 2>/dev/null)" = "$stamp" ]; then
    echo "build_flashmla: $build/flash_mla is up to date ($stamp)"
    exit 0
fi

rm -rf "$build" && mkdir -p "$build/obj" "$build/flash_mla"
mapfile -t includes < <(flashmla_includes "$staged/flashmla" "$staged/cutlass")
mapfile -t torch_flags < <(flashmla_torch_flags "$python")
mapfile -t fallback < <(flashmla_cxx_fallback_includes "$python")
pids=() objs=()
for src in "${FLASHMLA_SOURCES[@]}"; do
    obj=$build/obj/$(basename "$src" .cu).o
    nvcc -c "${FLASHMLA_NVCC_FLAGS[@]}" "${includes[@]}" "${torch_flags[@]}" -Xcompiler -fPIC \
        "$staged/flashmla/$src" -o "$obj" >"$obj.log" 2>&1 &
    pids+=($!) objs+=("$obj")
done
obj=$build/obj/sparse_decode_api.o
"${CXX:-g++}" -c "${FLASHMLA_CXX_FLAGS[@]}" "${includes[@]}" "${torch_flags[@]}" -I"$cuda/include" "${fallback[@]}" \
    -fPIC "$FLASHMLA_SHIM" -o "$obj" >"$obj.log" 2>&1 &
pids+=($!) objs+=("$obj")
failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        failed=1
        echo "build_flashmla: compiling ${objs[$i]} failed:" >&2
        tail -n 40 "${objs[$i]}.log" >&2
    fi
done
[ "$failed" = 0 ] || exit 1
# the decode programs' resources (registers, spills): the figure that says the build is FlashMLA's intended one
grep -h -E "Used [0-9]+ registers|spill stores" "$build"/obj/v32_persistent_h*.o.log | sed 's/^ */  ptxas: /' || true
if [ "$objects_only" = 1 ]; then
    echo "build_flashmla: ${#objs[@]} objects for sm_90a in $(($(date +%s) - t0)) s (not linked: --objects)"
    exit 0
fi

torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
cuda_lib=$cuda/lib64
[ -d "$cuda_lib" ] || cuda_lib=$cuda/targets/x86_64-linux/lib
"${CXX:-g++}" -shared "${objs[@]}" -L"$torch_lib" -Wl,-rpath,"$torch_lib" -L"$cuda_lib" \
    -lc10 -lc10_cuda -ltorch -ltorch_cpu -ltorch_cuda -ltorch_python -lcudart -o "$build/flash_mla/cuda.so"
cp "${FLASHMLA_PYTHON[@]/#/$staged/flashmla/}" "$build/flash_mla/"
PYTHONPATH=$build "$python" -c 'import flash_mla.cuda as c; assert hasattr(c, "sparse_decode_fwd")'
echo "$stamp" >"$build/STAMP"
echo "build_flashmla: $build/flash_mla (FlashMLA $FLASHMLA_COMMIT, sm_90a) built in $(($(date +%s) - t0)) s"
