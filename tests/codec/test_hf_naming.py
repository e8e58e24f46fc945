"""Recognising FP4 scale planes by Hugging Face naming conventions, dtypes and shapes."""

from __future__ import annotations

import pytest
import torch

from csf_codec.errors import ShapeMismatchError
from csf_codec.formats import MXFP4, NVFP4
from csf_codec.hf_naming import ScalePlaneSpec, find_scale_planes, match_scale_plane
from csf_codec.safetensors_io import TensorInfo


def _t(dtype: str, *shape: int) -> TensorInfo:
    return TensorInfo(name="", dtype=dtype, shape=tuple(shape))


E, N, K = 4, 8, 128


def gpt_oss(prefix: str = "model.layers.0.mlp.experts.gate_up_proj") -> dict[str, TensorInfo]:
    return {
        f"{prefix}_blocks": _t("U8", E, N, K // 32, 16),
        f"{prefix}_scales": _t("U8", E, N, K // 32),
        f"{prefix}_bias": _t("BF16", E, N),
    }


def modelopt(prefix: str = "model.layers.0.mlp.experts.0.down_proj", lead: tuple[int, ...] = ()) -> dict:
    return {
        f"{prefix}.weight": _t("U8", *lead, N, K // 2),
        f"{prefix}.weight_scale": _t("F8_E4M3", *lead, N, K // 16),
        f"{prefix}.weight_scale_2": _t("F32"),
        f"{prefix}.input_scale": _t("F32"),
    }


def ct_nvfp4(prefix: str = "model.layers.1.self_attn.q_proj") -> dict:
    return {
        f"{prefix}.weight_packed": _t("U8", N, K // 2),
        f"{prefix}.weight_scale": _t("F8_E4M3", N, K // 16),
        f"{prefix}.weight_global_scale": _t("F32", 1),
    }


def ct_mxfp4(prefix: str = "model.layers.1.mlp.experts.w13") -> dict:
    return {f"{prefix}.weight_packed": _t("U8", E, N, K // 2), f"{prefix}.weight_scale": _t("U8", E, N, K // 32)}


def test_gpt_oss_mxfp4():
    ts = gpt_oss()
    assert find_scale_planes(ts) == {
        "model.layers.0.mlp.experts.gate_up_proj_scales": ScalePlaneSpec(
            scale_name="model.layers.0.mlp.experts.gate_up_proj_scales",
            values_name="model.layers.0.mlp.experts.gate_up_proj_blocks",
            global_scale_name=None,
            fmt=MXFP4,
            convention="gpt-oss",
        )
    }


def test_gpt_oss_e8m0_dtype_accepted():
    ts = gpt_oss("p")
    ts["p_scales"] = _t("F8_E8M0", E, N, K // 32)
    assert find_scale_planes(ts)["p_scales"].fmt is MXFP4


@pytest.mark.parametrize("lead", [(), (E,)])
def test_modelopt_nvfp4(lead):
    spec = find_scale_planes(modelopt("m.down_proj", lead))["m.down_proj.weight_scale"]
    assert spec.values_name == "m.down_proj.weight"
    assert spec.global_scale_name == "m.down_proj.weight_scale_2"
    assert spec.fmt is NVFP4 and spec.convention == "modelopt"


def test_compressed_tensors_nvfp4_and_mxfp4():
    specs = find_scale_planes({**ct_nvfp4("a"), **ct_mxfp4("b")})
    assert specs["a.weight_scale"].fmt is NVFP4
    assert specs["a.weight_scale"].values_name == "a.weight_packed"
    assert specs["a.weight_scale"].global_scale_name == "a.weight_global_scale"
    assert specs["b.weight_scale"].fmt is MXFP4
    assert specs["b.weight_scale"].global_scale_name is None
    assert specs["b.weight_scale"].convention == "compressed-tensors"


def test_torch_tensors_are_accepted_as_records():
    ts = {
        "x.weight": torch.zeros(N, K // 2, dtype=torch.uint8),
        "x.weight_scale": torch.zeros(N, K // 16, dtype=torch.float8_e4m3fn),
        "x.weight_scale_2": torch.tensor(1.0),
    }
    assert match_scale_plane("x.weight_scale", ts).fmt is NVFP4


def test_mixed_checkpoint_finds_every_plane_and_nothing_else():
    ts = {**gpt_oss("g"), **modelopt("m"), **ct_nvfp4("c"), **ct_mxfp4("d"), "lm_head.weight": _t("BF16", 10, 4)}
    assert sorted(find_scale_planes(ts)) == ["c.weight_scale", "d.weight_scale", "g_scales", "m.weight_scale"]


NEAR_MISSES = {
    # names that look right but whose partner is missing
    "scales without blocks": {"p_scales": _t("U8", E, N, 4)},
    "blocks suffix typo": {"p_block": _t("U8", E, N, 4, 16), "p_scales": _t("U8", E, N, 4)},
    "scale not scales": {"p_blocks": _t("U8", E, N, 4, 16), "p_scale": _t("U8", E, N, 4)},
    "modelopt without weight": {"p.weight_scale": _t("F8_E4M3", N, 8), "p.weight_scale_2": _t("F32")},
    "modelopt without global scale": {"p.weight": _t("U8", N, 64), "p.weight_scale": _t("F8_E4M3", N, 8)},
    "ct nvfp4 without global scale": {"p.weight_packed": _t("U8", N, 64), "p.weight_scale": _t("F8_E4M3", N, 8)},
    "weight_scale_inv (DeepSeek FP8)": {"p.weight": _t("F8_E4M3", N, K), "p.weight_scale_inv": _t("F32", 1, 1)},
    "weight_scale suffix extended": {
        "p.weight": _t("U8", N, 64),
        "p.weight_scale_3": _t("F8_E4M3", N, 8),
        "p.weight_scale_2": _t("F32"),
    },
    # right names, dtypes of other quantization schemes
    "modelopt FP8 per-tensor": {
        "p.weight": _t("F8_E4M3", N, K),
        "p.weight_scale": _t("F32"),
        "p.input_scale": _t("F32"),
    },
    "ct int4 w4a16": {
        "p.weight_packed": _t("I32", N, K // 8),
        "p.weight_scale": _t("BF16", N, K // 128),
        "p.weight_shape": _t("I64", 2),
    },
    "ct fp8 block": {"p.weight": _t("F8_E4M3", N, K), "p.weight_scale": _t("BF16", 1, 1)},
    "modelopt uint8 scales": {
        "p.weight": _t("U8", N, 64),
        "p.weight_scale": _t("U8", N, 4),
        "p.weight_scale_2": _t("F32"),
    },
    "gpt-oss blocks not uint8": {"p_blocks": _t("BF16", E, N, 4, 16), "p_scales": _t("U8", E, N, 4)},
    "gpt-oss bf16 scales": {"p_blocks": _t("U8", E, N, 4, 16), "p_scales": _t("BF16", E, N, 4)},
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_misses_pass_through(case):
    assert find_scale_planes(NEAR_MISSES[case]) == {}


MISFITS = {
    "gpt-oss rows differ": {"p_blocks": _t("U8", E, N, 4, 16), "p_scales": _t("U8", E, N + 1, 4)},
    "gpt-oss columns differ": {"p_blocks": _t("U8", E, N, 4, 16), "p_scales": _t("U8", E, N, 8)},
    "gpt-oss block not 16 bytes": {"p_blocks": _t("U8", E, N, 4, 8), "p_scales": _t("U8", E, N, 4)},
    "modelopt columns do not divide K": {
        "p.weight": _t("U8", N, 64),
        "p.weight_scale": _t("F8_E4M3", N, 7),
        "p.weight_scale_2": _t("F32"),
    },
    "modelopt e4m3 every 32": {
        "p.weight": _t("U8", N, 64),
        "p.weight_scale": _t("F8_E4M3", N, 4),
        "p.weight_scale_2": _t("F32"),
    },
    "modelopt leading dims differ": {
        "p.weight": _t("U8", 2, N, 64),
        "p.weight_scale": _t("F8_E4M3", 3, N, 8),
        "p.weight_scale_2": _t("F32"),
    },
    "ct mxfp4 every 16": {"p.weight_packed": _t("U8", N, 64), "p.weight_scale": _t("U8", N, 8)},
}


@pytest.mark.parametrize("case", sorted(MISFITS))
def test_contradictory_pairs_are_refused(case):
    ts = MISFITS[case]
    scale = next(n for n in ts if n.endswith(("_scales", ".weight_scale")))
    with pytest.raises(ShapeMismatchError) as err:
        find_scale_planes(ts)
    assert err.value.tensor == scale
