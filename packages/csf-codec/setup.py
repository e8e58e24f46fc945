"""The codec's C extension (csf_codec._native, one module from several C files); everything else is in
pyproject.toml."""

from setuptools import Extension, setup

# scripts/build_codec_native.sh compiles the same files with `cc`
SOURCES = [
    "native_module.c",
    "native_compact.c",
    "native_compact_encode.c",
    "native_compact_span.c",
    "native_inline.c",
    "native_inline_encode.c",
    "native_rowbase.c",
    "native_engine_decode.c",
    "native_engine_encode.c",
]

setup(
    ext_modules=[
        Extension(
            "csf_codec._native",
            [f"src/csf_codec/{f}" for f in SOURCES],
            depends=[
                "src/csf_codec/native_common.h",
                "src/csf_codec/native_engine.h",
                "src/csf_codec/native_rowbase.h",
            ],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-unused-function"],
        )
    ]
)
