"""The engine layer's benchmark arms (``csf_moe.engine_layer``), one table for ``bench_moe.py`` and
``kernel_times.py``: each arm's ``engine_weights`` options and ``EngineMoE`` options.

"engine" applies FC1's activation in FC1's epilogue with each block size's defaults, "engine_unfused" in a pass
of its own, "engine_inline" decodes its scales from engine records in a producer warp, "engine_w4a8" runs the
W4A8 GEMMs (MXFP4 geometries; per-token E4M3 activations). The others force one choice of the defaults where the
cache holds it, so their outputs are "engine"'s bits: "engine_slice" / "engine_stage" the consumer schedule
(docs/moe-engine.md §4.9), "engine_transform" producer warps converting the weights into bf16 A tiles for SS
wgmmas at 64- to 256-route blocks (§4.4, §7; the default schedule elsewhere; "engine_inline_transform" with
inline scales), "engine_pass" /
"engine_producer" where FC1's rows come from (§4.11), "engine_whole" every block whole, no ragged tails (§4.12),
"engine_quarter_ragged" tails in their first quarter run as quarter blocks,
"engine_two_mul" two multiplies a pair everywhere (MXFP4, §4.11);
"engine_inline_pass": inline scales with FC1's rows from the gather pass (its producer warps then only decode and
copy tiles, no row gathers beside the decoder: the issue-slot question of docs/moe-engine.md §7);
"engine_half_blocks": blocks sized for half an expert's mean routes (more, smaller blocks; shorter tails);
"engine_unsplit" / "engine_inline_unsplit": no K splits (``splits=1``), the baseline of the few-token calls that
"engine" / "engine_inline" split (csf_moe.engine_split: another summation order, so not "engine"'s bits).
"""

from __future__ import annotations

from csf_moe.engine_layer import EngineMoE, engine_weights

__all__ = ["ENGINE_ARMS", "engine_layer", "same_bits_as_engine"]

ENGINE_ARMS = {  # arm -> (engine_weights' options, EngineMoE's options)
    "engine": ({}, {}),
    "engine_unfused": ({"fused": False}, {}),
    "engine_inline": ({"scale_source": "inline"}, {}),
    "engine_w4a8": ({"w4a8": True}, {}),
    "engine_slice": ({}, {"schedule": "slice"}),
    "engine_stage": ({}, {"schedule": "stage"}),
    "engine_transform": ({}, {"schedule": "transform"}),
    "engine_inline_transform": ({"scale_source": "inline"}, {"schedule": "transform"}),
    "engine_pass": ({}, {"fc1_rows": "pass"}),
    "engine_producer": ({}, {"fc1_rows": "producer"}),
    "engine_whole": ({}, {"ragged": False}),
    "engine_quarter_ragged": ({}, {"ragged": 2}),
    "engine_two_mul": ({}, {"one_multiply": False}),
    "engine_inline_pass": ({"scale_source": "inline"}, {"fc1_rows": "pass"}),
    "engine_half_blocks": ({}, {"block_fill": 0.5}),
    "engine_unsplit": ({}, {"splits": 1}),
    "engine_inline_unsplit": ({"scale_source": "inline"}, {"splits": 1}),
}


def engine_layer(arm: str, reference, geo) -> EngineMoE:
    """``arm``'s engine layer of a synthetic layer's ``reference`` experts on ``geo``."""
    weights, options = ENGINE_ARMS[arm]
    return EngineMoE(engine_weights(reference, geo.activation, **weights), geo.top_k, **options)


def same_bits_as_engine(arm: str) -> bool:
    """Whether ``arm`` must store the "engine" arm's bits: another scale source, or a forced default (not the K
    splits: an unsplit call sums in another order)."""
    weights, options = ENGINE_ARMS[arm]
    if "splits" in options:
        return False
    return arm != "engine" and (weights.get("scale_source") == "inline" or bool(options))
