"""Small checkpoints for the transaction, error and fuzz tests (ModelOpt NVFP4 naming, one expert per plane)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from csf_codec.formats import NVFP4
from csf_codec.synthetic import synthetic_fp4_values, synthetic_scale_plane


def nvfp4_tensors(experts: int = 2, *, seed: int = 0, rows: int = 64) -> dict[str, torch.Tensor]:
    ts: dict[str, torch.Tensor] = {}
    for e in range(experts):
        p = f"model.layers.0.mlp.experts.{e}.down_proj"
        ts[f"{p}.weight"] = synthetic_fp4_values((rows, 64), seed=seed + e)
        ts[f"{p}.weight_scale"] = synthetic_scale_plane((rows, 8), NVFP4, seed=seed + e).view(torch.float8_e4m3fn)
        ts[f"{p}.weight_scale_2"] = torch.tensor(0.001 * (e + 1))
    ts["model.embed_tokens.weight"] = torch.randn(10, 8, generator=torch.Generator().manual_seed(seed)).bfloat16()
    return ts


def sharded_checkpoint(root: Path, experts: int = 2, *, seed: int = 0) -> Path:
    """One shard per expert plus one for the rest, with an index and a config."""
    root.mkdir(parents=True)
    ts = nvfp4_tensors(experts, seed=seed)
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in ts.items():
        n = next((e for e in range(experts) if f".experts.{e}." in name), experts)
        shards.setdefault(f"model-{n + 1:05d}-of-{experts + 1:05d}.safetensors", {})[name] = t
    weight_map = {}
    for shard, part in shards.items():
        save_file(part, root / shard, metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    total = sum(t.numel() * t.element_size() for t in ts.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps({"model_type": "toy", "quantization_config": {"quant_method": "x"}}))
    return root


def file_hashes(root: Path) -> dict[str, str]:
    """Every file under ``root`` by relative path, with its SHA-256 (independent of the code under test)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
