"""Ahead-of-time build of CuTe DSL programs into small shared objects (build time: imports cutlass).

:func:`build_cute_program` compiles one :class:`CuteProgram` (the stage decoder of
:mod:`~csf_kernels.record.cute_stage_decoder` for one record size, or the row expander of
:mod:`~csf_kernels.expand.kernels.cute_row_expander` for one column-group size) on fake tensors (no GPU, no driver
needed), for ``sm_90a`` SASS only (no PTX is embedded, so the driver never JIT-compiles), exports it with
``export_to_c`` (a C header plus an x86-64 object holding the cubin in a fatbin and the host launch code) and
links ``lib<name>.so``::

    gcc -shared -o lib<name>.so <name>.o \\
        <wheel>/nvidia_cutlass_dsl/cu<N>/lib/libcuda_dialect_runtime_static.a \\
        $CUDA_HOME/lib64/libcudart_static.a -ldl -lrt -lpthread \\
        -Wl,--build-id=none -Wl,--exclude-libs,ALL -Wl,-soname,lib<name>.so -Wl,--no-undefined \\
        -Wl,-z,noexecstack -Wl,--gc-sections -s

run in the build directory with relative object names, ``LC_ALL=C`` and ``SOURCE_DATE_EPOCH=0``. The result
needs only ``libc.so.6`` (glibc >= 2.34, where libdl/libpthread/librt live in libc) and the CUDA driver, which the
static CUDA runtime ``dlopen``s (``libcuda.so.1``); no libcudart.so, no cutlass, no Python. Building twice gives
byte-identical files: the DSL output carries no paths or timestamps, and the link drops the build id.

Files written to ``out_dir`` (``<name>``, e.g. ``csf_stage_decoder_s<S>``): ``lib<name>.so``, ``<name>.h`` (the
generated header: argument structs and the packed entry point), ``<name>.cubin`` (the SASS, for inspection) and
``<name>.json`` (the launch metadata :mod:`csf_kernels.runtime.cute_so` reads).

Licences of what goes into the shared object (checked for nvidia-cutlass-dsl 4.8.1 and CUDA 13.0):

* ``libcuda_dialect_runtime_static.a`` (the CuTe DSL host runtime shims: ``_cudaLibraryLoadData``,
  ``_cudaLaunchKernelEx``, ...) ships in the ``nvidia-cutlass-dsl-libs-cu12`` / ``-cu13`` wheel under the
  *NVIDIA Software License Agreement*, file ``nvidia_cutlass_dsl_libs_cu12-4.8.1.dist-info/licenses/LICENSE``
  (the same text as the other nvidia-cutlass-dsl wheels' ``LICENSE``). Its section 1.1 grants distribution of
  the package's Python files in source form only, and 1.1(d)(iv) says a developer tool not identified as
  distributable is for internal use only; it names no binary as distributable. Until NVIDIA says otherwise, treat
  the linked objects as internal-use builds (fine for our own serving machines; ask before shipping them to
  third parties).
* ``libcudart_static.a`` is listed as distributable in Attachment A of the CUDA EULA,
  ``$CUDA_HOME/dist-info/nvidia_cuda_runtime-13.0.96.dist-info/licenses/License.txt``.
* The exported object (host launch code and cubin) is the DSL compiler's output from our kernel source.

Run ``python packages/csf-kernels/tools/build_stage_decoder_demo.py OUT_DIR`` for an example.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ARCH",
    "MXFP4_RECORD_BYTES",
    "NVFP4_RECORD_BYTES",
    "CuteProgram",
    "build_cute_program",
    "build_row_expander",
    "build_stage_decoder",
    "build_stage_decoders",
    "engine_gemm_name",
    "engine_gemm_program",
    "find_cuobjdump",
    "parse_header",
    "row_block_expander_name",
    "row_block_expander_program",
    "row_expander_name",
    "row_expander_program",
    "sass_facts",
    "stage_decoder_name",
    "stage_decoder_program",
    "w4a8_gemm_name",
    "w4a8_gemm_program",
]

ARCH = "sm_90a"
MXFP4_RECORD_BYTES = (80, 96, 112, 128, 144, 160, 192, 224)
NVFP4_RECORD_BYTES = (272, 288, 304, 320, 336, 352)
METADATA_VERSION = 1

_ALIGN = 16


@dataclass(frozen=True)
class CuteProgram:
    """One CuTe DSL program to build: its jit object's factory and the compiled function's arguments.

    ``tensors``: (name, dtype, shape) in argument order; a string extent is dynamic (one runtime int32), and
    ``divisible`` says which of those the kernel may assume are multiples of some number (the runtime checks
    it). Then the int32 ``scalars``, then the stream. Every tensor is compact row-major and 16-byte aligned.
    ``launch``: the launch shape for the metadata (grid entries: ints, extent or scalar names, or lists of
    names to multiply); ``facts``: what else the metadata records (record size, delta bits, ...).
    """

    name: str
    program: str
    factory: Callable[[], object]
    tensors: tuple[tuple[str, str, tuple], ...]
    scalars: tuple[str, ...] = ()
    divisible: tuple[tuple[str, int], ...] = ()
    launch: tuple[tuple[str, object], ...] = ()
    facts: tuple[tuple[str, object], ...] = ()

    def tensor_specs(self) -> list[dict]:
        """Per tensor argument: shape (ints, or names of dynamic extents) and which dims carry runtime values."""
        divisible = dict(self.divisible)
        specs = []
        for name, dtype, shape in self.tensors:
            dynamic = [i for i, d in enumerate(shape) if isinstance(d, str)]
            # compact row-major: dim i's stride is the product of the later extents, dynamic if one of them is
            dyn_strides = [i for i in range(len(shape)) if any(isinstance(d, str) for d in shape[i + 1 :])]
            specs.append(
                {
                    "name": name,
                    "kind": "tensor",
                    "dtype": dtype,
                    "shape": list(shape),
                    "dynamic_shape_dims": dynamic,
                    "dynamic_stride_dims": dyn_strides,
                    "divisible": {d: divisible[d] for d in shape if isinstance(d, str) and d in divisible},
                    "align": _ALIGN,
                    "contiguous": True,
                }
            )
        return specs


def stage_decoder_name(record_bytes: int, delta_bits: int = 4) -> str:
    """File stem and C symbol prefix of the program for one record size (and base-delta width, 4 or 8 bits)."""
    return f"csf_stage_decoder_s{int(record_bytes)}" + ("" if delta_bits == 4 else f"_d{int(delta_bits)}")


def stage_decoder_program(record_bytes: int, delta_bits: int = 4) -> CuteProgram:
    from csf_kernels.record.cute_stage_decoder import DELTA_BITS, THREADS, InlineStageDecoder, check_record_bytes

    s = check_record_bytes(record_bytes)
    if delta_bits not in DELTA_BITS:
        raise ValueError(f"base deltas are {DELTA_BITS} bits wide; got {delta_bits}")
    return CuteProgram(
        name=stage_decoder_name(s, delta_bits),
        program="inline_stage_decoder",
        factory=lambda: InlineStageDecoder(s, delta_bits),
        tensors=(
            ("base_ref", "uint8", ("RB",)),
            ("base_delta", "uint8", ("RB", 16 * delta_bits)),  # 64 bytes (4-bit deltas) or 128 (8-bit)
            ("records", "uint8", ("RB", "CTF", s)),
            ("raw", "uint8", ("NRAW", 512)),
            ("out", "uint32", ("RB", "CTF", 128, 4)),
        ),
        launch=(("grid", ("RB", 1, 1)), ("block", (THREADS, 1, 1)), ("dynamic_shared_bytes", 2 * s)),
        facts=(("record_bytes", s), ("delta_bits", delta_bits)),
    )


def _expander_tensors(delta_bits: int) -> tuple[tuple[str, str, tuple], ...]:
    """The tensor arguments both expanders of whole planes take (row images and row blocks): the inline CSF
    arrays as flat words, the plane's bytes as words, the routed expert ids."""
    return (
        ("base_ref", "uint8", ("RB",)),
        ("base_delta", "uint8", ("RB", 16 * delta_bits)),
        ("records", "uint32", ("NR",)),
        ("tail", "uint32", ("NT",)),
        ("raw", "uint32", ("NRAW", 128)),
        ("tail_raw", "uint8", ("NTR",)),
        ("out", "uint32", ("NO",)),
        ("expert_ids", "int32", ("NE",)),
    )


