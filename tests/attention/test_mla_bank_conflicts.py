"""The sparse-MLA decode programs' hot shared-memory accesses reach distinct banks, counted at compile time on
a GPU-less machine by Gluon's ``bank_conflicts`` (the excess accesses per wavefront of the ``ld.shared`` /
``st.shared`` instructions a register layout and a shared layout generate). Each case pairs a program's
register layout with the shared layout it reads or writes; a change to either that brings back a conflict
fails here. Shared rows of 256 or 512 bytes are probed as 128-byte rows: their swizzles act within 128
bytes, and banks repeat every 128 bytes, so the banks are the same."""

from __future__ import annotations

import contextlib
import io

import pytest

pytest.importorskip("triton")

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from csf_kernels.kernels import mla_decode_mma, mla_decode_wgmma, mla_decode_wide

STAGED_LATENT = mla_decode_mma._latent_staging()  # both Gluon programs' staged records
WIDE_KEYS = mla_decode_wide._words_view()  # the wide program's bf16 key operands, seen as words


@gluon.jit
def _probe(REG: gl.constexpr, SHARED: gl.constexpr, M: gl.constexpr, N: gl.constexpr, DTYPE: gl.constexpr):
    x = gl.zeros([M, N], DTYPE, REG)
    s = gl.allocate_shared_memory(DTYPE, [M, N], SHARED)
    gl.static_print("bank conflicts:", gl.bank_conflicts(x.type, s.type))
    s.store(x)


def bank_conflicts(reg, shared, shape, dtype) -> int:
    names = ("REG", "SHARED", "M", "N", "DTYPE")
    constexprs = dict(zip(names, (reg, shared, *shape, dtype), strict=True))
    src = GluonASTSource(_probe, signature=dict.fromkeys(names, "constexpr"), constexprs=constexprs)
    printed = io.StringIO()
    with triton.knobs.compilation.scope(), contextlib.redirect_stdout(printed):
        triton.knobs.compilation.always_compile = True  # a cached probe would print nothing
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return int(printed.getvalue().split("bank conflicts:")[1].split()[0])


CASES = {
    # the wide program's converter: a group's bf16 pairs stored into the swizzled operand buffer
    "wide: converted keys stored": (mla_decode_wide._pair_layout(), WIDE_KEYS, [64, 64], gl.int32),
    # the 32-head program: a latent group's codes as the scores' and the values' A operands
    "wgmma: key codes loaded": (mla_decode_wgmma._key_layout(128), STAGED_LATENT, [64, 128], gl.uint8),
    "wgmma: value codes loaded": (mla_decode_wgmma._value_layout(), STAGED_LATENT, [64, 128], gl.uint8),
    # the 16-head program: a latent group's codes as the scores' B operand
    "mma: key codes loaded": (mla_decode_mma._key_layout(4), STAGED_LATENT, [64, 128], gl.uint8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hot_shared_accesses_are_free_of_bank_conflicts(case):
    reg, shared, shape, dtype = CASES[case]
    assert bank_conflicts(reg, shared, shape, dtype) == 0


def test_the_probe_sees_a_conflict_where_there_is_one():
    """The 128-byte-swizzled pair layout the wide converter had (8 contiguous words per lane: the two halves
    of each lane's 32 bytes on the same banks of two swizzle rows) and plain rows of 32 floats under a wgmma
    accumulator (every row on one bank): the probe must count both."""
    wide_before = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    assert bank_conflicts(wide_before, WIDE_KEYS, [64, 64], gl.int32) == 1
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 32, 16])
    plain = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    assert bank_conflicts(acc, plain, [64, 32], gl.float32) == 3
