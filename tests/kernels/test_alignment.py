"""The alignment contract: programs are compiled assuming 16-byte pointers (and named integer
multiples), as Triton's JIT specialises; the runtime refuses arguments that break it (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4
from csf_kernels import runtime
from csf_kernels.expand.specs import inline_class_spec
from csf_kernels.runtime.programs import ALIGNMENT, MisalignedArgumentError, assumed_multiples, check_multiples


def test_every_pointer_and_each_named_integer_is_assumed_divisible():
    sig = {"p": "*u8", "q": "*bf16", "n": "i32", "k": "i32", "C": "constexpr"}
    assert assumed_multiples(sig, {"k": 32}) == {"p": ALIGNMENT, "q": ALIGNMENT, "k": 32}
    with pytest.raises(ValueError, match="MULTIPLE_OF"):
        assumed_multiples(sig, {"C": 16})  # constexprs are not runtime arguments
    with pytest.raises(ValueError, match="MULTIPLE_OF"):
        assumed_multiples(sig, {"p": 16})  # pointers are always assumed aligned


def test_breaking_an_assumed_divisibility_is_refused_with_the_argument_named():
    buf = torch.zeros(64, dtype=torch.uint8)
    multiples = {"p": 16, "k": 32}
    check_multiples("prog", ("p", "n", "k"), (buf, 3, 64), multiples)
    check_multiples("prog", ("p", "n", "k"), (buf.data_ptr(), 3, 64), multiples)  # raw addresses too
    with pytest.raises(MisalignedArgumentError, match=r"'p'.*multiple of 16"):
        check_multiples("prog", ("p", "n", "k"), (buf[1:], 3, 64), multiples)
    with pytest.raises(MisalignedArgumentError, match=r"'k'.*multiple of 32"):
        check_multiples("prog", ("p", "n", "k"), (buf, 3, 48), multiples)


def test_aligned_returns_the_tensor_or_an_aligned_copy():
    buf = torch.arange(64, dtype=torch.uint8)
    assert runtime.aligned(buf) is buf
    view = buf[3:19]
    fixed = runtime.aligned(view)
    assert fixed.data_ptr() % ALIGNMENT == 0 and torch.equal(fixed, view)
    strided = buf[::2]
    assert runtime.aligned(strided).is_contiguous() and torch.equal(runtime.aligned(strided), strided)


def test_bind_checks_the_multiples_recorded_in_the_manifest(monkeypatch):
    class Driver:
        def ensure_context(self, device):
            pass

        def load_function(self, data, entry, shared):
            return "module", 0x1

    monkeypatch.setattr(runtime.loaded, "driver", lambda: Driver())
    launch = {
        "entry": "k",
        "block": [128, 1, 1],
        "shared": 0,
        "global_scratch": [0, 1],
        "profile_scratch": [0, 1],
        "params": ["*u8", "i32"],
        "param_names": ["x", "K"],
        "multiples": {"x": 16, "K": 32},
    }
    prog = runtime.LoadedProgram.from_cubin(inline_class_spec(MXFP4, 96), b"\x7fELF", launch, device=0)
    t = torch.zeros(64, dtype=torch.uint8)
    prog.bind((1,), t, 64)
    with pytest.raises(MisalignedArgumentError, match="'x'"):
        prog.bind((1,), t[8:], 64)
    with pytest.raises(MisalignedArgumentError, match="'K'"):
        prog.bind((1,), t, 48)


def test_compiled_programs_record_what_they_assume():
    pytest.importorskip("triton")
    from csf_kernels.aot.compile_triton import compile_triton
    from csf_kernels.moe.specs import combine_spec

    art = compile_triton(combine_spec(False, slots=8))
    multiples = art.launch["multiples"]
    pointers = [n for n, t in zip(art.launch["param_names"], art.launch["params"], strict=True) if t.startswith("*")]
    assert pointers and all(multiples[n] == ALIGNMENT for n in pointers)
    assert multiples["hidden"] == 16 and "pairs" not in multiples
