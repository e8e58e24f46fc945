"""How much scale memory the served layers gave back: native planes released, what each layer keeps in its form."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["FORMS", "LEDGER", "LayerScaleMemory", "ScaleMemoryLedger"]


# what a served layer keeps of its scales, by the GEMM that reads them (csf_serving_adapters.gemm_choice)
FORMS = (
    "triton-inline",  # csf's Triton layer: inline CSF tile records (csf_moe.prepare_weights)
    "triton-native",  # csf's Triton layer on the native planes (not what the adapters serve)
    "engine-inline",  # the engine's FP4 GEMM: inline engine records its producer warp decodes
    "engine-native",  # the engine's FP4 GEMM: scale panels, every native byte (not what the adapters serve)
    "engine-w4a8-native",  # the W4A8 GEMM: scale panels (it has no inline source) plus row bases and fold flags
)


@dataclass(frozen=True, kw_only=True)
class LayerScaleMemory:
    layer: str
    native_bytes: int  # the layer's scale planes as the checkpoint's native form holds them
    stored_bytes: int  # what the layer keeps (records, or panels: see ``form``); above native_bytes gives nothing back
    form: str  # one of FORMS, or "+"-joined forms for a total

    def __post_init__(self) -> None:
        if not all(f in FORMS for f in self.form.split("+")):
            raise ValueError(f"scale memory form {self.form!r}: expected one of {FORMS}")

    @property
    def returned_bytes(self) -> int:
        """Scale bytes given back: negative where the layer keeps more than the native planes (W4A8's panels with
        their row bases and fold flags)."""
        return self.native_bytes - self.stored_bytes


class ScaleMemoryLedger:
    """Per-layer figures of one process; recording a layer again replaces its entry (reloads stay exact)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layers: dict[str, LayerScaleMemory] = {}

    def record(self, entry: LayerScaleMemory) -> None:
        with self._lock:
            self._layers[entry.layer] = entry

    def layers(self) -> tuple[LayerScaleMemory, ...]:
        with self._lock:
            return tuple(self._layers.values())

    def total(self) -> LayerScaleMemory:
        layers = self.layers()
        forms = sorted({f for x in layers for f in x.form.split("+")}) or [FORMS[0]]
        return LayerScaleMemory(
            layer="total",
            native_bytes=sum(x.native_bytes for x in layers),
            stored_bytes=sum(x.stored_bytes for x in layers),
            form="+".join(forms),
        )

    def report(self) -> dict[str, object]:
        """JSON-ready: every layer and the total, in bytes."""

        def row(x: LayerScaleMemory) -> dict[str, object]:
            return {"layer": x.layer, "form": x.form, "native": x.native_bytes, "stored": x.stored_bytes,
                    "returned": x.returned_bytes}  # fmt: skip

        return {"layers": [row(x) for x in self.layers()], "total": row(self.total())}

    def clear(self) -> None:
        with self._lock:
            self._layers.clear()


LEDGER = ScaleMemoryLedger()
