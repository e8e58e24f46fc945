"""Weight preparation: expert stacks as the fused kernels read them, with scales in the planned form.

``prepare_weights`` takes one layer's FP4 expert weights with their scale planes (native bytes, or a
CSF compact payload as ``csf compress`` stores it), and builds on the weights' device what the plan
reads: the native planes (``scale_source='native'``) or the inline CSF storage (``'inline'`` and
``'expanded'``), verified to decode to the native bytes. Temporaries live in a private CUDA memory
pool that is released afterwards, so preparation leaves no freed pages reserved.

Conventions: W13 rows are [gate; up] (N rows each); gpt-oss checkpoints interleave them (gate, up,
gate, ...), which ``w13_layout='interleaved'`` converts. Biases are kept in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from csf_codec import CompactScales, InlineScales, decode_compact, encode_inline
from csf_kernels.moe.fp4_words import gemm_words
from csf_kernels.moe.launch import GemmOperand, wide_row_tiles

from .plan import MoEPlan

__all__ = ["MoEWeights", "prepare_weights"]

_ALIGN = 256  # every part starts 256-byte aligned (the kernels read records as aligned words)


@dataclass(frozen=True, kw_only=True)
class MoEWeights:
    w13: GemmOperand
    w2: GemmOperand

    def scale_bytes(self) -> dict[str, int]:
        """Bytes the layer's scales occupy as stored here, and as native planes."""
        stored = native = 0
        for op in (self.w13, self.w2):
            plane = op.inline.shape if op.inline is not None else tuple(op.scales.shape)
            native += plane[0] * plane[1] * plane[2]
            stored += op.inline.nbytes if op.inline is not None else op.scales.numel()
        return {"stored": stored, "native": native}


