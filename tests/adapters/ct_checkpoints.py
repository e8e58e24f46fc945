"""compressed-tensors NVFP4 MoE tensors for the adapter tests: the config, and loading through the
engine's weight_loader under compressed-tensors names (shared by the vLLM and SGLang tests)."""

from __future__ import annotations

import torch

from csf_codec import NVFP4
from csf_codec.synthetic import synthetic_fp4_values, synthetic_scale_plane

__all__ = ["CT_NV_CONFIG", "ct_native", "load_ct"]

CT_NV_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "config_groups": {
        "group_0": {
            "format": "nvfp4-pack-quantized",
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group"},
            "input_activations": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": "local"},
        }
    },
}


def ct_native(experts: int, hidden: int, inter: int, seed: int = 0) -> dict[str, list[torch.Tensor]]:
    """Unsharded per-expert tensors under their compressed-tensors suffixes; global scales are stored as
    1 / scale (a power of two here, so the inverse is exact)."""
    out: dict[str, list[torch.Tensor]] = {}
    for k, (proj, rows, cols) in enumerate((("gate", inter, hidden), ("up", inter, hidden), ("down", hidden, inter))):
        s = seed + 100 * k
        out[f"{proj}.weight_packed"] = [synthetic_fp4_values((rows, cols // 2), seed=s + e) for e in range(experts)]
        out[f"{proj}.weight_scale"] = [
            synthetic_scale_plane((rows, cols // 16), NVFP4, seed=s + 50 + e).view(torch.float8_e4m3fn)
            for e in range(experts)
        ]
        out[f"{proj}.weight_global_scale"] = [torch.tensor(2.0 ** (7 + e)) for e in range(experts)]
        out[f"{proj}.input_global_scale"] = [torch.tensor(2.0 ** (3 + e)) for e in range(experts)]
    return out


def load_ct(layer, native, experts: int, prefix: str, shard_arg: bool = True) -> None:
    """As a model's load_weights does: one weight_loader call per expert, projection and tensor."""
    for e in range(experts):
        for shard, proj in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            stem = "w2" if shard == "w2" else "w13"
            for suffix in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
                param = getattr(layer, f"{stem}_{suffix}")
                tensor = native[f"{proj}.{suffix}"][e]
                param.weight_loader(param, tensor, f"{prefix}.{stem}_{suffix}", shard_id=shard, expert_id=e)
