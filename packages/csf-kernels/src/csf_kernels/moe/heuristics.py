"""The MoE programs' policy: which tile configuration, how many K splits, which calls skip the alignment or the
FC1 finish, by routes per expert and the device's SM count (``runtime.device``). Plans call these; the programs
they choose are defined in :mod:`csf_kernels.moe.specs`."""

from __future__ import annotations

from csf_kernels.moe import specs
from csf_kernels.moe.engine_specs import ENGINE_RECORD_STEPS, engine_split_steps
from csf_kernels.moe.specs import FIN_STEPS, GemmConfig, routes_as_blocks
from csf_kernels.runtime import device

__all__ = ["ROUTED_TOKENS", "decode_config_for", "engine_splits", "fc2_finishes_fc1", "split_count"]

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


# The engine GEMM's K splits (docs/moe-engine.md §4.6): a call whose units (route block, 128-row tile) leave CTA
# slots (SMs x CTAs an SM) idle splits K so that the busiest SM finishes first. Model [D, to calibrate on the GPU]: a
# unit costs its K steps plus ENGINE_UNIT_FIXED_STEPS (its start, its epilogue's stores, the partials' extra traffic);
# CTA c runs on SM c mod SMs and walks units c, c + CTAs, ...; an SM's two CTAs together run at ENGINE_PAIR_RATE
# times one alone (decode units are latency-bound, so a second CTA adds throughput, not a second SM's worth). Each
# larger count must beat the best so far by ENGINE_SPLIT_MARGIN (the finishing kernels and partials cost a launch's
# worth).
ENGINE_UNIT_FIXED_STEPS = 2
ENGINE_PAIR_RATE = 1.5
ENGINE_SPLIT_MARGIN = 0.05
ENGINE_MAX_SPLITS = 16
ENGINE_SPLIT_MAX_TOKENS = 1  # calls of more tokens run unsplit: splits measured no gain there (docs/moe-engine.md §7)
ENGINE_MIN_SPLIT_STEPS = 2  # K steps a split at least (one MXFP4 record)


def _engine_time(units: int, steps: int, sms: int, ctas_per_sm: int) -> float:
    """The busiest SM's time (in K steps) for ``units`` units of ``steps`` K steps each."""
    ctas = min(units, sms * ctas_per_sm)
    worst = 0.0
    for sm in range(min(sms, ctas)):
        loads = [len(range(c, units, ctas)) for c in range(sm, ctas, sms)]
        worst = max(worst, max(max(loads), sum(loads) / min(len(loads), ENGINE_PAIR_RATE)))
    return worst * (steps + ENGINE_UNIT_FIXED_STEPS)


def engine_splits(units: int, k_steps: int, fmt: str, ctas_per_sm: int) -> int:
    """K splits for an engine GEMM of ``units`` units (route blocks x 128-row tiles, an upper bound) over ``k_steps``
    K steps of ``fmt`` weights at ``ctas_per_sm`` CTAs an SM: 1 where the units fill every CTA slot of the device
    (``runtime.device``'s SM count), else the count (whole records a split) the model above finishes first."""
    sms = device.num_sms()
    if units >= sms * ctas_per_sm:
        return 1
    per = ENGINE_RECORD_STEPS[fmt]
    counts = {-(-k_steps // step) for step in range(max(per, ENGINE_MIN_SPLIT_STEPS), k_steps + 1, per)}
    best, best_time = 1, _engine_time(units, k_steps, sms, ctas_per_sm)
    for splits in sorted(c for c in counts if 1 < c <= ENGINE_MAX_SPLITS):
        step = engine_split_steps(k_steps, splits, fmt)
        t = _engine_time(units * splits, step, sms, ctas_per_sm)
        if t < best_time * (1 - ENGINE_SPLIT_MARGIN):  # more splits: only for a margin over the best so far
            best, best_time = splits, t
    return best
