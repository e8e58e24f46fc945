"""csf-kernels is organised by operation, and its import graph says so: operations (expand, moe, mla) import the
runtime, the CSF record and the catalog, never each other; the runtime imports nothing above it; no csf module
imports another that imports it back, not even through a function-level import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["csf_codec", "csf_kernels", "csf_moe", "csf_attention", "csf_serving_adapters"]
KERNELS = ROOT / "packages/csf-kernels/src/csf_kernels"
OPERATIONS = ("expand", "moe", "mla")
# what each part of csf_kernels may import of csf_kernels (besides itself)
ALLOWED = {
    "runtime": set(),
    "record": {"runtime"},
    "catalog": set(),
    "env": {"runtime"},
    **{op: {"runtime", "record", "catalog"} for op in OPERATIONS},
    "aot": {"runtime", "record", "catalog", "env", *OPERATIONS},
    "__init__": {"runtime", "aot"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        src = ROOT / "packages" / pkg.replace("_", "-") / "src"
        for path in sorted((src / pkg).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every csf module ``name`` imports, at module level or inside functions (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "csf_kernels":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_kernels_module_belongs_to_a_known_part():
    parts = {_part(m) for m in MODULES if m.startswith("csf_kernels")}
    assert parts <= set(ALLOWED), sorted(parts - set(ALLOWED))
    assert set(OPERATIONS) <= parts, "an operation folder is missing: the check would pass vacuously"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_kernels_parts_import_only_what_they_may(part):
    for module, deps in GRAPH.items():
        if _part(module) != part:
            continue
        for dep in deps:
            other = _part(dep)
            if other is not None and other != part:
                assert other in ALLOWED[part], f"{module} imports {dep}: {part} may import only {sorted(ALLOWED[part])}"


def test_every_operation_has_its_host_api_specs_policy_and_device_code():
    for op in OPERATIONS:
        for piece in ("launch.py", "specs.py", "heuristics.py", "kernels/__init__.py"):
            assert (KERNELS / op / piece).is_file(), f"csf_kernels/{op}/{piece}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over the whole csf import graph: every one is a single module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert len(GRAPH) > 100, "the module graph is too small: the check would pass vacuously"
    assert not cycles, f"import cycles: {cycles}"