def row_expander_name(group_tiles: int, delta_bits: int, store: int) -> str:
    return f"csf_row_expander_g{int(group_tiles)}_d{int(delta_bits)}_w{int(store)}"


ROW_EXPANDER_SCALARS = (
    "blocks_per_expert",
    "blocks_per_group",
    "row_group",
    "rows_per_expert",
    "cols",
    "full_tiles",
    "record_words",
    "tail_words",
    "num_experts",
    "groups",
    "flat",
    "blocks_per_cta",
    "block_runs",
)


def row_expander_program(
    group_tiles: int, delta_bits: int, max_record_bytes: int, max_tail_bytes: int, store: int
) -> CuteProgram:
    """The row expander for ``group_tiles`` full tiles per column group: CTA-wide (32), or one warp per row
    block for narrow planes (8, :mod:`~csf_kernels.expand.kernels.cute_narrow_row_expander`)."""
    from csf_kernels.expand.kernels.cute_narrow_row_expander import NARROW_GROUP_TILES, NarrowRowExpander
    from csf_kernels.expand.kernels.cute_row_expander import THREADS, InlineRowExpander, image_bytes, record_stage_bytes

    if group_tiles == NARROW_GROUP_TILES:
        kernel = NarrowRowExpander(delta_bits, max_record_bytes, max_tail_bytes, store)  # validates

        def factory():
            return NarrowRowExpander(delta_bits, max_record_bytes, max_tail_bytes, store)

        smem, program = kernel.shared_bytes(), "narrow_row_expander"
    else:
        InlineRowExpander(group_tiles, delta_bits, max_record_bytes, max_tail_bytes, store)  # validates

        def factory():
            return InlineRowExpander(group_tiles, delta_bits, max_record_bytes, max_tail_bytes, store)

        smem = image_bytes(group_tiles) + record_stage_bytes(group_tiles, max_record_bytes, max_tail_bytes)
        program = "inline_row_expander"
    return CuteProgram(
        name=row_expander_name(group_tiles, delta_bits, store),
        program=program,
        factory=factory,
        tensors=_expander_tensors(delta_bits),
        scalars=ROW_EXPANDER_SCALARS,
        divisible=(("NR", 4), ("NT", 4), ("NO", 4)),  # 16-byte chunks
        launch=(
            ("grid", ("block_runs", "groups", "NE")),
            ("block", (THREADS, 1, 1)),
            ("dynamic_shared_bytes", smem),
        ),
        facts=(
            ("group_tiles", group_tiles),
            ("delta_bits", delta_bits),
            ("max_record_bytes", max_record_bytes),
            ("max_tail_bytes", max_tail_bytes),
            ("store", store),
        ),
    )


