"""The MoE programs' policy: which tile configuration, how many K splits, which calls skip the alignment or the
FC1 finish, by routes per expert and the device's SM count (``runtime.device``). Plans call these; the programs
they choose are defined in :mod:`csf_kernels.moe.specs`."""

from __future__ import annotations

from csf_kernels.moe import specs
from csf_kernels.moe.specs import FIN_STEPS, GemmConfig, routes_as_blocks
from csf_kernels.runtime import device

__all__ = ["ROUTED_TOKENS", "decode_config_for", "fc2_finishes_fc1", "split_count"]

NARROW_ROUTES_PER_EXPERT = 4  # routes per expert (T * k / E) up to which DECODE_NARROW runs
BLOCK_ROUTES_PER_EXPERT = 8  # ... DECODE above, up to this
WIDE_ROUTES_PER_EXPERT = 64  # ... DECODE_WIDE above, up to this; DECODE_WIDEST above (csf_moe.plan: how far)


def decode_config_for(routes: int, experts: int) -> GemmConfig:
    """The decode tile configuration for ``routes`` (tokens x top-k) over ``experts`` experts."""
    # read off the specs module at each call, so a sweep that swaps a config there plans with it
    if routes <= NARROW_ROUTES_PER_EXPERT * experts:
        return specs.DECODE_NARROW
    if routes <= BLOCK_ROUTES_PER_EXPERT * experts:
        return specs.DECODE
    return specs.DECODE_WIDE if routes <= WIDE_ROUTES_PER_EXPERT * experts else specs.DECODE_WIDEST


# split-K decode aims for this many programs per GEMM per SM (a few waves), at most MAX_SPLITS splits
PROGRAMS_PER_SM = 4
TARGET_PROGRAMS: int | None = None  # sweeps only: programs per GEMM whatever the SM count
MAX_SPLITS = 16


def split_count(programs: int, k_steps: int) -> int:
    """K splits for a split-K GEMM of ``programs`` programs per split over ``k_steps`` K steps."""
    target = TARGET_PROGRAMS or PROGRAMS_PER_SM * device.num_sms()
    want = -(-target // max(programs, 1))
    splits = max(1, min(want, MAX_SPLITS, max(1, k_steps // 2)))
    per_split = -(-k_steps // splits)
    return -(-k_steps // per_split)  # no empty splits


# calls of up to this many tokens on the one-token tiles, not expanding scales, skip the alignment: the decode
# GEMMs read their route ids as blocks (a route each; two routes of one expert read its weights twice, which loses
# once experts repeat: docs/perf-notes.md, "Few-token calls without an alignment")
ROUTED_TOKENS = 4


def fc2_finishes_fc1(config: GemmConfig, tokens: int, fc2_splits: int, fc2_k_steps: int) -> bool:
    """Whether calls of up to ``tokens`` tokens on ``config`` run no FC1 finish kernel: their routed FC2 programs
    finish FC1 from its partials for their own K range (``moe_gemm_decode``'s ``FIN``), where FC2's splits hold
    at most :data:`FIN_STEPS` K steps (never more splits for it: forcing them measured slower)."""
    fits = -(-fc2_k_steps // fc2_splits) <= FIN_STEPS
    return tokens <= ROUTED_TOKENS and routes_as_blocks(config) and config.word_stages > 1 and fits
