"""Host side of the sparse-MLA programs: argument checks and marshalling for decode and merge.

Returns :class:`Launch` objects (spec, grid, arguments); csf-attention plans splits and scratch and
binds them. Nothing here allocates on the device.
"""

from __future__ import annotations

import torch

from csf_kernels.mla.layout import HEAD_DIM, RECORD_BYTES, VALUE_DIM
from csf_kernels.mla.specs import DecodeConfig, decode_spec, merge_spec
from csf_kernels.runtime import Launch

__all__ = ["check_decode_inputs", "decode_launch", "merge_launch", "query_form"]


def query_form(q: torch.Tensor, quantize_query: bool) -> str:
    """The decode program's query mode for ``q`` (see ``mla_specs.QUERY_MODES``)."""
    if q.dtype == torch.uint8:
        return "packed"
    return "bf16_quantized" if quantize_query else "bf16"


def check_decode_inputs(q, kv_cache, indices, lengths, attn_sink=None) -> None:
    """Shapes, dtypes and devices of one decode call; raises ValueError / TypeError naming the argument."""
    bf16 = q.dtype == torch.bfloat16 and q.dim() == 3 and q.shape[2] == HEAD_DIM
    packed = q.dtype == torch.uint8 and q.dim() == 3 and q.shape[2] == RECORD_BYTES
    if not (bf16 or packed) or not q.is_contiguous():
        raise ValueError(f"q must be contiguous bf16 [rows, heads, {HEAD_DIM}] or packed uint8 [rows, heads, "
                         f"{RECORD_BYTES}], got {q.dtype} {tuple(q.shape)}")  # fmt: skip
    rows, heads = q.shape[0], q.shape[1]
    if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != RECORD_BYTES or not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be contiguous uint8 [..., {RECORD_BYTES}], got {kv_cache.dtype} "
                         f"{tuple(kv_cache.shape)}")  # fmt: skip
    if indices.dtype != torch.int32 or indices.dim() != 2 or indices.shape[0] != rows or not indices.is_contiguous():
        raise ValueError(f"indices must be contiguous int32 [{rows}, topk], got {indices.dtype} {tuple(indices.shape)}")
    if lengths.dtype != torch.int32 or tuple(lengths.shape) != (rows,) or not lengths.is_contiguous():
        raise ValueError(f"lengths must be contiguous int32 [{rows}], got {lengths.dtype} {tuple(lengths.shape)}")
    if attn_sink is not None and (attn_sink.dtype != torch.float32 or tuple(attn_sink.shape) != (heads,)):
        raise ValueError(f"attn_sink must be float32 [{heads}], got {attn_sink.dtype} {tuple(attn_sink.shape)}")
    devices = {t.device for t in (q, kv_cache, indices, lengths) + ((attn_sink,) if attn_sink is not None else ())}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


def decode_launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    *,
    sm_scale: float,
    splits: int,
    config: DecodeConfig,
    placeholder: torch.Tensor,
    partial_dtype: str = "float32",
    quantize_query: bool = False,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    at_most_per_sm: int | None = None,
) -> Launch:
    """The decode program over ``splits`` splits per row; partials [rows * splits, heads, 512] and lse
    [rows * splits, heads] (views of the caller's scratch). A uint8 ``q`` is a packed query;
    ``quantize_query`` quantizes a bf16 one in-kernel the same way (bit-identical results). With ``out``
    given (one split only) the program writes the finished output (and ``lse``) itself, as the merge would.
    ``at_most_per_sm``: how many of its programs an SM may hold (the plan's ``programs_per_sm``)."""
    rows, heads = q.shape[0], q.shape[1]
    want = (rows * splits, heads, VALUE_DIM)
    direct = out is not None
    if direct and splits != 1:
        raise ValueError(f"a decode that finishes its output needs one split per row, got {splits}")
    if not direct and (tuple(part_out.shape) != want or tuple(part_lse.shape) != want[:2]):
        got = (tuple(part_out.shape), tuple(part_lse.shape))
        raise ValueError(f"partials must be {want} and {want[:2]}, got {got[0]} and {got[1]}")
    if direct:
        _check_final(out, lse, rows, heads)
    bh = config.head_block
    if heads % bh:
        raise ValueError(f"{heads} heads do not split into blocks of {bh}")
    num_slots = kv_cache.numel() // RECORD_BYTES
    spec = decode_spec(config, partial_dtype, query_form(q, quantize_query), direct=direct,
                       sink=attn_sink is not None, lse=lse is not None)  # fmt: skip
    args = (q, kv_cache, indices, lengths, part_out, part_lse, _or(attn_sink, placeholder), _or(out, placeholder),
            _or(lse, placeholder), num_slots, float(sm_scale), heads, indices.shape[1], splits)  # fmt: skip
    return Launch(spec, (rows * (heads // bh), splits), args, at_most_per_sm)


def _or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    return placeholder if t is None else t


def _check_final(out: torch.Tensor, lse: torch.Tensor | None, rows: int, heads: int) -> None:
    if tuple(out.shape) != (rows, heads, VALUE_DIM) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 [{rows}, {heads}, {VALUE_DIM}]")
    if lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (rows, heads)):
        raise ValueError(f"lse must be float32 [{rows}, {heads}], got {lse.dtype} {tuple(lse.shape)}")


def merge_launch(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    out: torch.Tensor,
    *,
    splits: int,
    attn_sink: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    partial_dtype: str = "float32",
    placeholder: torch.Tensor,
) -> Launch:
    """The merge program: ``out`` bf16 [rows, heads, 512] (and ``lse`` float32 [rows, heads] if given)."""
    rows, heads = out.shape[0], out.shape[1]
    _check_final(out, lse, rows, heads)
    return Launch(
        merge_spec(partial_dtype, sink=attn_sink is not None, lse=lse is not None),
        (rows * heads,),
        (
            part_out,
            part_lse,
            placeholder if attn_sink is None else attn_sink,
            out,
            placeholder if lse is None else lse,
            heads,
            splits,
        ),
    )
