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

__all__ = [
    "ALIGNMENT",
    "KEY_CHARS",
    "MisalignedArgumentError",
    "ProgramSpec",
    "TritonFamily",
    "assumed_multiples",
    "check_multiples",
    "is_triton",
    "program_key",
    "triton_family",
]

KEY_CHARS = 24  # hex digits of a program key: 96 bits of the sha256 of its spec's canonical JSON


def program_key(canonical: str) -> str:
    """The key of a spec given its canonical JSON (what the AOT cache files a program under)."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_CHARS]


@dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    kernel: str  # dotted id, e.g. "expand.inline_tiles"
    version: int
    facts: tuple[tuple[str, object], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # the key hashes the facts as a JSON object: a repeated name would collapse two specs into one key
        names = [name for name, _ in self.facts]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.kernel}: a fact is named twice in {names}")

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
        return program_key(self.canonical())

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
    gluon: bool = False  # written in Gluon (explicit layouts), compiled by the same Triton toolchain

    def __post_init__(self) -> None:
        if _TRITON_FAMILIES.setdefault(self.kernel, self) is not self:
            raise ValueError(f"two Triton families named {self.kernel!r}")

    def source(self):
        """(jit function, signature dict, module) -- imports triton."""
        mod = importlib.import_module(self.module)
        return getattr(mod, self.function), dict(getattr(mod, self.signature)), mod


# every Triton family, by kernel id: each registers itself where its operation's specs module defines it
_TRITON_FAMILIES: dict[str, TritonFamily] = {}


def triton_family(kernel: str) -> TritonFamily:
    """The Triton family of a kernel id (its specs module must have been imported, as making its specs does)."""
    try:
        return _TRITON_FAMILIES[kernel]
    except KeyError:
        raise KeyError(f"no Triton family {kernel!r} (a CuTe DSL program, or its specs module not imported)") from None


def is_triton(spec: ProgramSpec) -> bool:
    """Whether a spec names a Triton (or Gluon) program rather than a CuTe DSL one."""
    return spec.kernel in _TRITON_FAMILIES


# ------------------------------------------------------------------------------------ alignment contract

ALIGNMENT = 16  # bytes: every pointer argument of a compiled Triton program is assumed aligned to this


class MisalignedArgumentError(ValueError):
    """An argument breaks a divisibility the program was compiled to assume (it would misaddress)."""


def assumed_multiples(signature: dict[str, str], multiples: dict[str, int]) -> dict[str, int]:
    """Each runtime argument a program is compiled assuming divisible, with its divisor: every pointer
    (``ALIGNMENT`` bytes, so loads and stores vectorise and pipeline as under Triton's JIT, which
    specialises the same way) and the integers the kernel module lists in ``MULTIPLE_OF``."""
    unknown = set(multiples) - {n for n, t in signature.items() if t != "constexpr" and not t.startswith("*")}
    if unknown:
        raise ValueError(f"MULTIPLE_OF names no integer argument: {sorted(unknown)}")
    out = {n: ALIGNMENT for n, t in signature.items() if t.startswith("*")}
    out.update(multiples)
    return out


def check_multiples(what: str, names: tuple[str, ...], values: tuple, multiples: dict[str, int]) -> None:
    """Raise :class:`MisalignedArgumentError` unless every assumed divisibility holds (pointers given as
    tensors or ints)."""
    for name, value in zip(names, values, strict=True):
        m = multiples.get(name)
        if m is None:
            continue
        v = value.data_ptr() if hasattr(value, "data_ptr") else int(value)
        if v % m:
            raise MisalignedArgumentError(
                f"{what}: argument {name!r} is {v:#x}, not a multiple of {m} as the program was compiled to "
                "assume; pass an aligned tensor (e.g. a .clone()) or a conforming shape"
            )
