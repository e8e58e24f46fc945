"""A served layer's weights for the engine (:class:`csf_moe.engine_plan.EnginePlan`), built from the tensors the
serving engine loaded: :func:`prepare_engine_weights`.

The same weights as :func:`csf_moe.engine_layer.engine_weights` makes of a :class:`csf_moe.reference.QuantizedExperts`
in the activation's row layout with FC1's activation fused (tested equal), but from the engine's parameters as they
are: W13 rows ``gate_up`` or ``interleaved`` (composed into one row permutation, never a reordered copy of the whole
tensor), NVFP4 scale planes as float8_e4m3fn or uint8, and with ``values_in_place`` each expert's weight panel
written over its own packed values (the panel has the same bytes), so preparing a layer needs no second copy of its
weights.

Scales as the plan's source reads them: W4A16 ``inline``, engine records encoded from the plane over the rows the
GEMM reads (the native planes can then be released: what the serving adapters do); ``native``, scale panels (the
W4A8 GEMM's only source: its layer keeps panels as large as the native planes, plus W4A8's row bases and fold
flags).
"""

from __future__ import annotations

import torch

from csf_kernels.moe.engine_inline import inline_scales
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel, fc1_engine_rows
from csf_kernels.moe.launch import wide_row_tiles
from csf_kernels.moe.w4a8_panels import w4a8_bases, w4a8_tile_flags, w4a8_weight_panel

from .engine_layer import EngineWeights
from .weights import _global, _PrivatePool

__all__ = ["prepare_engine_weights", "w13_engine_rows"]

W13_LAYOUTS = ("gate_up", "interleaved")


def w13_engine_rows(inter: int, activation: str, w13_layout: str) -> torch.Tensor:
    """int64 ``[2N]``: engine row ``j`` of FC1 (its activation fused) is row ``rows[j]`` of W13 as stored in
    ``w13_layout``: the activation's own layout (SiLU [gate; up], gpt-oss's SwiGLU interleaved) reordered by
    :func:`~csf_kernels.moe.engine_panels.fc1_engine_rows`, each index taken through the stored layout."""
    if w13_layout not in W13_LAYOUTS:
        raise ValueError(f"w13_layout must be one of {W13_LAYOUTS}, got {w13_layout!r}")
    interleaved = activation == "swiglu_oai"
    i = torch.arange(2 * inter)
    if interleaved == (w13_layout == "interleaved"):
        stored = i  # the activation's layout is the stored one
    elif interleaved:  # interleaved index -> [gate; up] storage
        stored = i // 2 + inter * (i % 2)
    else:  # [gate; up] index -> interleaved storage
        stored = torch.where(i < inter, 2 * i, 2 * (i - inter) + 1)
    return stored[fc1_engine_rows(inter, interleaved=interleaved)]


def _plane(scale, shape: tuple[int, ...], name: str) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise TypeError(f"{name}: expected a uint8 (or float8_e4m3fn) scale plane, got {type(scale).__name__} "
                        f"{getattr(scale, 'dtype', '')}")  # fmt: skip
    plane = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    if tuple(plane.shape) != tuple(shape):
        raise ValueError(f"{name}: scale plane {tuple(plane.shape)} does not match the geometry's {shape}")
    return plane


def _bias(b, shape: tuple[int, int], name: str, rows: torch.Tensor | None = None) -> torch.Tensor | None:
    if b is None:
        return None
    if tuple(b.shape) != shape:
        raise ValueError(f"{name}: bias {tuple(b.shape)} does not match {shape}")
    b = b if rows is None else b[:, rows]
    return b.float().contiguous()