def row_block_expander_name(cols: int, delta_bits: int) -> str:
    return f"csf_row_block_expander_c{int(cols)}_d{int(delta_bits)}"


ROW_BLOCK_EXPANDER_SCALARS = (
    "blocks_per_expert",
    "blocks_per_group",
    "row_group",
    "rows_per_expert",
    "record_words",
    "tail_words",
    "bpe_magic",
    "bpg_magic",
    "exception_caps",
    "tail_exception_caps",
    "num_experts",
    "ctas",
    "pdl",
)


def row_block_expander_program(cols: int, delta_bits: int, max_record_bytes: int, max_tail_bytes: int) -> CuteProgram:
    """The row-block expander of planes of ``cols`` columns (``expand/kernels/cute_row_block_expander.py``)."""
    from csf_kernels.expand.kernels.cute_row_block_expander import RowBlockExpander

    kernel = RowBlockExpander(cols, delta_bits, max_record_bytes, max_tail_bytes)  # validates

    def factory():
        return RowBlockExpander(cols, delta_bits, max_record_bytes, max_tail_bytes)

    return CuteProgram(
        name=row_block_expander_name(cols, delta_bits),
        program="row_block_expander",
        factory=factory,
        tensors=_expander_tensors(delta_bits),
        scalars=ROW_BLOCK_EXPANDER_SCALARS,
        divisible=(("NR", 4), ("NT", 4), ("NO", 4)),  # 16-byte chunks
        launch=(
            ("grid", ("ctas", 1, 1)),
            ("block", (32 * kernel.warps, 1, 1)),
            ("dynamic_shared_bytes", kernel.shared_bytes()),
        ),
        facts=(
            ("cols", cols),
            ("delta_bits", delta_bits),
            ("max_record_bytes", max_record_bytes),
            ("max_tail_bytes", max_tail_bytes),
            ("warps", kernel.warps),
            ("shared", kernel.shared),
        ),
    )


def engine_gemm_name(
    tile_n: int,
    act: int = 0,
    bias: bool = False,
    fmt: str = "mxfp4",
    scales: str = "native",
    io: str = "dense",
    schedule: str = "slice",
    ragged: int = 0,
    ctas_per_sm: int = 1,
    partial: str | None = None,
    probe: str | None = None,
) -> str:
    return (
        f"csf_engine_gemm_n{int(tile_n)}"
        + (f"_act{int(act)}" if act else "")
        + ("_bias" if bias else "")
        + ("" if fmt == "mxfp4" else f"_{fmt}")
        + ("" if scales == "native" else f"_{scales}")
        + ("" if io == "dense" else f"_{io}")
        + ("" if schedule == "slice" else f"_{schedule}")
        + ("" if not ragged else "_ragged" if int(ragged) == 1 else f"_ragged{int(ragged)}")
        + ("" if ctas_per_sm == 1 else f"_occ{ctas_per_sm}")
        + ("" if partial is None else f"_part{partial}")
        + ("" if probe is None else f"_probe{probe}")
    )


