"""Both MoE layers' argument checks (``csf_moe.call_args``), on the CPU: every malformed call is refused with a
message naming the argument, before anything launches."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.catalog import load_catalog
from csf_moe import plan
from csf_moe.call_args import checked_output

GEO = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
PLANS = {"triton": plan(GEO, 64), "engine": plan(GEO, 64, gemm="engine")}


def _args(t: int = 5):
    x = torch.zeros(t, GEO.hidden, dtype=torch.bfloat16)
    ids = torch.zeros(t, GEO.top_k, dtype=torch.int32)
    return x, ids, torch.zeros(t, GEO.top_k)


@pytest.mark.parametrize("which", sorted(PLANS))
def test_a_well_formed_call_gets_its_output(which):
    x, ids, w = _args()
    out = checked_output(PLANS[which], x, ids, w, None)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    given = torch.empty_like(x)
    assert checked_output(PLANS[which], x, ids, w, given) is given


@pytest.mark.parametrize("which", sorted(PLANS))
@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("x_dtype", "hidden_states must be bf16"),
        ("x_width", "hidden_states must be bf16"),
        ("ids_shape", "topk_ids and topk_weights must be"),
        ("weights_shape", "topk_ids and topk_weights must be"),
        ("too_many", "tokens"),
        ("out_shape", "out must be contiguous"),
        ("out_strided", "out must be contiguous"),
    ],
)
def test_a_malformed_call_is_refused(which, case, match):
    x, ids, w = _args(65 if case == "too_many" else 5)
    out = None
    if case == "x_dtype":
        x = x.float()
    elif case == "x_width":
        x = x[:, :-8]
    elif case == "ids_shape":
        ids = ids[:, :-1]
    elif case == "weights_shape":
        w = w[:-1]  # a routing weight short: the combine would read past it
    elif case == "out_shape":
        out = torch.empty(4, GEO.hidden, dtype=torch.bfloat16)
    elif case == "out_strided":
        out = torch.empty(GEO.hidden, 5, dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match=match):
        checked_output(PLANS[which], x, ids, w, out)
