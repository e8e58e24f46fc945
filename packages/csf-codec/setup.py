"""The codec's C extension (csf_codec._native); everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "csf_codec._native",
            ["src/csf_codec/_native.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-unused-function"],
        )
    ]
)
