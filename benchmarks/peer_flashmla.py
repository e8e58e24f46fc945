"""DeepSeek's FlashMLA (commit 9241ae3, SM90 sparse FP8 decode) as bench_mla's ``flashmla`` arm (never vendored here).

``scripts/stage_flashmla.sh`` puts its sources under ``.peers/flashmla`` (git-ignored, checked by its
MANIFEST.json), ``scripts/build_flashmla.sh`` builds them on the device into ``.peers/flashmla/build/flash_mla``:
FlashMLA's own Python package, called as vLLM's and SGLang's sparse backends call it (``flash_mla_with_kvcache``
with ``is_fp8_kvcache=True`` and ``indices``).

The inputs are csf's problem instances in FlashMLA's layout (:func:`to_flashmla`, outside the timed region):

- the KV cache is the same bytes: FlashMLA's V32 record (its ``flash_mla_with_kvcache`` docstring and
  ``tests/quant.py``) is csf's, 656 bytes a token: 512 E4M3 latent codes, 4 float32 scales (one per 128 codes,
  value = code * scale), 64 bf16 rope values; pages of 64 become [pages, 64, 1, 656] (one KV head), a view;
- candidate ids mean the same (``page * 64 + offset``) but FlashMLA skips only -1 and takes lengths per batch
  element, not per query row: every candidate csf would skip (-1, at or past its row's length, past the cache)
  becomes -1, and FlashMLA gets no ``topk_length``;
- the query [rows, heads, 576] becomes [batch, rows per element, heads, 576]; FlashMLA runs 64 or 128 heads
  only, so 16 and 32 heads are zero-padded to 64 (as the engines pad them) and its output sliced back.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from csf_attention import live_candidates
from csf_kernels.mla.layout import HEAD_DIM, PAGE_SIZE, RECORD_BYTES, VALUE_DIM

ROOT = Path(__file__).resolve().parents[1]
FLASHMLA_HEADS = (64, 128)  # the head counts its SM90 sparse decode is built for


def _load_manifest_module():
    spec = importlib.util.spec_from_file_location("flashmla_manifest", ROOT / "scripts" / "flashmla" / "manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


manifest = _load_manifest_module()


def pinned_commit() -> str:
    """The FlashMLA commit the staging and build scripts pin (scripts/flashmla/flags.sh)."""
    text = (ROOT / "scripts" / "flashmla" / "flags.sh").read_text()
    return re.search(r"^FLASHMLA_COMMIT=([0-9a-f]{40})$", text, re.M).group(1)


def status(staged: Path) -> dict:
    """Whether the arm can run here, and why not: the staged tree intact and of the pinned commit, built, importable
    by this process, on an SM90 GPU. ``available`` is False with ``why`` otherwise (the arm is then skipped)."""
    try:
        doc = manifest.check_manifest(Path(staged), pinned_commit())
    except manifest.ManifestError as exc:
        return {"available": False, "why": str(exc)}
    out = {"available": False, "staged": str(staged), **{k: doc[k] for k in ("flashmla_commit", "cutlass_commit",
                                                                               "tree_sha256")}}  # fmt: skip
    build = Path(staged) / "build"
    if not (build / "flash_mla" / "cuda.so").is_file():
        return out | {"why": f"FlashMLA is staged but not built: run scripts/build_flashmla.sh (no {build}/flash_mla)"}
    out["build_stamp"] = (build / "STAMP").read_text().strip() if (build / "STAMP").is_file() else None
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return out | {"why": "FlashMLA's sparse decode is built for sm_90a: no SM90 GPU here"}
    try:
        import_flashmla(build)
    except ImportError as exc:
        return out | {"why": f"the built FlashMLA does not import: {exc}"}
    return out | {"available": True}


def import_flashmla(build: Path):
    """FlashMLA's ``flash_mla`` package from a build folder (the one built for this process's torch)."""
    if str(build) not in sys.path:
        sys.path.insert(0, str(build))
    module = importlib.import_module("flash_mla")
    if not Path(module.__file__).resolve().is_relative_to(Path(build).resolve()):
        raise ImportError(f"flash_mla resolves to {module.__file__}, not the build at {build}")
    return module


@dataclass(frozen=True)
class FlashMLAInputs:
    """One call's inputs in FlashMLA's layout (views of csf's tensors where the bytes agree)."""

    q: torch.Tensor  # bf16 [batch, s_q, padded heads, 576]
    k_cache: torch.Tensor  # uint8 [pages, 64, 1, 656], a view of csf's cache
    indices: torch.Tensor  # int32 [batch, s_q, topk], -1 wherever csf skips the candidate
    heads: int  # csf's heads (the leading ones of the output)


def padded_heads(heads: int) -> int:
    """The head count FlashMLA runs for ``heads``: 64 or 128 as they are, fewer padded to 64."""
    if heads in FLASHMLA_HEADS:
        return heads
    if 0 < heads < FLASHMLA_HEADS[0]:
        return FLASHMLA_HEADS[0]
    raise ValueError(f"FlashMLA runs 64 or 128 heads (fewer padded to 64): {heads} heads do not map")


def to_flashmla(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                s_q: int) -> FlashMLAInputs:  # fmt: skip
    """csf's call (q [rows, heads, 576] bf16, kv_cache uint8 [pages, 64, 656], indices [rows, topk] int32,
    lengths [rows]) as FlashMLA's, with ``s_q`` query rows per batch element (rows = batch * s_q)."""
    rows, heads, dim = q.shape
    if q.dtype != torch.bfloat16 or dim != HEAD_DIM:
        raise ValueError(f"q must be bf16 [rows, heads, {HEAD_DIM}], got {q.dtype} {tuple(q.shape)}")
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3 or kv_cache.shape[1:] != (PAGE_SIZE, RECORD_BYTES):
        raise ValueError(f"kv_cache must be uint8 [pages, {PAGE_SIZE}, {RECORD_BYTES}], got {kv_cache.dtype} "
                         f"{tuple(kv_cache.shape)}")  # fmt: skip
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous (FlashMLA reads whole pages of 64 records)")
    if s_q < 1 or rows % s_q:
        raise ValueError(f"{rows} query rows are not a whole number of elements of {s_q} rows")
    if indices.dim() != 2 or indices.shape[0] != rows or lengths.shape != (rows,):
        raise ValueError(f"indices must be [{rows}, topk] and lengths [{rows}], got {tuple(indices.shape)} and "
                         f"{tuple(lengths.shape)}")  # fmt: skip
    padded = padded_heads(heads)
    batch = rows // s_q
    q4 = q.view(batch, s_q, heads, HEAD_DIM)
    if padded != heads:
        q4 = torch.cat([q4, q4.new_zeros(batch, s_q, padded - heads, HEAD_DIM)], dim=2)
    live = live_candidates(indices, lengths, kv_cache.shape[0] * PAGE_SIZE)
    idx = torch.where(live, indices, -1).to(torch.int32).view(batch, s_q, -1).contiguous()
    return FlashMLAInputs(q4.contiguous(), kv_cache.view(kv_cache.shape[0], PAGE_SIZE, 1, RECORD_BYTES), idx, heads)


def from_flashmla(out: torch.Tensor, lse: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's (out [batch, s_q, padded heads, 512], lse [batch, padded heads, s_q]) as csf's rows:
    (out [rows, heads, 512], lse [rows, heads]). FlashMLA's lse of a row with no live candidate is +inf (csf's is
    -inf); both are natural logarithms."""
    batch, s_q = out.shape[0], out.shape[1]
    rows_out = out[:, :, :heads].reshape(batch * s_q, heads, VALUE_DIM)
    rows_lse = lse.transpose(1, 2)[:, :, :heads].reshape(batch * s_q, heads)
    return rows_out, rows_lse


class FlashMLADecode:
    """The peer's decode for one problem shape: ``run(inputs)`` calls FlashMLA; its first call makes the scheduler
    metadata, which later calls (and captures) reuse, as the layers of a model's step do."""

    def __init__(self, flash_mla, sm_scale: float):
        self.flash_mla = flash_mla
        self.sm_scale = sm_scale
        self.sched_meta, _ = flash_mla.get_mla_metadata()

    def run(self, x: FlashMLAInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.flash_mla.flash_mla_with_kvcache(
            x.q, x.k_cache, None, None, VALUE_DIM, self.sched_meta,
            softmax_scale=self.sm_scale, is_fp8_kvcache=True, indices=x.indices,
        )  # fmt: skip