class _PrivatePool:
    """Allocations inside ``with pool:`` come from a private CUDA pool; :meth:`release` frees it once
    nothing allocated there is referenced any more (results must be copied out first)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.MemPool() if device.type == "cuda" else None
        self._ctx = None

    def __enter__(self):
        if self.pool is not None:
            self._ctx = torch.cuda.use_mem_pool(self.pool, device=self.device)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False

    def release(self) -> None:
        if self.pool is not None:
            self._ctx = None  # the context holds the pool too
            self.pool = None
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


def _native_plane(scale, shape: tuple[int, ...], name: str, device: torch.device) -> torch.Tensor:
    if isinstance(scale, CompactScales) or (isinstance(scale, torch.Tensor) and scale.dim() == 1):
        payload = scale.to(device) if isinstance(scale, torch.Tensor) else scale
        return decode_compact(payload, name=name, expected_shape=shape)
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise TypeError(f"{name}: expected a uint8 scale plane or a CSF compact payload, got {type(scale).__name__}")
    plane = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    if tuple(plane.shape) != tuple(shape):
        raise ValueError(f"{name}: scale plane {tuple(plane.shape)} does not match the geometry's {shape}")
    return plane.to(device)


def _deinterleave(t: torch.Tensor | None) -> torch.Tensor | None:
    """Rows (gate, up, gate, up, ...) -> [gate; up] along dim 1."""
    if t is None:
        return None
    return torch.cat((t[:, 0::2], t[:, 1::2]), dim=1).contiguous()


def _global(g, experts: int, name: str, device) -> torch.Tensor:
    if g is None:
        raise ValueError(f"NVFP4 weights need {name} (float32 per expert, ModelOpt's weight_scale_2)")
    g = torch.as_tensor(g, dtype=torch.float32, device=device).reshape(-1)
    if g.numel() == 1:
        g = g.expand(experts)
    if g.numel() != experts:
        raise ValueError(f"{name}: {g.numel()} values for {experts} experts")
    return g.contiguous().clone()


def _bias(b, shape: tuple[int, int], name: str, device) -> torch.Tensor | None:
    if b is None:
        return None
    if tuple(b.shape) != shape:
        raise ValueError(f"{name}: bias {tuple(b.shape)} does not match {shape}")
    return b.to(device=device, dtype=torch.float32).contiguous()


def prepare_weights(
    plan: MoEPlan,
    *,
    w13: torch.Tensor,
    w13_scale,
    w2: torch.Tensor,
    w2_scale,
    w13_global_scale=None,
    w2_global_scale=None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    w13_layout: str = "gate_up",
    device: torch.device | str | None = None,
    values_in_place: bool = False,
) -> MoEWeights:
    """Build the layer's weights for ``plan``.

    ``w13`` uint8 [E, 2N, H/2] and ``w2`` uint8 [E, H, N/2] are packed E2M1 values; ``*_scale`` are
    uint8 (or float8_e4m3fn) planes [E, 2N, H/bs] and [E, H, N/bs], or CSF compact payloads of them.
    NVFP4 needs per-expert global scales; biases (gpt-oss) are [E, 2N] and [E, H].

    The GEMMs read the values with each word's bits permuted and the words in panel order
    (``csf_kernels.moe.fp4_words``): by default into new tensors; ``values_in_place`` hands ``w13`` / ``w2``
    over (a serving engine's own parameters, replaced by the results) and rearranges them where they are,
    so loading needs no second copy of the weights.
    """
    geo = plan.geometry
    device = torch.device(device) if device is not None else w13.device
    e, h, n = geo.experts, geo.hidden, geo.intermediate
    for name, t, shape in (("w13", w13, (e, 2 * n, h // 2)), ("w2", w2, (e, h, n // 2))):
        if t.dtype != torch.uint8 or tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected packed FP4 uint8 {shape}, got {t.dtype} {tuple(t.shape)}")
    if w13_layout not in ("gate_up", "interleaved"):
        raise ValueError(f"w13_layout must be 'gate_up' or 'interleaved', got {w13_layout!r}")
    for name, b in (("w13_bias", w13_bias), ("w2_bias", w2_bias)):
        if geo.bias != (b is not None):
            raise ValueError(f"{geo.name} {'needs' if geo.bias else 'takes no'} {name}")
    nv = geo.fmt.name == "nvfp4"
    v13 = w13.to(device).contiguous()
    b13 = _bias(w13_bias, (e, 2 * n), "w13_bias", device)
    if w13_layout == "interleaved":
        v13, b13 = _deinterleave(v13), _deinterleave(b13)
    v2 = w2.to(device).contiguous()
    b2 = _bias(w2_bias, (e, h), "w2_bias", device)
    g13 = _global(w13_global_scale, e, "w13_global_scale", device) if nv else None
    g2 = _global(w2_global_scale, e, "w2_global_scale", device) if nv else None
    # the GEMMs read FP4 words with their bits permuted for the conversion (csf_kernels.moe.fp4_words): in
    # place on copies made above (or on handed-over tensors), else into new tensors allocated here
    into13 = v13 if values_in_place or v13.data_ptr() != w13.data_ptr() else torch.empty_like(v13)
    into2 = v2 if values_in_place or v2.data_ptr() != w2.data_ptr() else torch.empty_like(v2)
    pool = _PrivatePool(device)
    with pool:
        s13 = _native_plane(w13_scale, geo.w13_scale_shape, "w13_scale", device)
        if w13_layout == "interleaved":
            s13 = _deinterleave(s13)
        s2 = _native_plane(w2_scale, geo.w2_scale_shape, "w2_scale", device)
        # MXFP4: which 64-row tiles hold scales the decode GEMM converts with two multiplies per pair
        wide = (wide_row_tiles(s13), wide_row_tiles(s2)) if geo.fmt.name == "mxfp4" else ()
        if plan.scale_source == "native":
            planes = (s13, s2)
        else:
            planes = (
                encode_inline(s13, geo.fmt, row_group=geo.w13_row_group, name="w13_scale"),
                encode_inline(s2, geo.fmt, name="w2_scale"),
            )
        del s13, s2
        # last, once every input has been checked: a refused input leaves handed-over values untouched
        block = geo.fmt.block_size
        v13, v2 = gemm_words(v13, block, out=into13), gemm_words(v2, block, out=into2)
    # copy the results out of the pool, drop every pool tensor, then release the pool
    owned = _own_all((*planes, *wide))
    planes, (wide13, wide2) = owned[:2], owned[2:] or (None, None)
    del wide
    pool.release()
    native = plan.scale_source == "native"
    return MoEWeights(
        w13=GemmOperand(
            values=v13,
            scales=planes[0] if native else None,
            inline=None if native else planes[0],
            global_scale=g13,
            bias=b13,
            wide_tiles=wide13,
        ),
        w2=GemmOperand(
            values=v2,
            scales=planes[1] if native else None,
            inline=None if native else planes[1],
            global_scale=g2,
            bias=b2,
            wide_tiles=wide2,
        ),
    )


def _own_all(planes: tuple) -> tuple:
    """Copy every tensor of ``planes`` (native planes or InlineScales) into one new allocation, so the
    results occupy exactly their size (no partly used allocator segments) outside the private pool."""
    parts = []
    for p in planes:
        parts += list(p.arrays()) if isinstance(p, InlineScales) else [p]
    sizes = [-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in parts]
    buf = torch.empty(max(sum(sizes), 1), dtype=torch.uint8, device=parts[0].device)
    views, offset = [], 0
    for t, size in zip(parts, sizes, strict=True):
        v = buf[offset : offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        v.copy_(t)
        views.append(v)
        offset += size
    out, i = [], 0
    for p in planes:
        if isinstance(p, InlineScales):
            n = len(p.arrays())
            base_ref, base_delta, records, raw, tail, tail_raw = views[i : i + n]
            out.append(replace(p, base_ref=base_ref, base_delta=base_delta, records=records, raw=raw, tail=tail,
                               tail_raw=tail_raw))  # fmt: skip
            i += n
        else:
            out.append(views[i])
            i += 1
    return tuple(out)
