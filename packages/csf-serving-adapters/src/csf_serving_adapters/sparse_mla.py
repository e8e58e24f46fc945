"""csf sparse MLA decode behind the engines' FlashMLA-shaped FP8 decode call (engine-neutral).

Both engines keep DeepSeek-V3.2's FP8 KV cache in the 656-byte record layout csf reads
(``fp8_ds_mla``: 512 E4M3 latent bytes, four float32 scales, 64 bf16 rope values) and hand their decode
kernel ``q`` [batch, q_rows, heads, 576], ``indices`` [batch, q_rows, topk] (global slots, -1 = skip).
:func:`decode` serves that call with csf: one bound decoder per (heads, top-k, device), sized for the
engine's largest decode batch (the engines' adapters pass it: see :func:`service`), all layers sharing one
scratch buffer (they run one after another). A call with more query rows than planned (an eager batch
beyond the engine's stated limits) runs in slices of the planned size rather than failing. Switched on by
``CSF_SPARSE_MLA=1``.
"""

from __future__ import annotations

import threading

import torch

from csf_kernels import env
from csf_kernels.mla.layout import VALUE_DIM

__all__ = ["ENV_SWITCH", "SparseMLAService", "enabled", "service"]

ENV_SWITCH = "CSF_SPARSE_MLA"
DEFAULT_MAX_ROWS = 256


def enabled() -> bool:
    """Whether the engines' sparse-MLA decode should run on csf (``CSF_SPARSE_MLA``; off by default)."""
    return env.flag(ENV_SWITCH)


class SparseMLAService:
    """Decoders per (heads, top-k, device) over one scratch per device; ``max_rows`` bounds the query
    rows (batch x q_rows) of one call."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS):
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._decoders: dict[tuple, object] = {}
        self._lengths: dict[tuple, torch.Tensor] = {}

    def _decoder(self, heads: int, topk: int, device: torch.device):
        from csf_attention import MLACaps, bind, plan

        key = (heads, topk, device)
        with self._lock:
            dec = self._decoders.get(key)
            if dec is None:
                p = plan(MLACaps(heads=heads, max_rows=self.max_rows, topk=topk))
                dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device=device))
                self._decoders[key] = dec
            return dec

    def _full_lengths(self, rows: int, topk: int, device: torch.device) -> torch.Tensor:
        key = (rows, topk, device)
        with self._lock:
            t = self._lengths.get(key)
            if t is None:  # cached: graph replays read the same tensor
                t = self._lengths[key] = torch.full((rows,), topk, dtype=torch.int32, device=device)
            return t

    def decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """FlashMLA's sparse FP8 decode contract: ``q`` bf16 [batch, q_rows, heads, 576], ``kv_cache`` any
        uint8-viewable cache of 656-byte records, ``indices`` [batch, q_rows, topk] (-1 = skip) -> (out
        bf16 [batch, q_rows, heads, 512], lse float32 [batch, heads, q_rows], natural log)."""
        if q.dim() != 4 or indices.dim() != 3 or indices.shape[:2] != q.shape[:2]:
            raise ValueError(f"q must be [batch, q_rows, heads, 576] and indices [batch, q_rows, topk], got "
                             f"{tuple(q.shape)} and {tuple(indices.shape)}")  # fmt: skip
        batch, q_rows, heads, dim = q.shape
        rows, topk = batch * q_rows, indices.shape[-1]
        if not kv_cache.is_contiguous():  # read in place, never copied
            raise ValueError(f"the KV cache must be contiguous, got strides {kv_cache.stride()}")
        kv = kv_cache.view(torch.uint8)
        kv = kv.view(-1, kv.shape[-1])
        idx = indices.reshape(rows, topk)
        idx = idx if idx.dtype == torch.int32 and idx.is_contiguous() else idx.to(torch.int32).contiguous()
        dec = self._decoder(heads, topk, q.device)
        q = q.reshape(rows, heads, dim).contiguous()
        if rows <= self.max_rows:
            out, lse = dec.run_decode(q, kv, idx, self._full_lengths(rows, topk, q.device), sm_scale, return_lse=True)
        else:  # beyond the planned batch: slices of the planned size, into one output
            out = torch.empty(rows, heads, VALUE_DIM, dtype=torch.bfloat16, device=q.device)
            lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
            for s in range(0, rows, self.max_rows):
                e = min(rows, s + self.max_rows)
                dec.run_decode(q[s:e], kv, idx[s:e], self._full_lengths(e - s, topk, q.device), sm_scale,
                               return_lse=True, out=out[s:e], lse=lse[s:e])  # fmt: skip
        return out.view(batch, q_rows, heads, -1), lse.view(batch, q_rows, heads).permute(0, 2, 1)


_service: SparseMLAService | None = None
_service_lock = threading.Lock()


def service(max_rows: int | None = None) -> SparseMLAService:
    """The process's service. ``max_rows``: the engine's largest decode batch in query rows (sequences x
    query rows per sequence); a larger value than the service has re-plans it (the engines' backends pass
    it when they are built, before any decode call)."""
    global _service
    with _service_lock:
        if _service is None:
            _service = SparseMLAService(max_rows or DEFAULT_MAX_ROWS)
        elif max_rows and max_rows > _service.max_rows:
            _service = SparseMLAService(max_rows)
        return _service
