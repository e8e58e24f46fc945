"""Human-readable sizes for the CLI and the demo."""

from __future__ import annotations

__all__ = ["human_bytes"]


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``; whole bytes below 1 KiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
