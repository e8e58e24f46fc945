"""The geometry catalog (``catalog.yaml``): the model geometries csf serves, per TP rank and format."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from csf_codec import ScaleFormat, scale_format

__all__ = ["Catalog", "MoEGeometry", "load_catalog"]

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


@dataclass(frozen=True, kw_only=True)
class MoEGeometry:
    """One MoE layer as one TP rank holds it."""

    model: str
    tp: int
    fmt: ScaleFormat
    experts: int
    hidden: int
    intermediate: int  # per rank
    top_k: int
    activation: str = "silu"  # "silu" (SiLU-and-mul) or "swiglu_oai" (gpt-oss's clamped SwiGLU)
    bias: bool = False  # W13 and W2 carry per-expert biases (gpt-oss)

    @property
    def name(self) -> str:
        return f"{self.model}/tp{self.tp}/{self.fmt.name}"

    @property
    def w13_scale_shape(self) -> tuple[int, int, int]:
        return (self.experts, 2 * self.intermediate, self.fmt.scale_columns(self.hidden))

    @property
    def w2_scale_shape(self) -> tuple[int, int, int]:
        return (self.experts, self.hidden, self.fmt.scale_columns(self.intermediate))

    @property
    def w13_row_group(self) -> int:
        """W13 is tiled as two row groups (gate, up), so each half has its own row tail."""
        return self.intermediate

    def scale_planes(self) -> dict[str, tuple[tuple[int, int, int], int | None]]:
        return {"w13": (self.w13_scale_shape, self.w13_row_group), "w2": (self.w2_scale_shape, None)}


@dataclass(frozen=True, kw_only=True)
class Catalog:
    moe: tuple[MoEGeometry, ...]
    sparse_mla: dict
    token_buckets: tuple[int, ...]

    def moe_geometry(self, model: str, tp: int, fmt: str) -> MoEGeometry:
        for g in self.moe:
            if (g.model, g.tp, g.fmt.name) == (model, tp, fmt):
                return g
        raise KeyError(f"{model} tp{tp} {fmt} is not in the geometry catalog {CATALOG_PATH}")


def _moe_entries(raw: list[dict]) -> tuple[MoEGeometry, ...]:
    out = []
    for m in raw:
        for tp in m["tp"]:
            if m["intermediate"] % tp:
                raise ValueError(f"{m['name']}: intermediate {m['intermediate']} does not split over tp {tp}")
            for f in m["formats"]:
                out.append(
                    MoEGeometry(
                        model=m["name"],
                        tp=tp,
                        fmt=scale_format(f),
                        experts=m["experts"],
                        hidden=m["hidden"],
                        intermediate=m["intermediate"] // tp,
                        top_k=m["top_k"],
                        activation=m.get("activation", "silu"),
                        bias=bool(m.get("bias", False)),
                    )
                )
    return tuple(out)


@lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    import yaml

    raw = yaml.safe_load(Path(path).read_text())
    return Catalog(
        moe=_moe_entries(raw["moe"]),
        sparse_mla=dict(raw.get("sparse_mla", {})),
        token_buckets=tuple(raw["token_buckets"]),
    )
