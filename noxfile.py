"""Project sessions. `nox -s demo` runs the main job; `nox -s lint tests` runs the checks CI runs."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent
# torch 2.13.0 (CPU) is what the development and CI machines install from local wheels; the GPU
# machine has torch 2.11. The code supports 2.11 through 2.14.
TORCH = "torch==2.13.0"
PACKAGES = ["csf-codec", "csf-kernels", "csf-moe", "csf-attention", "csf-serving-adapters"]


def _install_packages(session: nox.Session, *, test: bool = False, build: bool = False) -> None:
    session.install(TORCH)
    args = ["-e", "packages/csf-codec[test]" if test else "packages/csf-codec"]
    args += ["-e", "packages/csf-kernels[build]" if build else "packages/csf-kernels"]
    for pkg in PACKAGES[2:]:
        args += ["-e", f"packages/{pkg}"]
    session.install(*args)


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU test suite (GPU tests are skipped here; see README for the H200 command)."""
    _install_packages(session, test=True, build=True)
    session.run("python", "-m", "pytest", "-m", "not gpu", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: synthetic MXFP4 and NVFP4 MoE checkpoints of the DeepSeek-V4.1-Flash TP4 layer,
    compressed, verified and restored, with their sizes and ratios."""
    _install_packages(session)
    session.run("python", "-m", "csf_codec.demo", *session.posargs)


def _commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@nox.session
def aot_build(session: nox.Session) -> None:
    """Compile every program of the geometry catalog for sm_90a into aot_cache/<cache key>/ (no GPU), and pack it
    into aot_cache/carry.tgz, what a device call carries to the GPU machine (scripts/pack_aot_cache.py)."""
    _install_packages(session, build=True)
    session.run("python", "-m", "csf_kernels.aot.build", *session.posargs)
    args = list(session.posargs)
    root = args[args.index("--out") + 1 : args.index("--out") + 2] if "--out" in args else []
    session.run("python", "scripts/pack_aot_cache.py", *(["--root", *root] if root else []))


def _run_benchmark(session: nox.Session, name: str) -> None:
    """benchmarks/bench_<name>.py, its JSON under benchmarks/results/<name>-<date>-<commit>.json."""
    _install_packages(session)
    out = f"benchmarks/results/{name}-{datetime.date.today().isoformat()}-{_commit()}.json"
    session.run("python", f"benchmarks/bench_{name}.py", "--out", out, *session.posargs)


@nox.session
def bench_codec(session: nox.Session) -> None:
    """Both forms' ratios against the entropy bound, CPU throughput and peak memory per regime, as JSON."""
    _run_benchmark(session, "codec")


@nox.session
def bench_moe(session: nox.Session) -> None:
    """Fused MoE figures (needs a GPU and the built aot_cache/): every arm per geometry and token count,
    as JSON under benchmarks/results/. On the H200 (no nox there) run the script directly: see README."""
    _run_benchmark(session, "moe")


@nox.session
def bench_mla(session: nox.Session) -> None:
    """Sparse MLA decode figures at FlashMLA's configurations (needs a GPU and the built aot_cache/), as
    JSON under benchmarks/results/. On the H200 run the script directly: see README."""
    _run_benchmark(session, "mla")


@nox.session
def tests_torch214(session: nox.Session) -> None:
    """The CPU suite (engine adapters aside: tests_vllm and tests_sglang run those) on torch 2.14.1, the newest torch
    csf supports and what vLLM 0.33 and SGLang 0.5.23 pin; ``tests`` runs on 2.13. The kernel toolchain stays the
    pinned one (triton 3.6.0, in whose Gluon the kernels are written, over torch's own triton pin; nvidia-cutlass-dsl
    4.8.1), so its packages go in without their dependencies. A ~5 GB venv: CI drops it after use."""
    session.install("torch==2.14.1")
    session.install("nvidia-cutlass-dsl==4.8.1", "torchao==0.18.0", "pytest>=8", "hypothesis>=6.100", "pyyaml>=6",
                    "cuda-bindings>=12.8", "safetensors", "tqdm>=4.60", "numpy")  # fmt: skip
    session.install("--no-deps", "triton==3.6.0")
    session.install("--no-deps", *[arg for pkg in PACKAGES for arg in ("-e", f"packages/{pkg}")])
    check = "import torch, triton; assert (torch.__version__[:5], triton.__version__) == ('2.14.', '3.6.0')"
    session.run("python", "-c", check)
    session.run("python", "-m", "pytest", "-m", "not gpu", "-q", "--ignore=tests/adapters", *session.posargs)


@nox.session
def tests_vllm(session: nox.Session) -> None:
    """The vLLM adapter tests on the CPU against the real vLLM (it pins torch 2.14, so it gets its own ~10 GB venv;
    the first install takes a few minutes), and bench_moe's triton_kernels arm on vLLM's own copy of triton_kernels.
    CI runs it after `tests`, which skips these without vLLM."""
    session.install("vllm==0.33.0", "pytest>=8")
    session.install("--no-deps", *[arg for pkg in PACKAGES for arg in ("-e", f"packages/{pkg}")])
    tests = ["tests/adapters", "tests/test_peer_triton_kernels.py"]
    session.run("python", "-m", "pytest", *tests, "-m", "not gpu", "-q", *session.posargs)


@nox.session
def tests_sglang(session: nox.Session) -> None:
    """The SGLang adapter tests on the CPU against the real SGLang (it pins torch 2.14.1, so it gets its own ~10 GB
    venv; the first install takes a few minutes). `tests`, which has no SGLang, skips these."""
    session.install("sglang==0.5.23", "pytest>=8")
    session.install("--no-deps", *[arg for pkg in PACKAGES for arg in ("-e", f"packages/{pkg}")])
    session.run("python", "-m", "pytest", "tests/adapters", "-m", "not gpu", "-q", "-k", "sglang", *session.posargs)
