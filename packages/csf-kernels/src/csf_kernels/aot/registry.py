"""Every program the geometry catalog needs, across operations: what ``nox -s aot_build`` compiles."""

from __future__ import annotations

from math import prod

from csf_codec import scale_format as catalog_format
from csf_codec.inline import record_bytes_choices
from csf_codec.tile_layout import TILE_COLS
from csf_kernels.catalog import Catalog, MoEGeometry
from csf_kernels.expand.specs import (
    ROW_EXPANDER_GROUP_TILES,
    ROW_EXPANDER_STORES,
    compact_spec,
    format_expansion_specs,
    inline_expansion_specs,
    row_block_covers,
    row_block_expander_spec,
    row_expander_spec,
    row_image_layout,
    stage_decoder_spec,
)
from csf_kernels.mla.heuristics import catalog_configs
from csf_kernels.mla.specs import sparse_mla_specs
from csf_kernels.moe.engine_specs import engine_geometry_specs, engine_probe_specs, engine_serves, engine_specs
from csf_kernels.moe.specs import moe_geometry_specs
from csf_kernels.moe.w4a8_specs import W4A8_FORMATS, w4a8_geometry_specs, w4a8_specs
from csf_kernels.runtime.programs import ProgramSpec

__all__ = ["catalog_specs", "geometry_specs"]


def geometry_specs(geo: MoEGeometry, *, cute: bool = True) -> list[ProgramSpec]:
    """The programs one geometry needs (``cute``: with its CuTe DSL ones)."""
    specs: list[ProgramSpec] = [compact_spec(w) for w in (1, 2, 4)]
    for shape, _group in geo.scale_planes().values():
        specs += inline_expansion_specs(geo.fmt, shape[-1])
        layout = row_image_layout(shape[-1], prod(shape))
        if cute and layout is not None:
            specs.append(row_expander_spec(geo.fmt, layout.group_tiles, layout.store))
        if cute and row_block_covers(shape[-1], prod(shape)):
            specs.append(row_block_expander_spec(geo.fmt, shape[-1]))
    return specs + moe_geometry_specs(geo) + engine_geometry_specs(geo) + w4a8_geometry_specs(geo)


def catalog_specs(catalog: Catalog, *, cute: bool = True) -> dict[str, tuple[ProgramSpec, list[str]]]:
    """key -> (spec, the geometries that need it), deduplicated across the catalog.

    Each format in the catalog also gets every expansion program (a few dozen small cubins), so any
    plane of that format expands, not only the catalog's shapes."""
    out: dict[str, tuple[ProgramSpec, list[str]]] = {}
    for geo in catalog.moe:
        for spec in geometry_specs(geo, cute=cute):
            _add(out, spec, geo.name)
    for fmt in sorted({g.fmt.name for g in catalog.moe}):
        for spec in format_expansion_specs(catalog_format(fmt)):
            _add(out, spec, f"any/{fmt}")
    for spec in sparse_mla_specs(catalog_configs(catalog.sparse_mla)):
        _add(out, spec, "sparse_mla")
    if cute:
        for geo in catalog.moe:
            for s in record_bytes_choices(geo.fmt, TILE_COLS):
                spec = stage_decoder_spec(geo.fmt, s)
                _add(out, spec, geo.name)
        engine_formats = sorted({g.fmt.name for g in catalog.moe if engine_serves(g)})
        for spec in engine_specs(engine_formats):
            _add(out, spec, "engine")
        if "mxfp4" in engine_formats:  # diagnostic programs (never served), for benchmarks/bench_engine.py
            for spec in engine_probe_specs():
                _add(out, spec, "engine-probes")
        if any(g.fmt.name in W4A8_FORMATS for g in catalog.moe):
            for spec in w4a8_specs():
                _add(out, spec, "engine")
        for fmt in sorted({g.fmt.name for g in catalog.moe}):
            for gt in ROW_EXPANDER_GROUP_TILES:
                for store in ROW_EXPANDER_STORES:
                    spec = row_expander_spec(catalog_format(fmt), gt, store)
                    _add(out, spec, f"any/{fmt}")
    return out


def _add(out: dict[str, tuple[ProgramSpec, list[str]]], spec: ProgramSpec, geometry: str) -> None:
    """File ``spec`` under its key for ``geometry``: a key is one program, so two distinct specs under one key (a
    collision, or a fact the key does not see) would serve one's binary for the other: refused."""
    held, geos = out.setdefault(spec.key, (spec, []))
    if held != spec:
        raise ValueError(f"programs {held.describe()} and {spec.describe()} share the key {spec.key}")
    geos.append(geometry)
