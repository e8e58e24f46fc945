#!/usr/bin/env bash
# Build the codec's C extension (csf_codec._native) in place for another Python than this one: the GPU machine has
# no C compiler, so a call that encodes or decodes CSF there carries the module built here for its Python (3.12:
# `scripts/build_codec_native.sh /root/.pyenv/versions/3.12.1/bin/python3`, then carry the path it prints).
# This machine's own Python builds it with `(cd packages/csf-codec && python setup.py build_ext --inplace)`.
set -euo pipefail
py=${1:?usage: build_codec_native.sh PYTHON (an interpreter of the target version, with its headers)}
src=$(cd "$(dirname "$0")/../packages/csf-codec/src/csf_codec" && pwd)
include=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
out="$src/_native$suffix"
# the sources of packages/csf-codec/setup.py's SOURCES
sources=(native_module.c native_compact.c native_compact_encode.c native_compact_span.c native_inline.c native_inline_encode.c native_rowbase.c native_engine_decode.c native_engine_encode.c)
cc -O3 -std=c99 -Wall -Wno-unused-function -shared -fPIC -I"$include" "${sources[@]/#/$src/}" -o "$out"
echo "${out#"$(cd "$src/../../../.." && pwd)/"}"
