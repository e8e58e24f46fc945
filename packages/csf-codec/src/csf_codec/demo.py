"""End-to-end demo: synthetic FP4 MoE checkpoints -> CSF -> verify -> native again, with sizes.

``python -m csf_codec.demo [--workdir D] [--small]`` builds two Hugging Face style sharded checkpoints of one MoE
layer at the DeepSeek-V4.1-Flash TP4 shape (384 experts, hidden 5120, 576 intermediate rows per rank): an MXFP4
one with gpt-oss naming and an NVFP4 one with NVIDIA ModelOpt naming. Values and scales come from
:mod:`csf_codec.synthetic` (random FP4 values; scale planes with realistic statistics), so the printed ratios
say how the codec does on planes shaped like real ones, not on a real model. Each checkpoint is compressed,
verified against its native original, decompressed, and checked tensor by tensor by sha256.

Shards are cut greedily at ~1 GiB (scaled down with ``--small``), which puts the W13 values and their scales in
different shards: scale/values pairing has to work across shards, as it must on real checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import compress_checkpoint, decompress_checkpoint, tensor_sha256, verify_checkpoint
from .formats import MXFP4, NVFP4, ScaleFormat
from .safetensors_io import DTYPE_SIZES, TensorEntry, write_safetensors
from .synthetic import NVFP4_TYPICAL, SEED_REGIME, synthetic_fp4_values, synthetic_scale_plane
from .units import human_bytes

__all__ = ["DEEPSEEK_V41_FLASH_TP4", "MoELayerShape", "build_checkpoint", "main", "run_demo"]

_GiB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class MoELayerShape:
    """One MoE layer as one tensor-parallel rank holds it: W13 is [E, 2N, H], W2 is [E, H, N] (unpacked)."""

    experts: int
    hidden: int
    inter: int  # N: intermediate rows per rank

    def shrunk(self, experts: int) -> MoELayerShape:
        return MoELayerShape(experts=experts, hidden=self.hidden, inter=self.inter)


DEEPSEEK_V41_FLASH_TP4 = MoELayerShape(experts=384, hidden=5120, inter=576)


@dataclass(frozen=True, kw_only=True)
class _Spec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    make: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


def _bf16(shape: tuple[int, ...], seed: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _positive_f32(shape: tuple[int, ...], seed: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 1e-3 + 1e-4


def _packed_values(shape: tuple[int, ...], seed: int) -> Callable[[], torch.Tensor]:
    """Packed FP4 values (two E2M1 codes a byte) in the checkpoint's layout."""
    return lambda: synthetic_fp4_values(shape, seed=seed)


def _scales(shape: tuple[int, ...], fmt: ScaleFormat, seed: int) -> Callable[[], torch.Tensor]:
    preset = NVFP4_TYPICAL if fmt is NVFP4 else SEED_REGIME

    def make() -> torch.Tensor:
        plane = synthetic_scale_plane(shape, fmt, stats=preset, seed=seed)
        return plane.view(torch.float8_e4m3fn) if fmt is NVFP4 else plane

    return make


