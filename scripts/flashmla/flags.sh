# Sourced by scripts/stage_flashmla.sh and scripts/build_flashmla.sh: what the FlashMLA peer build compiles and
# with which flags, in one place, so that the headers staged are exactly the ones the build includes.
# The flags are FlashMLA's setup.py's for its SM90 programs (its -lineinfo and --source-in-ptx left out: they
# change no code).

FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
FLASHMLA_SOURCES=( # relative to the FlashMLA tree: the sparse FP8 decode (V32 records), its scheduler and combine
    csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
    csrc/smxx/decode/combine/combine.cu
    csrc/sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu
    csrc/sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu
)
FLASHMLA_SHIM=scripts/flashmla/sparse_decode_api.cpp # its Python binding (relative to the repository root), C++
# FlashMLA's own Python wrapper, whose `import flash_mla.cuda` the built module answers
FLASHMLA_PYTHON=(flash_mla/__init__.py flash_mla/flash_mla_interface.py)
FLASHMLA_EXTRA=(LICENSE tests/quant.py) # tests/quant.py: its FP8 record layout, read by the CPU tests

FLASHMLA_NVCC_FLAGS=(
    -O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -Wno-deprecated-declarations
    -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
    -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
    -gencode=arch=compute_90a,code=sm_90a
    --ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage
)

FLASHMLA_CXX_FLAGS=(-O3 -std=c++20 -DNDEBUG -Wno-deprecated-declarations) # the binding's, as setup.py's "cxx"

# flashmla_cuda_home: CUDA_HOME where set, else the toolkit the nvcc on PATH compiles with (its own TOP; nvcc on
# PATH may be a wrapper script outside the toolkit)
flashmla_cuda_home() {
    if [ -n "${CUDA_HOME:-}" ]; then
        echo "$CUDA_HOME"
    else
        readlink -f "$(nvcc -dryrun -x cu -E /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')"
    fi
}

# flashmla_includes FLASHMLA_TREE CUTLASS_TREE: FlashMLA's include directories (setup.py's), one per line
flashmla_includes() {
    printf -- '-I%s\n' "$1/csrc" "$1/csrc/kerutils/include" "$1/csrc/sm90" "$2/include" "$2/tools/util/include"
}

# flashmla_torch_flags PYTHON: the torch extension's include directories and defines, one per line, from that
# Python's torch (the device's at build time; any torch's headers do for finding the FlashMLA headers)
flashmla_torch_flags() {
    "$1" -W ignore - <<'PY'
import sysconfig

import torch
from torch.utils import cpp_extension as ext

flags = [f"-I{p}" for p in ext.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
flags += ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=cuda",
          f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
flags += getattr(ext, "_get_pybind11_abi_build_flags", list)()
print("\n".join(flags))
PY
}

# flashmla_cxx_fallback_includes PYTHON: the CUDA library headers torch's CUDA headers include (cuSPARSE, cuBLAS,
# cuSOLVER), from that Python's pip nvidia-* packages where it has them, searched after every other directory (for
# the binding, a host compile): a toolkit without those libraries' headers still builds it
flashmla_cxx_fallback_includes() {
    "$1" -W ignore - <<'PY'
import glob
import importlib.util

spec = importlib.util.find_spec("nvidia")
for root in spec.submodule_search_locations if spec else []:
    for inc in sorted(glob.glob(f"{root}/*/include")):
        print(f"-idirafter\n{inc}")
PY
}
