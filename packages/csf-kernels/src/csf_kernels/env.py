"""The one reader of csf's environment switches, for the edges only: the engine adapters, the CLIs, benchmarks and
tests read them here and pass them down as configuration (the library below never reads the environment).
Read when asked, never at import.

| variable | meaning |
|---|---|
| ``CSF_FROZEN`` | truthy: the runtime starts frozen (serving): no program is ever lowered or compiled |
| ``CSF_AOT_CACHE`` | the ``aot_cache`` directory (default: the repository's ``aot_cache/``, else ``./aot_cache``) |
| ``CSF_SPARSE_MLA`` | truthy: the engines' sparse-MLA FP8 decode runs on csf (``csf_serving_adapters.sparse_mla``) |
| ``CSF_EXPANSION_PREFETCH`` | truthy: expand the next MoE layer's scales on a side stream (off by default) |
| ``CSF_PDL`` | falsy: programs built for programmatic dependent launch launch plainly (A/B timing, debugging) |
| ``CSF_L2_SCALES`` | truthy: MoE layers keep the scale planes they expand in L2 (``runtime.l2_residency``) |
| ``CSF_MOE_ENGINE`` | truthy: served MoE layers run on the engine's GEMMs (W4A16, inline engine records) |
| ``CSF_MOE_W4A8`` | truthy: served MoE layers run W4A8 on the engine (MXFP4; implies ``CSF_MOE_ENGINE``) |

``CSF_MOE_ENGINE`` and ``CSF_MOE_W4A8`` are read once per MoE layer, when the engine creates it
(``csf_serving_adapters.gemm_choice``); ``CSF_MOE_W4A8`` with ``CSF_MOE_ENGINE`` falsy, or on NVFP4 weights, is an
error.

Truthy means one of ``1, true, yes, on`` (any case); falsy ``0, false, no, off`` or empty; anything
else is an error, so a typo never silently flips a switch.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["AOT_CACHE", "FROZEN", "L2_SCALES", "MOE_ENGINE", "MOE_W4A8", "PDL", "configure_runtime", "flag", "path"]

FROZEN = "CSF_FROZEN"
AOT_CACHE = "CSF_AOT_CACHE"
PDL = "CSF_PDL"
L2_SCALES = "CSF_L2_SCALES"
MOE_ENGINE = "CSF_MOE_ENGINE"
MOE_W4A8 = "CSF_MOE_W4A8"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={raw!r} is neither true ({sorted(_TRUE)}) nor false")


def path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser() if raw else default


def configure_runtime() -> None:
    """Apply ``CSF_FROZEN``, ``CSF_AOT_CACHE`` and ``CSF_PDL`` to the runtime's settings (set only where given)."""
    from csf_kernels.runtime import config

    if flag(FROZEN):
        config.freeze()
    if os.environ.get(AOT_CACHE):
        config.set_cache_root(path(AOT_CACHE, config.cache_root()))
    if os.environ.get(PDL) is not None:
        config.set_pdl(flag(PDL, default=True))
