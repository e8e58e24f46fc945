"""The package boundaries are the architecture: codec <- kernels <- moe, attention <- serving-adapters.

Every csf package may import only the csf packages below it, must declare them in its pyproject, and
csf-codec must not need triton, CuTe DSL or a GPU.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "csf_codec": set(),
    "csf_kernels": {"csf_codec"},
    "csf_moe": {"csf_codec", "csf_kernels"},
    "csf_attention": {"csf_codec", "csf_kernels"},
    "csf_serving_adapters": {"csf_codec", "csf_kernels", "csf_moe", "csf_attention"},
}
GPU_ONLY = {"triton", "cutlass", "cuda", "nvidia_cutlass_dsl"}


def _package_dir(module: str) -> Path:
    return ROOT / "packages" / module.replace("_", "-") / "src" / module


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_every_package_is_where_the_layout_says():
    for module in ALLOWED:
        assert (_package_dir(module) / "__init__.py").is_file(), module
        assert (_package_dir(module).parents[1] / "pyproject.toml").is_file(), module


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_imports_only_point_down(module):
    files = sorted(_package_dir(module).rglob("*.py"))
    assert files, f"no sources found for {module}: the check would pass vacuously"
    for path in files:
        csf = {m for m in _imports(path) if m in ALLOWED and m != module}
        bad = csf - ALLOWED[module]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}, above or beside {module}"


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_pyproject_declares_exactly_the_layers_below(module):
    meta = tomllib.loads((_package_dir(module).parents[1] / "pyproject.toml").read_text())
    deps = {d.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip() for d in meta["project"]["dependencies"]}
    declared = {d.replace("-", "_") for d in deps if d.startswith("csf-")}
    assert declared <= ALLOWED[module], f"{module} declares {sorted(declared - ALLOWED[module])}"
    used = set().union(*(_imports(p) for p in _package_dir(module).rglob("*.py"))) & set(ALLOWED)
    assert used - {module} <= declared, f"{module} imports {sorted(used - {module} - declared)} it does not declare"


def test_codec_needs_no_gpu_toolchain():
    meta = tomllib.loads((_package_dir("csf_codec").parents[1] / "pyproject.toml").read_text())
    deps = " ".join(meta["project"]["dependencies"])
    assert not any(g in deps for g in ("triton", "cutlass", "cuda")), deps
    for path in _package_dir("csf_codec").rglob("*.py"):
        assert not (_imports(path) & GPU_ONLY), f"{path.relative_to(ROOT)} imports a GPU toolchain"


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import csf_moe\nfrom csf_serving_adapters.x import y\n")
    assert _imports(bad) == {"csf_moe", "csf_serving_adapters"}