def _layer_tensors(fmt: ScaleFormat, s: MoELayerShape, seed: int) -> list[_Spec]:
    e, h, n = s.experts, s.hidden, s.inter
    p = "model.layers.0"
    common_head = [
        _Spec(name=f"{p}.mlp.gate.weight", dtype="BF16", shape=(e, h), make=_bf16((e, h), seed)),
        _Spec(name=f"{p}.mlp.gate.e_score_correction_bias", dtype="F32", shape=(e,), make=_positive_f32((e,), seed)),
    ]
    tail = [_Spec(name=f"{p}.post_attention_layernorm.weight", dtype="BF16", shape=(h,), make=_bf16((h,), seed + 9))]
    if fmt is MXFP4:  # gpt-oss naming: <p>_blocks [E, N, K/32, 16] + <p>_scales [E, N, K/32]
        x = f"{p}.mlp.experts"
        w13v, w13s = (e, 2 * n, h // 32, 16), (e, 2 * n, h // 32)
        w2v, w2s = (e, h, n // 32, 16), (e, h, n // 32)
        body = [
            _Spec(name=f"{x}.gate_up_proj_blocks", dtype="U8", shape=w13v, make=_packed_values(w13v, seed + 1)),
            _Spec(name=f"{x}.gate_up_proj_scales", dtype="U8", shape=w13s, make=_scales(w13s, fmt, seed + 2)),
            _Spec(name=f"{x}.gate_up_proj_bias", dtype="BF16", shape=(e, 2 * n), make=_bf16((e, 2 * n), seed + 3)),
            _Spec(name=f"{x}.down_proj_blocks", dtype="U8", shape=w2v, make=_packed_values(w2v, seed + 4)),
            _Spec(name=f"{x}.down_proj_scales", dtype="U8", shape=w2s, make=_scales(w2s, fmt, seed + 5)),
            _Spec(name=f"{x}.down_proj_bias", dtype="BF16", shape=(e, h), make=_bf16((e, h), seed + 6)),
        ]
    else:  # ModelOpt naming: <p>.weight [.., N, K/2], <p>.weight_scale [.., N, K/16], <p>.weight_scale_2
        body = []
        for k, (rows, cols) in enumerate((("w13", (2 * n, h)), ("w2", (h, n)))):
            x = f"{p}.mlp.experts.{rows}"
            r, c = cols
            body += [
                _Spec(
                    name=f"{x}.weight",
                    dtype="U8",
                    shape=(e, r, c // 2),
                    make=_packed_values((e, r, c // 2), seed + 10 * k),
                ),
                _Spec(
                    name=f"{x}.weight_scale",
                    dtype="F8_E4M3",
                    shape=(e, r, c // 16),
                    make=_scales((e, r, c // 16), fmt, seed + 10 * k + 1),
                ),
                _Spec(name=f"{x}.weight_scale_2", dtype="F32", shape=(e,), make=_positive_f32((e,), seed + 10 * k + 2)),
                _Spec(name=f"{x}.input_scale", dtype="F32", shape=(e,), make=_positive_f32((e,), seed + 10 * k + 3)),
            ]
    return common_head + body + tail


def _config(fmt: ScaleFormat, s: MoELayerShape) -> dict[str, object]:
    quant: dict[str, object]
    if fmt is MXFP4:
        quant = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    else:
        quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    return {
        "_comment": "csf demo: one synthetic MoE layer at the DeepSeek-V4.1-Flash TP4 shape, not a real model",
        "model_type": "csf_demo_moe",
        "num_hidden_layers": 1,
        "hidden_size": s.hidden,
        "moe_intermediate_size": s.inter,
        "n_routed_experts": s.experts,
        "torch_dtype": "bfloat16",
        "quantization_config": quant,
    }


def build_checkpoint(
    root: str | Path,
    fmt: ScaleFormat,
    shape: MoELayerShape = DEEPSEEK_V41_FLASH_TP4,
    *,
    seed: int = 0,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a sharded HF checkpoint (index, config.json, tokenizer stubs) of one synthetic MoE layer.

    Tensors are generated only when their shard is written, so memory stays at one tensor.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    specs = _layer_tensors(fmt, shape, seed)
    limit = max_shard_bytes or max(1, _GiB * shape.experts // DEEPSEEK_V41_FLASH_TP4.experts)
    shards: list[list[_Spec]] = [[]]
    for sp in specs:  # greedy, like transformers' max_shard_size
        if shards[-1] and sum(x.nbytes for x in shards[-1]) + sp.nbytes > limit:
            shards.append([])
        shards[-1].append(sp)
    weight_map = {}
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        entries = [TensorEntry(name=sp.name, dtype=sp.dtype, shape=sp.shape, load=sp.make) for sp in group]
        write_safetensors(root / fname, entries, metadata={"format": "pt"})
        weight_map.update({sp.name: fname for sp in group})
    index = {"metadata": {"total_size": sum(sp.nbytes for sp in specs)}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (root / "config.json").write_text(json.dumps(_config(fmt, shape), indent=2) + "\n")
    (root / "generation_config.json").write_text(json.dumps({"do_sample": False}, indent=2) + "\n")
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}, indent=2) + "\n")
    return root


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    fmt: str
    native_scale_bytes: int
    compact_scale_bytes: int
    native_total_bytes: int
    csf_total_bytes: int
    identical: bool


def run_demo(
    workdir: str | Path,
    shape: MoELayerShape = DEEPSEEK_V41_FLASH_TP4,
    *,
    progress: bool = True,
    out: Callable[[str], None] = print,
) -> list[DemoResult]:
    """Build, compress, verify, decompress and compare both checkpoints under ``workdir``."""
    workdir = Path(workdir)
    results = []
    for fmt in (MXFP4, NVFP4):
        t0 = time.perf_counter()
        native = build_checkpoint(workdir / f"{fmt.name}-native", fmt, shape)
        t1 = time.perf_counter()
        summary = compress_checkpoint(native, workdir / f"{fmt.name}-csf", progress=progress, overwrite=True)
        t2 = time.perf_counter()
        checked = verify_checkpoint(summary.dst, against=native, progress=progress)
        t3 = time.perf_counter()
        restored = decompress_checkpoint(
            summary.dst, workdir / f"{fmt.name}-restored", progress=progress, overwrite=True
        )
        identical = tensor_sha256(native) == tensor_sha256(restored.dst)
        t4 = time.perf_counter()

        out(f"\n== {fmt.name.upper()} ({'gpt-oss' if fmt is MXFP4 else 'ModelOpt'} naming), E={shape.experts} ==")
        out(f"{'tensor':<52} {'shape':<20} {'native':>11} {'CSF':>11} {'ratio':>7}")
        for t in summary.tensors:
            shp = "x".join(map(str, t.shape))
            out(
                f"{t.name:<52} {shp:<20} {human_bytes(t.native_bytes):>11} "
                f"{human_bytes(t.compact_bytes):>11} {t.ratio:>6.2f}x"
            )
        out(
            f"{'scales total':<73} {human_bytes(summary.native_scale_bytes):>11} "
            f"{human_bytes(summary.compact_scale_bytes):>11} {summary.scale_ratio:>6.2f}x"
        )
        total_ratio = summary.native_total_bytes / summary.csf_total_bytes
        out(
            f"{'checkpoint total (values, scales, rest)':<73} {human_bytes(summary.native_total_bytes):>11} "
            f"{human_bytes(summary.csf_total_bytes):>11} {total_ratio:>6.3f}x"
        )
        out(
            f"verify: {checked.tensors} CSF tensors decoded, {checked.compared_tensors} tensors byte-equal to native; "
            f"decompressed sha256 per tensor {'IDENTICAL' if identical else 'DIFFERENT'}"
        )
        out(
            f"time: build {t1 - t0:.1f}s, compress {t2 - t1:.1f}s, verify {t3 - t2:.1f}s, decompress+sha {t4 - t3:.1f}s"
        )
        results.append(
            DemoResult(
                fmt=fmt.name,
                native_scale_bytes=summary.native_scale_bytes,
                compact_scale_bytes=summary.compact_scale_bytes,
                native_total_bytes=summary.native_total_bytes,
                csf_total_bytes=summary.csf_total_bytes,
                identical=identical,
            )
        )
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csf_codec.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, help="where to write the checkpoints (kept); default: a temp dir, removed")
    ap.add_argument("--small", action="store_true", help="8 experts instead of 384 (for tests)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    shape = DEEPSEEK_V41_FLASH_TP4.shrunk(8) if args.small else DEEPSEEK_V41_FLASH_TP4
    if args.workdir is not None:
        results = run_demo(args.workdir, shape, progress=not args.no_progress)
    else:
        with tempfile.TemporaryDirectory(prefix="csf-demo-") as tmp:
            results = run_demo(tmp, shape, progress=not args.no_progress)
    return 0 if all(r.identical for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
