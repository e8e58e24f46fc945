"""The geometry catalog (``catalog.yaml``): the model geometries csf serves, per TP or EP rank and format."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from csf_codec import ScaleFormat, scale_format

__all__ = ["Catalog", "MoEGeometry", "load_catalog"]

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


@dataclass(frozen=True, kw_only=True)
class MoEGeometry:
    """One MoE layer as one rank holds it: ``intermediate / tp`` of every expert's width, for ``experts``
    local experts (the model's ``experts * ep`` split over ``ep`` expert-parallel ranks)."""

    model: str
    tp: int
    fmt: ScaleFormat
    experts: int  # this rank's (local) experts
    hidden: int
    intermediate: int  # per rank
    top_k: int
    activation: str = "silu"  # "silu" (SiLU-and-mul) or "swiglu_oai" (gpt-oss's clamped SwiGLU)
    bias: bool = False  # W13 and W2 carry per-expert biases (gpt-oss)
    ep: int = 1  # expert-parallel ranks the model's experts are split over

    def __post_init__(self) -> None:
        if self.tp < 1 or self.ep < 1:
            raise ValueError(f"{self.model}: tp={self.tp} and ep={self.ep} must be positive")

    @property
    def name(self) -> str:
        ep = f"/ep{self.ep}" if self.ep > 1 else ""
        return f"{self.model}/tp{self.tp}{ep}/{self.fmt.name}"

    @property
    def global_experts(self) -> int:
        """The model's routed experts (route ids range over these; this rank computes ``experts`` of them)."""
        return self.experts * self.ep

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

    def moe_geometry(self, model: str, tp: int, fmt: str, ep: int = 1) -> MoEGeometry:
        for g in self.moe:
            if (g.model, g.tp, g.ep, g.fmt.name) == (model, tp, ep, fmt):
                return g
        raise KeyError(f"{model} tp{tp} ep{ep} {fmt} is not in the geometry catalog {CATALOG_PATH}")


def _moe_entries(raw: list[dict]) -> tuple[MoEGeometry, ...]:
    """Each model at each of its ``tp`` sizes (every expert, 1/tp of the width) and ``ep`` sizes (1/ep of the
    experts at full width, as both engines split them under expert parallelism)."""
    out = []
    for m in raw:
        ranks = [(tp, 1) for tp in m["tp"]] + [(1, ep) for ep in m.get("ep", ())]
        for tp, ep in ranks:
            if m["intermediate"] % tp:
                raise ValueError(f"{m['name']}: intermediate {m['intermediate']} does not split over tp {tp}")
            if m["experts"] % ep:
                raise ValueError(f"{m['name']}: {m['experts']} experts do not split over ep {ep}")
            for f in m["formats"]:
                out.append(
                    MoEGeometry(
                        model=m["name"],
                        tp=tp,
                        ep=ep,
                        fmt=scale_format(f),
                        experts=m["experts"] // ep,
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
