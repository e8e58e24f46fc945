"""The runtime's settings, set once by whoever starts the process (an engine adapter, the CLI, a benchmark, a
test), never read from the environment mid-stack: ``csf_kernels.env.configure_runtime`` maps the ``CSF_*``
switches onto these setters, in the way DeepGEMM's ``set_num_sms`` works."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cache_root", "freeze", "is_frozen", "pdl_enabled", "set_cache_root", "set_pdl", "unfreeze"]

_settings: dict[str, object] = {"frozen": False, "pdl": True, "cache_root": None}


def freeze() -> None:
    """From now on, never lower or compile: every program must come from the AOT cache."""
    _settings["frozen"] = True


def unfreeze() -> None:
    """Development and tests only: allow JIT compilation again."""
    _settings["frozen"] = False


def is_frozen() -> bool:
    return bool(_settings["frozen"])


def set_pdl(enabled: bool) -> None:
    """Whether programs built for programmatic dependent launch launch so (True, the default) or plainly (A/B
    timing, debugging). Applies to launches bound from now on."""
    _settings["pdl"] = bool(enabled)


def pdl_enabled() -> bool:
    return bool(_settings["pdl"])


def set_cache_root(root: Path | str | None) -> None:
    """The ``aot_cache`` directory programs load from (None: the default, see :func:`cache_root`)."""
    _settings["cache_root"] = None if root is None else Path(root).expanduser()


def cache_root() -> Path:
    """The configured ``aot_cache`` directory, else the repository's ``aot_cache/`` in a source checkout, else
    ``./aot_cache``."""
    root = _settings["cache_root"]
    if root is not None:
        return root  # type: ignore[return-value]
    repo = Path(__file__).resolve().parents[5]  # packages/csf-kernels/src/csf_kernels/runtime/config.py
    return repo / "aot_cache" if (repo / "noxfile.py").exists() else Path.cwd() / "aot_cache"
