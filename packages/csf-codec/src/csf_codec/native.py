"""The codec's C loops (``csf_codec._native``, built from ``native_*.c`` when the package is installed).

The CPU decoders run there; the numpy modules stay the reference the tests compare against. There is no
silent fallback: a missing extension is an ImportError that says how to build it.
"""

from __future__ import annotations

import functools

__all__ = ["native"]

BUILD_HINT = (
    "csf_codec._native, the codec's C extension, is not built: install the package with a C compiler "
    "(`pip install packages/csf-codec`, or `pip install -e packages/csf-codec`), or build it in place with "
    "`python setup.py build_ext --inplace` in packages/csf-codec (what PYTHONPATH=packages/*/src needs)"
)


@functools.cache
def native():
    """The extension module; ImportError naming how to build it when it is missing."""
    try:
        from . import _native
    except ImportError as e:
        raise ImportError(BUILD_HINT) from e
    return _native
