#!/usr/bin/env bash
# Put FlashMLA 9241ae3's SM90 sparse FP8 decode under .peers/flashmla/ (git-ignored, never committed), for `carry`
# to the device, which has no network; scripts/build_flashmla.sh builds it there for bench_mla's `flashmla` arm.
#
#   FLASHMLA_GIT=DIR CUTLASS_GIT=DIR bash scripts/stage_flashmla.sh
#
# FLASHMLA_GIT and CUTLASS_GIT are git directories (bare or checkouts) holding deepseek-ai/FlashMLA and NVIDIA/cutlass
# (default: the mirrors of the workplace's `fetch` tool). The CUTLASS commit is the one FlashMLA's csrc/cutlass
# submodule names at the pinned commit. Staged: the sources scripts/flashmla/flags.sh lists, FlashMLA's Python
# wrapper, its tests/quant.py and licence, and of both trees only the headers those sources include (found by
# preprocessing them with nvcc -M, device and host passes, as the build compiles them), with MANIFEST.json recording
# the commits and a digest of the files. Idempotent: an intact tree of the same commits is left as it is. Refuses
# any other FlashMLA commit (FLASHMLA_REF, if set, must name the pinned one).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/flashmla/flags.sh
flashmla_git=${FLASHMLA_GIT:-/work/.mirror/deepseek-ai+FlashMLA/repo}
cutlass_git=${CUTLASS_GIT:-/work/.mirror/NVIDIA+cutlass/repo}
python=${PYTHON:-$( [ -x /work/venv/bin/python ] && echo /work/venv/bin/python || echo python3)}
dest=.peers/flashmla

die() { echo "stage_flashmla: $*" >&2; exit 2; }
wanted=${FLASHMLA_REF:-$FLASHMLA_COMMIT}
fm_commit=$(git -C "$flashmla_git" rev-parse --verify --quiet "$wanted^{commit}") ||
    die "$flashmla_git has no commit $wanted (fetch github:deepseek-ai/FlashMLA, or set FLASHMLA_GIT)"
[ "$fm_commit" = "$FLASHMLA_COMMIT" ] || die "FLASHMLA_REF=$wanted is $fm_commit: only the pinned $FLASHMLA_COMMIT is staged"
cl_commit=$(git -C "$flashmla_git" ls-tree "$FLASHMLA_COMMIT" csrc/cutlass | awk '$2 == "commit" {print $3}')
[ -n "$cl_commit" ] || die "FlashMLA $FLASHMLA_COMMIT names no csrc/cutlass submodule commit"
git -C "$cutlass_git" rev-parse --verify --quiet "$cl_commit^{commit}" >/dev/null ||
    die "$cutlass_git has no commit $cl_commit (FlashMLA's submodule pointer; fetch github:NVIDIA/cutlass)"

command -v nvcc >/dev/null || die "nvcc is needed to find the headers the sources include"

manifest() { "$python" scripts/flashmla/manifest.py "$@"; }
if manifest check "$dest" "$FLASHMLA_COMMIT" 2>/dev/null &&
    grep -q "\"cutlass_commit\": \"$cl_commit\"" "$dest/MANIFEST.json"; then
    echo "stage_flashmla: $dest already holds FlashMLA $FLASHMLA_COMMIT + CUTLASS $cl_commit, intact"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/fm" "$work/cl" "$work/stage/flashmla" "$work/stage/cutlass"
git -C "$flashmla_git" archive "$FLASHMLA_COMMIT" csrc flash_mla tests/quant.py LICENSE | tar x -C "$work/fm"
# the cutlass mirror lacks some large media blobs, which git archive names even though they lie outside these paths
git -C "$cutlass_git" archive "$cl_commit" include tools/util/include LICENSE.txt 2> >(grep -v "for 'media/" >&2) |
    tar x -C "$work/cl"
want=$(git -C "$cutlass_git" ls-tree -r --name-only "$cl_commit" include tools/util/include LICENSE.txt | wc -l)
[ "$(find "$work/cl" -type f | wc -l)" -eq "$want" ] || die "CUTLASS $cl_commit: the archive lacks files"

# every file of the two trees that the build's preprocessing opens: nvcc -M covers the device and host passes of
# the CUDA sources; the binding is host C++ (-MG: CUDA libraries' headers missing here are not FlashMLA's)
mapfile -t includes < <(flashmla_includes "$work/fm" "$work/cl")
mapfile -t torch_flags < <(flashmla_torch_flags "$python")
mapfile -t fallback < <(flashmla_cxx_fallback_includes "$python")
: >"$work/deps"
for src in "${FLASHMLA_SOURCES[@]/#/$work/fm/}"; do
    nvcc -M "${FLASHMLA_NVCC_FLAGS[@]}" "${includes[@]}" "${torch_flags[@]}" "$src" >>"$work/deps" ||
        die "preprocessing $src failed"
done
"${CXX:-g++}" -M -MG "${FLASHMLA_CXX_FLAGS[@]}" "${includes[@]}" "${torch_flags[@]}" -I"$(flashmla_cuda_home)/include" \
    "${fallback[@]}" "$FLASHMLA_SHIM" >>"$work/deps" || die "preprocessing $FLASHMLA_SHIM failed"
tr ' \\' '\n\n' <"$work/deps" | grep -E "^$work/(fm|cl)/" | sort -u >"$work/files"
{
    printf '%s\n' "${FLASHMLA_SOURCES[@]/#/$work/fm/}" "${FLASHMLA_PYTHON[@]/#/$work/fm/}" "${FLASHMLA_EXTRA[@]/#/$work/fm/}"
    echo "$work/cl/LICENSE.txt"
} >>"$work/files"
sort -u "$work/files" | while read -r f; do
    case $f in
    "$work/fm/"*) rel=flashmla/${f#"$work/fm/"} ;;
    *) rel=cutlass/${f#"$work/cl/"} ;;
    esac
    mkdir -p "$work/stage/$(dirname "$rel")"
    cp "$f" "$work/stage/$rel"
done

rm -rf "$dest" && mkdir -p "$(dirname "$dest")"
mv "$work/stage" "$dest"
manifest write "$dest" "$FLASHMLA_COMMIT" "$cl_commit" >/dev/null
echo "stage_flashmla: $dest = FlashMLA $FLASHMLA_COMMIT + CUTLASS $cl_commit:" \
    "$(find "$dest/flashmla" -type f | wc -l) FlashMLA files, $(find "$dest/cutlass" -type f | wc -l) CUTLASS files," \
    "$(du -sh --apparent-size "$dest" | cut -f1)"
