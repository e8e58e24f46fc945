"""The sparse-MLA decode program family: its kernels, head blocking and the specs the catalog needs.

Heads, top-k width, rows and splits are runtime arguments; a program is fixed by its head block, the
partials' dtype and (merge) the optional attention sink and log-sum-exp output. Nothing here imports
triton.
"""

from __future__ import annotations

from .programs import ProgramSpec, TritonFamily

__all__ = [
    "MLA_DECODE",
    "MLA_MERGE",
    "PARTIAL_DTYPES",
    "QUERY_MODES",
    "decode_spec",
    "head_block",
    "merge_spec",
    "sparse_mla_specs",
]

MLA_DECODE = TritonFamily(
    kernel="mla.sparse_decode", version=1, module="csf_kernels.kernels.mla_decode", function="mla_decode", num_warps=8
)
MLA_MERGE = TritonFamily(
    kernel="mla.merge", version=1, module="csf_kernels.kernels.mla_merge", function="mla_merge", num_warps=4
)
PARTIAL_DTYPES = ("float32", "bfloat16")


def head_block(heads: int) -> int:
    """Heads per decode program. 16, the smallest MMA tile, for every head count for now: 32 spills
    registers in the first version of the kernel (255 registers at 16)."""
    if heads <= 0 or heads % 16:
        raise ValueError(f"sparse MLA decode needs a positive multiple of 16 heads per rank, got {heads}")
    return 16


QUERY_MODES = {"bf16": 0, "bf16_quantized": 1, "packed": 2}  # see kernels/mla_decode.py


def decode_spec(bh: int, partial_dtype: str = "float32", query: str = "bf16") -> ProgramSpec:
    if partial_dtype not in PARTIAL_DTYPES:
        raise ValueError(f"partial_dtype must be one of {PARTIAL_DTYPES}, got {partial_dtype!r}")
    if query not in QUERY_MODES:
        raise ValueError(f"query must be one of {tuple(QUERY_MODES)}, got {query!r}")
    return ProgramSpec.of(
        MLA_DECODE.kernel,
        MLA_DECODE.version,
        BH=bh,
        PARTIAL_BF16=int(partial_dtype == "bfloat16"),
        Q_MODE=QUERY_MODES[query],
        num_warps=MLA_DECODE.num_warps,
    )


def merge_spec(partial_dtype: str = "float32", *, sink: bool = False, lse: bool = False) -> ProgramSpec:
    if partial_dtype not in PARTIAL_DTYPES:
        raise ValueError(f"partial_dtype must be one of {PARTIAL_DTYPES}, got {partial_dtype!r}")
    return ProgramSpec.of(
        MLA_MERGE.kernel,
        MLA_MERGE.version,
        PARTIAL_BF16=int(partial_dtype == "bfloat16"),
        HAS_SINK=int(sink),
        WRITE_LSE=int(lse),
        num_warps=MLA_MERGE.num_warps,
    )


def sparse_mla_specs(sparse_mla: dict) -> list[ProgramSpec]:
    """Every program the catalog's sparse-MLA entry needs: each head block's decode program for every
    query form, and every merge variant, for both partial dtypes."""
    specs = []
    for dtype in PARTIAL_DTYPES:
        for bh in sorted({head_block(h) for h in sparse_mla.get("heads", ())}):
            specs += [decode_spec(bh, dtype, query) for query in QUERY_MODES]
        if sparse_mla.get("heads"):
            specs += [merge_spec(dtype, sink=s, lse=w) for s in (False, True) for w in (False, True)]
    return specs
