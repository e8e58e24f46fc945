"""How much scale memory the served layers gave back: native planes released, compact storage kept."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["LEDGER", "LayerScaleMemory", "ScaleMemoryLedger"]


@dataclass(frozen=True, kw_only=True)
class LayerScaleMemory:
    layer: str
    native_bytes: int  # the layer's scale planes as the checkpoint's native form holds them
    stored_bytes: int  # what the layer keeps (inline CSF records)

    @property
    def returned_bytes(self) -> int:
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
        return LayerScaleMemory(
            layer="total",
            native_bytes=sum(x.native_bytes for x in layers),
            stored_bytes=sum(x.stored_bytes for x in layers),
        )

    def report(self) -> dict[str, object]:
        """JSON-ready: every layer and the total, in bytes."""

        def row(x: LayerScaleMemory) -> dict[str, object]:
            return {"layer": x.layer, "native": x.native_bytes, "stored": x.stored_bytes, "returned": x.returned_bytes}

        return {"layers": [row(x) for x in self.layers()], "total": row(self.total())}

    def clear(self) -> None:
        with self._lock:
            self._layers.clear()


LEDGER = ScaleMemoryLedger()