def engine_gemm_program(
    tile_n: int,
    act: int = 0,
    bias: bool = False,
    fmt: str = "mxfp4",
    scales: str = "native",
    io: str = "dense",
    schedule: str = "slice",
    ragged: int = 0,
    ctas_per_sm: int = 1,
    partial: str | None = None,
    probe: str | None = None,
) -> CuteProgram:
    """The engine's grouped FP4 x bf16 GEMM (``moe/kernels/engine_gemm.py``) for ``tile_n`` routes a block of
    ``fmt`` weights, its epilogue storing the GEMM (``act`` 0) or FC1's activation of it (1: SiLU, 2: gpt-oss's
    clamped SwiGLU), its scales from panels (``scales`` native) or engine records decoded by a producer warp
    (inline); ``io``: rows in block order, FC1's input gathered by route or FC2's output scattered to routes; its
    consumers' wgmmas issued a K slice or a stage at a time (``schedule``, ``moe/kernels/engine_mainloop.py``);
    ``ragged``: a block whose live routes (ids in ``[0, pairs)``) lie in its first half runs that half only (1), or
    also its first quarter that quarter (2); ``partial`` (``rows``, ``fc1``): K splits of ``split_steps`` K steps
    storing float32 partials ``out [splits * pairs, R]`` (``moe/kernels/engine_work.py``); ``probe``: a diagnostic
    loop without the conversion (``moe/kernels/engine_mainloop.py``)."""
    from csf_kernels.moe.kernels.engine_gemm import TILE_K, TILE_M, GroupedFp4Gemm

    options = dict(act=act, bias=bias, fmt=fmt, scales=scales, io=io, schedule=schedule, ragged=ragged,
                   ctas_per_sm=ctas_per_sm, partial=partial, probe=probe)  # fmt: skip
    kernel = GroupedFp4Gemm(tile_n, **options)  # validates
    inline = scales == "inline"

    def factory():
        gemm = GroupedFp4Gemm(tile_n, **options)
        return gemm.call_inline if inline else gemm

    if inline:  # the plane's engine records (csf_codec.engine_records), starts in 16-byte units
        scales_args = (
            ("base_ref", "uint8", ("RBR",)),
            ("base_delta", "uint8", ("RBR", 128 if fmt == "nvfp4" else 64)),
            ("block_start", "int32", ("RBR",)),
            ("record_units", "uint8", ("RBR", "CT")),
            ("body", "uint8", ("BODY",)),
        )
    elif fmt == "nvfp4":  # NVFP4's scale panel travels as one uint32 a row (four E4M3 bytes), MXFP4's as two bytes
        scales_args = (("s_panel", "uint32", ("E", "KS", "RW")),)
    else:
        scales_args = (("s_panel", "uint8", ("E", "KS", "R2")),)
    return CuteProgram(
        name=engine_gemm_name(tile_n, act, bias, fmt, scales, io, schedule, ragged, ctas_per_sm, partial, probe),
        program="engine_gemm",
        factory=factory,
        tensors=(
            ("w_panel", "uint64", ("E", "KS", "RB", 256)),
            *scales_args,
            ("x", "bfloat16", ("NX", "K")),  # NX: slots, or tokens where FC1 gathers
            # NO: slots, or routes where FC2 scatters, or splits x routes (partials); RO: R, or R / 2 (activated)
            ("out", "bfloat16" if partial is None else "float32", ("NO", "RO")),
            ("bias", "float32", ("EB", "RBI")),
            ("gscale", "float32", ("EG",)),
            ("block_expert", "int32", ("MB",)),
            ("meta", "int32", ("NM",)),
            ("sorted_ids", "int32", ("NS",)),
            ("wide", "uint8", ("EW", "RBW")),  # MXFP4: 64-row blocks taking two multiplies a pair (1) or one (0)
        ),
        scalars=("ctas", "top_k", "pairs", "split_steps", "pdl"),
        # R: whole row blocks of 64
        divisible=(("K", TILE_K), ("RO", TILE_M // 4), ("R2", TILE_M), ("RW", TILE_M // 2)),
        launch=(("grid", ("ctas", 1, 1)), ("block", (kernel.threads, 1, 1)), ("dynamic_shared_bytes", 0)),
        # ring_shared_bytes: the launch sizes its own dynamic shared memory, so reports take it from here
        facts=(
            ("tile_n", tile_n),
            ("stages", kernel.stages),
            ("act", act),
            ("bias", int(bias)),
            ("fmt", fmt),
            ("scales", scales),
            ("io", io),
            ("schedule", schedule),
            ("ragged", int(ragged)),
            ("ctas_per_sm", ctas_per_sm),
            ("partial", partial or ""),
            ("probe", probe or ""),
            ("wgmmas_in_flight", kernel.step.wgmmas_in_flight()),
            ("ring_shared_bytes", kernel.ring_bytes),
        ),
    )


def w4a8_gemm_name(tile_n: int, act: int = 0, bias: bool = False) -> str:
    return f"csf_w4a8_gemm_n{int(tile_n)}" + (f"_act{int(act)}" if act else "") + ("_bias" if bias else "")


def w4a8_gemm_program(tile_n: int, act: int = 0, bias: bool = False) -> CuteProgram:
    """The engine's grouped W4A8 GEMM (``moe/kernels/engine_gemm_fp8.py``: MXFP4 weights, per-token E4M3
    activations) for ``tile_n`` routes a block, its epilogue storing the GEMM (``act`` 0) or FC1's activation."""
    from csf_kernels.moe.kernels.engine_gemm_fp8 import STAGE_K, TILE_M, GroupedW4A8Gemm

    kernel = GroupedW4A8Gemm(tile_n, act=act, bias=bias)  # validates

    def factory():
        return GroupedW4A8Gemm(tile_n, act=act, bias=bias)

    return CuteProgram(
        name=w4a8_gemm_name(tile_n, act, bias),
        program="w4a8_gemm",
        factory=factory,
        tensors=(
            ("w_panel", "uint64", ("E", "KS", "RB", 256)),
            ("s_panel", "uint8", ("E", "KS", "R2")),
            ("bases", "uint8", ("E", "R")),
            ("flags", "uint8", ("E", "RT")),
            ("x", "uint8", ("NX", "K")),  # E4M3 bytes
            ("xscale", "float32", ("NX",)),
            ("out", "bfloat16", ("NX", "RO")),  # RO: R, or R / 2 where the epilogue activates
            ("bias", "float32", ("EB", "RBI")),
            ("block_expert", "int32", ("MB",)),
            ("meta", "int32", ("NM",)),
        ),
        scalars=("ctas",),
        # K: whole panel steps (TMA zero-fills the last stage's missing half); R: whole row blocks of 64
        divisible=(("K", STAGE_K // 2), ("RO", TILE_M // 4), ("R2", TILE_M), ("R", TILE_M // 2)),
        launch=(("grid", ("ctas", 1, 1)), ("block", (kernel.threads, 1, 1)), ("dynamic_shared_bytes", 0)),
        facts=(
            ("tile_n", tile_n),
            ("stages", kernel.stages),
            ("act", act),
            ("bias", int(bias)),
            ("fmt", "mxfp4"),
            ("activations", "per_token"),
            ("ring_shared_bytes", kernel.ring_bytes),
        ),
    )


# ----------------------------------------------------------------------------------------------- header


_STRUCT = re.compile(r"typedef struct \{(?P<body>[^{}]*)\} (?P<name>\w+);", re.S)
_FIELD = re.compile(r"^\s*(?P<type>[\w\s\*]+?)\s*(?P<name>\w+)(?:\[(?P<n>\d+)\])?;\s*$")
_ENTRY = re.compile(r"void (?P<sym>_mlir_\w+?__mlir_ciface_\w+)\(void \*\*args, int32_t num_args\);")
_WRAPPER = re.compile(r"static inline int32_t (?P<name>\w+_wrapper)\((?P<params>[^)]*)\)")
_ARGS_ARRAY = re.compile(r"void \*args\[(?P<n>\d+)\] = \{(?P<items>[^}]*)\};", re.S)
_PACKED = re.compile(r"void (?P<sym>_mlir_\w+?_cuda_(?P<what>init|load_to_device))\(void \*\*\);")


def parse_header(text: str) -> dict:
    """What the generated header declares: argument structs, the packed entry point and its argument order."""
    structs = {}
    for m in _STRUCT.finditer(text):
        fields = []
        for line in m.group("body").strip().splitlines():
            f = _FIELD.match(line)
            if not f:
                raise ValueError(f"unexpected struct field in the generated header: {line!r}")
            fields.append({"type": " ".join(f.group("type").split()), "name": f.group("name"), "count": f.group("n")})
        structs[m.group("name")] = fields
    entry = _ENTRY.search(text)
    wrapper = _WRAPPER.search(text)
    args_array = _ARGS_ARRAY.search(text)
    packed = {m.group("what"): m.group("sym") for m in _PACKED.finditer(text)}
    if not (entry and wrapper and args_array and {"init", "load_to_device"} <= packed.keys()):
        raise ValueError("the generated header lacks the packed entry point, its wrapper or the module loaders")
    params = []
    for p in wrapper.group("params").split(","):
        p = " ".join(p.split())
        ctype, name = p.rsplit(" ", 1)
        while name.startswith("*"):
            ctype, name = ctype + " *", name[1:]
        params.append({"c_type": ctype.replace(" *", "*"), "name": name})
    items = [i.strip() for i in args_array.group("items").replace("\n", " ").split(",") if i.strip()]
    wrapper_params = ", ".join(p["c_type"] + " " + p["name"] for p in params)
    return {
        "structs": structs,
        "entry_symbol": entry.group("sym"),
        "entry_c_signature": f"void {entry.group('sym')}(void **args, int32_t num_args)",
        "wrapper_name": wrapper.group("name"),
        "wrapper_c_signature": f"static inline int32_t {wrapper.group('name')}({wrapper_params})",
        "wrapper_params": params,
        "num_args": int(args_array.group("n")),
        "args_array": items,
        "init_symbol": packed["init"],
        "load_to_device_symbol": packed["load_to_device"],
    }


def _check_header_against_specs(
    header: dict, specs: list[dict], prefix: str, scalars: tuple[str, ...] = ()
) -> list[dict]:
    """Match the header's wrapper parameters and tensor structs with the argument specs; return the C layout."""
    params = header["wrapper_params"]
    names = [p["name"] for p in params]
    want = ["module", *[s["name"] for s in specs], *scalars, "stream"]
    if names != want:
        raise ValueError(f"generated wrapper parameters {names} are not the expected {want}")
    types = {p["name"]: p["c_type"] for p in params}
    if any(types[s] != "int32_t" for s in scalars):
        raise ValueError(f"generated scalar parameters {[(s, types[s]) for s in scalars]} are not all int32_t")
    want_items = [*[s["name"] for s in specs], *[f"&{s}" for s in scalars], "&stream", "&ret"]
    if header["args_array"] != want_items or header["num_args"] != len(want_items):
        raise ValueError(f"generated packed argument array {header['args_array']} is not {want_items}")
    layout = []
    for spec in specs:
        struct_name = f"{prefix}_Tensor_{spec['name']}_t"
        fields = header["structs"].get(struct_name)
        if fields is None:
            raise ValueError(f"the generated header has no struct {struct_name}")
        got = {f["name"]: (f["type"], int(f["count"] or 1)) for f in fields}
        expect = {"data": ("void *", 1)}
        if spec["dynamic_shape_dims"]:
            expect["dynamic_shapes"] = ("int32_t", len(spec["dynamic_shape_dims"]))
        if spec["dynamic_stride_dims"]:
            expect["dynamic_strides"] = ("int64_t", len(spec["dynamic_stride_dims"]))
        got = {k: (t.replace("void*", "void *"), n) for k, (t, n) in got.items()}
        if got != expect or [f["name"] for f in fields] != list(expect):
            raise ValueError(f"struct {struct_name} is {fields}, expected fields {expect}")
        layout.append({"struct": struct_name, "fields": [[k, t, n] for k, (t, n) in expect.items()]})
    return layout


# ----------------------------------------------------------------------------------------------- SASS


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, $CUDA_HOME/bin, /usr/local/cuda/bin or Triton's bundled NVIDIA tools (no import)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    cands = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump"]
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        cands.append(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    return next((str(c) for c in cands if c.is_file()), None)


_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(?P<op>[A-Z][A-Z0-9_]*)(?P<mods>[.\w]*)")


def sass_facts(cubin: Path, cuobjdump: str | None = None) -> dict | None:
    """Registers, stack, local memory and an opcode histogram of a cubin (None without cuobjdump)."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        return None
    res = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    m = _RES.search(res)
    ops = Counter()
    full = Counter()
    for line in sass.splitlines():
        o = _OPCODE.match(line)
        if o:
            ops[o.group("op")] += 1
            full[o.group("op") + o.group("mods")] += 1
    return {
        "registers": int(m.group(1)) if m else None,
        "stack_bytes": int(m.group(2)) if m else None,
        "static_shared_bytes": int(m.group(3)) if m else None,
        "local_bytes": int(m.group(4)) if m else None,
        "instructions": sum(ops.values()),
        "ldgsts": sum(n for k, n in full.items() if k.startswith("LDGSTS")),
        "ldgsts_forms": sorted(k for k in full if k.startswith("LDGSTS")),
        "local_memory_ops": ops["LDL"] + ops["STL"],
        "opcodes": dict(sorted(ops.items())),
    }


# ----------------------------------------------------------------------------------------------- build


def _runtime_paths() -> tuple[Path, Path, str]:
    """(libcute_dsl_runtime.so, libcuda_dialect_runtime_static.a, flavour) of the installed CuTe DSL wheel."""
    from cutlass.runtime import find_runtime_libraries

    libs = [Path(p) for p in find_runtime_libraries(enable_tvm_ffi=False)]
    if not libs:
        raise RuntimeError("no CuTe DSL runtime library found: is nvidia-cutlass-dsl-libs-cu12/cu13 installed?")
    shared = libs[0]
    static = shared.parent / "libcuda_dialect_runtime_static.a"
    if not static.is_file():
        raise RuntimeError(f"{static} is missing: the CuTe DSL wheel has no static host runtime to link")
    return shared, static, shared.parent.parent.name


def _cudart_static() -> Path:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
                p = Path(root) / sub / "libcudart_static.a"
                if p.is_file():
                    return p
    raise RuntimeError("libcudart_static.a not found: set CUDA_HOME to a CUDA toolkit (13.0 was used)")


def _fake_args(prog: CuteProgram):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    dtypes = {
        "uint8": cutlass.Uint8,
        "uint32": cutlass.Uint32,
        "int32": cutlass.Int32,
        "uint64": cutlass.Uint64,
        "bfloat16": cutlass.BFloat16,
        "float32": cutlass.Float32,
    }
    divisible = dict(prog.divisible)
    syms = {}
    fakes = []
    for spec in prog.tensor_specs():
        shape = tuple(
            syms.setdefault(d, cute.sym_int32(divisibility=divisible.get(d, 1), symbol=d)) if isinstance(d, str) else d
            for d in spec["shape"]
        )
        order = tuple(range(len(shape) - 1, -1, -1))  # row-major: the last mode is the stride-1 one
        fakes.append(make_fake_compact_tensor(dtypes[spec["dtype"]], shape, stride_order=order, assumed_align=_ALIGN))
    return [*fakes, *(cutlass.Int32(0) for _ in prog.scalars), make_fake_stream()]


_RUNTIME_LOADED: set[str] = set()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_stage_decoder(record_bytes: int, out_dir: Path, *, delta_bits: int = 4, cc: str | None = None) -> dict:
    """Compile, export and link the stage decoder for one record size into ``out_dir`` (see
    :func:`build_cute_program`)."""
    return build_cute_program(stage_decoder_program(record_bytes, delta_bits), out_dir, cc=cc)


def build_row_expander(
    group_tiles: int,
    delta_bits: int,
    max_record_bytes: int,
    max_tail_bytes: int,
    store: int,
    out_dir: Path,
    *,
    cc: str | None = None,
) -> dict:
    """Compile, export and link the row expander for one column-group size, delta width and store width."""
    prog = row_expander_program(group_tiles, delta_bits, max_record_bytes, max_tail_bytes, store)
    return build_cute_program(prog, out_dir, cc=cc)


def build_cute_program(prog: CuteProgram, out_dir: Path, *, cc: str | None = None) -> dict:
    """Compile, export and link one program into ``out_dir``; return its metadata.

    The metadata (also written to ``<name>.json``) names the shared object, the exported C symbols and their
    signatures, the argument order and struct layouts, the launch shape and the sha256 of the cubin and the
    shared object; the returned dict adds ``paths`` (absolute paths of the written files).
    """
    import cutlass.cute as cute

    name = prog.name
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runtime_so, runtime_static, flavour = _runtime_paths()
    cudart = _cudart_static()
    if str(runtime_so) not in _RUNTIME_LOADED:  # export_to_c resolves runtime symbols in the process
        ctypes.CDLL(str(runtime_so), mode=ctypes.RTLD_GLOBAL)
        _RUNTIME_LOADED.add(str(runtime_so))

    with tempfile.TemporaryDirectory(prefix="csf-cute-") as tmp:
        work = Path(tmp)
        dump = work / "dump"
        dump.mkdir()
        compiled = cute.compile(
            prog.factory(),
            *_fake_args(prog),
            options=f"--gpu-arch {ARCH} --keep-cubin --dump-dir {dump}",
        )
        cubin = compiled.artifacts.CUBIN
        if not isinstance(cubin, bytes | bytearray):
            raise RuntimeError(f"the DSL kept no cubin (got {cubin!r})")
        compiled.export_to_c(str(work), name, name)
        header_text = (work / f"{name}.h").read_text()
        header = parse_header(header_text)
        specs = prog.tensor_specs()
        layout = _check_header_against_specs(header, specs, name, prog.scalars)

        so_name = f"lib{name}.so"
        link = [
            cc or os.environ.get("CC", "gcc"),
            "-shared",
            "-o",
            so_name,
            f"{name}.o",
            str(runtime_static),
            str(cudart),
            "-ldl",
            "-lrt",
            "-lpthread",
            "-Wl,--build-id=none",
            "-Wl,--exclude-libs,ALL",
            f"-Wl,-soname,{so_name}",
            "-Wl,--no-undefined",
            "-Wl,-z,noexecstack",
            "-Wl,--gc-sections",  # drop the static runtimes' unused sections and every symbol table:
            "-s",  # a third of each object's size (the cache travels to the GPU machine with every test run)
        ]
        env = {**os.environ, "LC_ALL": "C", "SOURCE_DATE_EPOCH": "0"}
        done = subprocess.run(link, cwd=work, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"linking {so_name} failed ({' '.join(link)}):\n{done.stderr}")
        so_bytes = (work / so_name).read_bytes()
        object_bytes = (work / f"{name}.o").read_bytes()

        files = {"so": so_name, "header": f"{name}.h", "cubin": f"{name}.cubin", "metadata": f"{name}.json"}
        (out_dir / files["cubin"]).write_bytes(bytes(cubin))
        (out_dir / files["header"]).write_text(header_text)
        tmp_so = out_dir / f".{so_name}.tmp"
        tmp_so.write_bytes(so_bytes)
        tmp_so.replace(out_dir / so_name)

    args = [
        {**spec, "c_struct": lay["struct"], "c_fields": lay["fields"]} for spec, lay in zip(specs, layout, strict=True)
    ]
    args += [{"name": s, "kind": "int32", "c_type": "int32_t"} for s in prog.scalars]
    args.append({"name": "stream", "kind": "stream", "c_type": "cudaStream_t"})
    launch = {k: list(v) if isinstance(v, tuple) else v for k, v in prog.launch}
    meta = {
        "metadata_version": METADATA_VERSION,
        "program": prog.program,
        **dict(prog.facts),
        "arch": ARCH,
        "name": name,
        "files": files,
        "symbols": {
            "prefix": name,
            "entry": header["entry_symbol"],
            "init": header["init_symbol"],
            "load_to_device": header["load_to_device_symbol"],
        },
        "c_signatures": {
            "entry": header["entry_c_signature"],
            "init": f"void {header['init_symbol']}(void **args)  /* args = {{&(cudaLibrary_t *) lib, &ret}} */",
            "load_to_device": f"void {header['load_to_device_symbol']}(void **args)"
            "  /* args = {&(cudaLibrary_t *) lib, &(int32_t) device, &ret} */",
            "wrapper": header["wrapper_c_signature"],
        },
        "packed_args": header["args_array"],
        "num_args": header["num_args"],
        "args": args,
        "launch": {**launch, "stream": "cudaStream_t of the caller (torch.cuda.current_stream().cuda_stream)"},
        "sha256": {"cubin": _sha256(bytes(cubin)), "object": _sha256(object_bytes), "so": _sha256(so_bytes)},
        "link": [Path(a).name if os.path.isabs(a) else a for a in link],
        "toolchain": {
            "nvidia-cutlass-dsl": importlib.metadata.version("nvidia-cutlass-dsl"),
            "libs_flavour": flavour,
            "cudart_static": _cuda_version(cudart),
            "runtime_static_archive_sha256": _sha256(runtime_static.read_bytes()),
        },
        "sass": sass_facts(out_dir / files["cubin"]),
    }
    (out_dir / files["metadata"]).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return {**meta, "paths": {k: str((out_dir / v).resolve()) for k, v in files.items()}}


def _cuda_version(cudart: Path) -> str:
    """The CUDA toolkit version the static runtime comes from (its dist-info or version.json), else 'unknown'."""
    root = cudart.parent.parent
    for info in sorted(root.glob("dist-info/nvidia_cuda_runtime-*.dist-info")):
        return info.name.removeprefix("nvidia_cuda_runtime-").removesuffix(".dist-info")
    vj = root / "version.json"
    if vj.is_file():
        try:
            return json.loads(vj.read_text())["cuda_cudart"]["version"]
        except (KeyError, ValueError):
            pass
    return "unknown"


def build_stage_decoders(
    out_dir: Path, sizes: tuple[int, ...] = MXFP4_RECORD_BYTES, *, delta_bits: int = 4
) -> list[dict]:
    """Build one stage decoder per record size (default: every MXFP4 size, 4-bit deltas)."""
    return [build_stage_decoder(s, out_dir, delta_bits=delta_bits) for s in sizes]
