"""Tiny per-expert checkpoints and quantization configs for the adapter tests (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from csf_codec import CSF_FORMAT_VERSION, NVFP4
from csf_codec.checkpoint import compress_checkpoint
from csf_codec.synthetic import synthetic_fp4_values, synthetic_scale_plane

PREFIX = "model.layers.0.mlp.experts"
NV_QUANT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
# the quantization_config of a checkpoint written by `csf compress`, from an MXFP4 and a ModelOpt NVFP4 one
MX_CONFIG = {
    "quant_method": "mxfp4",
    "csf": {"format_version": CSF_FORMAT_VERSION, "scale_format": "mxfp4", "tensors": 2},
}
NV_CONFIG = NV_QUANT | {"csf": {"format_version": CSF_FORMAT_VERSION, "scale_format": "nvfp4", "tensors": 6}}


def expert_tensors(*, experts: int, hidden: int, inter: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4 naming, one tensor per expert and projection (as DeepSeek / Qwen MoE exports are)."""
    out: dict[str, torch.Tensor] = {}
    for e in range(experts):
        global_scale = torch.tensor(2.0**-8 * (e + 1), dtype=torch.float32)  # gate and up share it, as in ModelOpt
        for k, (proj, rows, cols) in enumerate((("gate_proj", inter, hidden), ("up_proj", inter, hidden),
                                                ("down_proj", hidden, inter))):  # fmt: skip
            p, s = f"{PREFIX}.{e}.{proj}", seed + 10 * e + 3 * k
            out[p + ".weight"] = synthetic_fp4_values((rows, cols // 2), seed=s)
            plane = synthetic_scale_plane((rows, cols // NVFP4.block_size), NVFP4, seed=s + 1)
            out[p + ".weight_scale"] = plane.view(torch.float8_e4m3fn)
            out[p + ".weight_scale_2"] = global_scale.clone() if proj != "down_proj" else global_scale * 3
            out[p + ".input_scale"] = torch.tensor(1.0, dtype=torch.float32)
    out["model.layers.0.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    return out


def write_checkpoint(root: Path, tensors: dict[str, torch.Tensor], quant: dict[str, object]) -> Path:
    """Two shards with an index, and config.json, as an HF checkpoint directory."""
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, part in shards.items():
        save_file({n: tensors[n].contiguous() for n in part}, root / fname, metadata={"format": "pt"})
    weight_map = {n: f for f, part in shards.items() for n in part}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "config.json").write_text(json.dumps({"model_type": "csf_test_moe", "quantization_config": quant}))
    return root


def nv_csf_pair(root: Path, *, experts: int, hidden: int, inter: int) -> tuple[Path, Path]:
    """A ModelOpt NVFP4 checkpoint of :func:`expert_tensors` under ``root / "native"`` and what ``csf compress``
    makes of it under ``root / "csf"`` (scale planes stored as CSF payloads)."""
    native = write_checkpoint(root / "native", expert_tensors(experts=experts, hidden=hidden, inter=inter), NV_QUANT)
    return native, compress_checkpoint(native, root / "csf", progress=False).dst


def shard_files(root: Path) -> list[str]:
    """A checkpoint directory's safetensors shards, as a loader lists them."""
    return sorted(str(p) for p in root.glob("*.safetensors"))
