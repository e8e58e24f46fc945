"""Sparse MLA decode's policy: which program and head block serve a head count (the split policy, which reads the
device's SM count, is the plan's: csf_attention.plan). The choices are the measured best; the figures and the
alternatives tried are in docs/perf-notes.md ("Sparse MLA decode") and its archive."""

from __future__ import annotations

from csf_kernels.mla.specs import DecodeConfig

__all__ = ["catalog_configs", "decode_config", "triton_decode_config"]

# The Triton engine's best config per head block: the per-step latency chain, not the record registers, bounds
# a program, so blocks take few candidates a step; 16-head blocks regroup the converted latent.
_TRITON_BY_HEAD_BLOCK = {
    64: DecodeConfig(64, 8, 1, 1, operand="bfloat16"),
    32: DecodeConfig(32, 8, 1, 1),
    16: DecodeConfig(16, 4, 1, 2, regroup=True),
}
# The Gluon programs, measured faster than the Triton ones at every head count: 64-head blocks with heads on
# wgmma's M (64 and 128 heads), the two-warpgroup wgmma program for 32-head blocks, the 4-warp mma.sync program
# for 16-head blocks (two an SM).
_BY_HEAD_BLOCK = {
    64: DecodeConfig(64, 4, 1, 1, operand="bfloat16", engine="wide"),
    32: DecodeConfig(32, 4, 1, 1, engine="wgmma"),
    16: DecodeConfig(16, 4, 1, 2, engine="gluon"),
}


def _widest(table: dict[int, DecodeConfig], heads: int) -> DecodeConfig:
    if heads <= 0 or heads % 16:
        raise ValueError(f"sparse MLA decode needs a positive multiple of 16 heads per rank, got {heads}")
    return next(c for block, c in table.items() if heads % block == 0)


def decode_config(heads: int) -> DecodeConfig:
    """The decode config for ``heads`` heads per rank: the widest measured head block dividing them."""
    return _widest(_BY_HEAD_BLOCK, heads)


def triton_decode_config(heads: int) -> DecodeConfig:
    """The best measured Triton-engine config for ``heads`` (runs in Triton's CPU interpreter; the side-by-side
    arm of the Gluon programs in sweeps)."""
    return _widest(_TRITON_BY_HEAD_BLOCK, heads)


def catalog_configs(sparse_mla: dict) -> list[DecodeConfig]:
    """The decode configs the catalog's sparse-MLA entry (its head counts per rank) runs."""
    return [decode_config(h) for h in sparse_mla.get("heads", ())]
