"""A bound sparse-MLA decoder: a plan, caller-owned scratch, and the programs resolved up front.

``run_decode`` checks its inputs, picks the plan's split count for the row count, and launches the
decode and merge programs on torch's current stream (capturable in CUDA graphs: nothing is allocated
when ``out`` and ``lse`` are given, and replays allocate nothing).
"""

from __future__ import annotations

import torch

from csf_kernels import runtime
from csf_kernels.mla.launch import check_decode_inputs, decode_launch, merge_launch
from csf_kernels.mla.layout import VALUE_DIM
from csf_kernels.runtime import Launch
from csf_kernels.runtime.launch import placeholder

from .plan import MLAPlan

__all__ = ["SparseMLADecoder", "bind"]


class SparseMLADecoder:
    def __init__(self, plan: MLAPlan, scratch: torch.Tensor):
        if scratch.dtype != torch.uint8 or scratch.dim() != 1 or scratch.numel() < plan.scratch.nbytes:
            raise ValueError(f"scratch must be a uint8 vector of at least {plan.scratch.nbytes} bytes")
        self.plan = plan
        self.scratch = scratch
        self._bound = runtime.BindingCache()  # keyed by row count, pointers and options

    def _partials(self, rows: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        caps = self.plan.caps
        dtype = torch.float32 if caps.partial_dtype == "float32" else torch.bfloat16
        off, _ = self.plan.scratch.part_out
        n = rows * splits * caps.heads * VALUE_DIM
        out = self.scratch[off : off + n * dtype.itemsize].view(dtype).view(rows * splits, caps.heads, VALUE_DIM)
        off, _ = self.plan.scratch.part_lse
        lse = self.scratch[off : off + rows * splits * caps.heads * 4].view(torch.float32)
        return out, lse.view(rows * splits, caps.heads)

    def launches(self, q, kv_cache, indices, lengths, sm_scale, attn_sink, out, lse) -> list[Launch]:
        """The programs one call runs (unbound: the runtime binds them; tests may interpret them)."""
        caps = self.plan.caps
        check_decode_inputs(q, kv_cache, indices, lengths, attn_sink)
        rows = q.shape[0]
        if q.shape[1] != caps.heads or indices.shape[1] != caps.topk:
            raise ValueError(f"the plan is for {caps.heads} heads and top-k {caps.topk}, got q {tuple(q.shape)} "
                             f"and indices {tuple(indices.shape)}")  # fmt: skip
        if tuple(out.shape) != (rows, caps.heads, VALUE_DIM) or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise ValueError(f"out must be contiguous bf16 [{rows}, {caps.heads}, {VALUE_DIM}]")
        splits = self.plan.splits_for(rows)
        kw = {"sm_scale": sm_scale, "splits": splits, "config": self.plan.config, "partial_dtype": caps.partial_dtype,
              "quantize_query": caps.quantize_query, "placeholder": placeholder(q.device),
              "at_most_per_sm": self.plan.programs_per_sm(rows)}  # fmt: skip
        if splits == 1 and self.plan.direct:  # the decode finishes the output: no partials, no merge
            unused = kw["placeholder"]  # no partials
            return [decode_launch(q, kv_cache, indices, lengths, unused, unused, out=out, lse=lse, attn_sink=attn_sink,
                                  **kw)]  # fmt: skip
        part_out, part_lse = self._partials(rows, splits)
        decode = decode_launch(q, kv_cache, indices, lengths, part_out, part_lse, **kw)
        merge = merge_launch(part_out, part_lse, out, splits=splits, attn_sink=attn_sink, lse=lse,
                             partial_dtype=caps.partial_dtype, placeholder=kw["placeholder"])  # fmt: skip
        return [decode, merge]

    def run_decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        indices: torch.Tensor,
        lengths: torch.Tensor,
        sm_scale: float,
        attn_sink: torch.Tensor | None = None,
        *,
        return_lse: bool = False,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
    ):
        """bf16 [rows, heads, 512] attention output (and float32 [rows, heads] lse if ``return_lse``).

        ``q``: bf16 [rows, heads, 576], or uint8 [rows, heads, 656] packed by ``pack_query``."""
        rows, heads = q.shape[0], q.shape[1]
        if out is None:
            out = torch.empty(rows, heads, VALUE_DIM, dtype=torch.bfloat16, device=q.device)
        if return_lse and lse is None:
            lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
        lse = lse if return_lse else None
        if rows == 0:
            return (out, lse) if return_lse else out
        args = (q, kv_cache, indices, lengths, attn_sink, out, lse)
        # what a binding bakes in: pointers, the query form, the cache's size (its slot bound), the scale
        key = (rows, float(sm_scale), q.dtype, kv_cache.numel(), *(None if a is None else a.data_ptr() for a in args))

        def bind_call():
            launches = self.launches(q, kv_cache, indices, lengths, sm_scale, attn_sink, out, lse)
            tensors = tuple(a for a in args if a is not None)
            return tuple(la.with_pointers(tensors).bind("sparse_mla") for la in launches)

        for launch in self._bound.get(key, bind_call):
            launch()
        return (out, lse) if return_lse else out

    __call__ = run_decode


def bind(plan: MLAPlan, scratch: torch.Tensor) -> SparseMLADecoder:
    """A decoder over caller-owned ``scratch`` (uint8, at least ``plan.scratch.nbytes``); every program the
    plan may launch is resolved now, so a frozen runtime missing one fails here, naming it."""
    decoder = SparseMLADecoder(plan, scratch)
    for spec in plan.programs:
        runtime.program(spec, geometry="sparse_mla")
    return decoder