def _panel_view(values: torch.Tensor) -> torch.Tensor:
    """``values`` uint8 ``[E, R, K / 2]`` viewed as the weight panels that take its place ``uint64 [E, K / 64, R / 64,
    256]`` (the same bytes)."""
    e, r, half_k = values.shape
    return values.view(-1).view(torch.uint64).view(e, 2 * half_k // 64, r // 64, 256)


def prepare_engine_weights(
    plan,
    *,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w13_global_scale=None,
    w2_global_scale=None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    w13_layout: str = "gate_up",
    values_in_place: bool = False,
) -> EngineWeights:
    """The engine weights of an :class:`~csf_moe.engine_plan.EnginePlan`'s layer, on the values' device.

    ``w13`` uint8 [E, 2N, H/2] and ``w2`` uint8 [E, H, N/2] are packed E2M1 values as the checkpoint stores them;
    ``*_scale`` uint8 (or float8_e4m3fn) planes [E, 2N, H/bs] and [E, H, N/bs]; NVFP4 needs per-expert global scales
    (float32 [E], or one value); biases (gpt-oss) [E, 2N] and [E, H]. ``w13_layout``: how W13's rows are stored
    (``gate_up`` or ``interleaved``). ``values_in_place``: ``w13`` / ``w2`` are handed over (contiguous; a serving
    engine's own parameters) and their storage becomes the weight panels, which the result holds."""
    geo = plan.geometry
    e, h, n = geo.experts, geo.hidden, geo.intermediate
    for name, t, shape in (("w13", w13, (e, 2 * n, h // 2)), ("w2", w2, (e, h, n // 2))):
        if t.dtype != torch.uint8 or tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected packed FP4 uint8 {shape}, got {t.dtype} {tuple(t.shape)}")
        if values_in_place and not t.is_contiguous():
            raise ValueError(f"{name}: values handed over in place must be contiguous")
    if w13.device != w2.device:
        raise ValueError(f"w13 is on {w13.device}, w2 on {w2.device}")
    for name, b in (("w13_bias", w13_bias), ("w2_bias", w2_bias)):
        if geo.bias != (b is not None):
            raise ValueError(f"{geo.name} {'needs' if geo.bias else 'takes no'} {name}")
    device = w13.device
    fmt, w4a8, inline = plan.fmt, plan.w4a8, plan.scale_source == "inline"
    rows = w13_engine_rows(n, geo.activation, w13_layout).to(device)
    s13 = _plane(w13_scale, geo.w13_scale_shape, "w13_scale").to(device)[:, rows].contiguous()
    s2 = _plane(w2_scale, geo.w2_scale_shape, "w2_scale").to(device).contiguous()
    nv = fmt == "nvfp4"
    g13 = _global(w13_global_scale, e, "w13_global_scale", device) if nv else None
    g2 = _global(w2_global_scale, e, "w2_global_scale", device) if nv else None
    b13 = _bias(w13_bias, (e, 2 * n), "w13_bias", rows)
    b2 = _bias(w2_bias, (e, h), "w2_bias")
    extra = {}
    if fmt == "mxfp4" and not w4a8:  # the rows as the panels hold them (W13 in engine order)
        extra["wide13"], extra["wide2"] = wide_row_tiles(s13), wide_row_tiles(s2)
    if w4a8:
        for name, sc in (("13", s13), ("2", s2)):
            bases = w4a8_bases(sc)
            extra["base" + name], extra["flags" + name] = bases.contiguous(), w4a8_tile_flags(sc, bases).contiguous()
    if inline:
        p13, p2 = inline_scales(s13, fmt, name="w13_scale"), inline_scales(s2, fmt, name="w2_scale")
    else:
        p13, p2 = (torch.stack([engine_scale_panel(s[x], fmt) for x in range(e)]) for s in (s13, s2))
    del s13, s2
    # last, once every input has been checked and the scales are built: a refused input leaves handed-over values
    # untouched. Each expert's panel is made from its own rows only, so it may overwrite them.
    panel = w4a8_weight_panel if w4a8 else engine_weight_panel
    into13 = _panel_view(w13) if values_in_place else torch.empty_like(_panel_view(w13.contiguous()))
    into2 = _panel_view(w2) if values_in_place else torch.empty_like(_panel_view(w2.contiguous()))
    pool = _PrivatePool(device)  # the conversions' temporaries, released afterwards
    with pool:
        for x in range(e):
            into13[x].copy_(panel(w13[x].index_select(0, rows)))
            into2[x].copy_(panel(w2[x]))
    pool.release()
    return EngineWeights(w13=into13, s13=p13, w2=into2, s2=p2, b13=b13, b2=b2, activation=geo.activation, fused=True,
                         fmt=fmt, g13=g13, g2=g2, w4a8=w4a8, **extra)  # fmt: skip
