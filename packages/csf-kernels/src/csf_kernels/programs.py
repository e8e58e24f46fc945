"""Program specs: the explicit compile key of every GPU program csf ships.

A spec names a kernel by a dotted id, carries a version integer (bump it by hand, with a comment,
whenever the kernel's behaviour changes without its source hash changing) and named facts (the
compile-time constants and launch shape). Its key is the sha256 of its canonical JSON.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field

__all__ = ["ProgramSpec", "TritonFamily"]


@dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    kernel: str  # dotted id, e.g. "expand.inline_tiles"
    version: int
    facts: tuple[tuple[str, object], ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, kernel: str, version: int, **facts: object) -> ProgramSpec:
        return cls(kernel=kernel, version=version, facts=tuple(sorted(facts.items())))

    @property
    def fact(self) -> dict[str, object]:
        return dict(self.facts)

    def canonical(self) -> str:
        return json.dumps({"kernel": self.kernel, "version": self.version, "facts": self.fact}, sort_keys=True)

    @property
    def key(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:24]

    def describe(self) -> str:
        facts = ", ".join(f"{k}={v}" for k, v in self.facts)
        return f"{self.kernel} v{self.version} ({facts})"


@dataclass(frozen=True, kw_only=True)
class TritonFamily:
    kernel: str
    version: int
    module: str
    function: str
    num_warps: int
    signature: str = "SIGNATURE"  # the module attribute holding the kernel's parameter types

    def source(self):
        """(jit function, signature dict, module) -- imports triton."""
        mod = importlib.import_module(self.module)
        return getattr(mod, self.function), dict(getattr(mod, self.signature)), mod
