"""Run AOT program launches in Triton's CPU interpreter (import this module before triton).

Sets TRITON_INTERPRET and works around two defects of Triton 3.6's interpreter:
* with numpy >= 2.4 a kernel's scalar arguments arrive as one-element arrays, which ``range()`` cannot
  take (``int()`` of a 1-d array);
* ``tl.dot`` multiplies bf16 operands as their raw uint16 storage; they are widened to float32 here
  (exact: what the tensor cores compute, up to accumulation order);
* so does bf16 elementwise arithmetic (``a * b`` on bf16 tensors): computed here in float32 and rounded
  to nearest even, as the GPU does;
* ``.to(tl.bfloat16)`` of float32 truncates (the GPU's ``cvt.rn`` rounds to nearest even): rounded here;
* narrowing float32 to E4M3 drops the carry when the mantissa rounds up into the next binade (127.3 ->
  64): done here with torch's float8_e4m3fn conversion (round to nearest even, as the GPU's cvt.rn).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter as _interpreter

from csf_kernels.runtime.programs import assumed_multiples, check_multiples, triton_family

_patch_tensor = _interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


_interpreter._patch_lang_tensor = _patch_lang_tensor


def _bf16_as_f32(handle):
    if handle.dtype.scalar == tl.bfloat16:
        widened = (handle.data.astype(np.uint32) << 16).view(np.float32)
        return _interpreter.TensorHandle(widened, tl.float32)
    return handle


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    return _create_dot_orig(self, _bf16_as_f32(a), _bf16_as_f32(b), d, input_precision, max_num_imprecise_acc)


_create_dot_orig = _interpreter.InterpreterBuilder.create_dot
_interpreter.InterpreterBuilder.create_dot = _create_dot

_FLOAT_OPS = (np.add, np.subtract, np.multiply, np.divide, np.fmod)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def _binary_op(self, lhs, rhs, op):
    if lhs.dtype.scalar == tl.bfloat16 and op in _FLOAT_OPS:
        a, b = (_bf16_as_f32(h).data for h in (lhs, rhs))
        return _interpreter.TensorHandle(_f32_to_bf16_bits(op(a, b)), tl.bfloat16)
    return _binary_op_orig(self, lhs, rhs, op)


_binary_op_orig = _interpreter.InterpreterBuilder.binary_op
_interpreter.InterpreterBuilder.binary_op = _binary_op


def _create_fp_to_fp(self, src, dst_type, rounding_mode):
    if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in (tl.float32, tl.bfloat16):
        wide = torch.from_numpy(np.ascontiguousarray(_bf16_as_f32(src).data, dtype=np.float32))
        return _interpreter.TensorHandle(wide.to(torch.float8_e4m3fn).view(torch.uint8).numpy(), tl.float8e4nv)
    return _create_fp_to_fp_orig(self, src, dst_type, rounding_mode)


_create_fp_to_fp_orig = _interpreter.InterpreterBuilder.create_fp_to_fp
_interpreter.InterpreterBuilder.create_fp_to_fp = _create_fp_to_fp


def _cast_impl(self, src, dst_type):
    if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32:
        return _interpreter.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
    return _cast_impl_orig(self, src, dst_type)


_cast_impl_orig = _interpreter.InterpreterBuilder.cast_impl
_interpreter.InterpreterBuilder.cast_impl = _cast_impl
_interpreter.InterpreterBuilder.create_fp_trunc = _cast_impl


# constants selecting PTX inline assembly, which the interpreter cannot run: their portable twins (PDL's
# griddepcontrol orders launches; the interpreter runs one program at a time, in launch order)
INTERPRETER_CONSTANTS = {"ASM": 0, "PDL": 0}


def run_launch(launch) -> None:
    """Execute one ``csf_kernels.runtime.Launch`` on CPU tensors."""
    fn, signature, module = triton_family(launch.spec.kernel).source()
    # the divisibilities the compiled program assumes, checked as the runtime's bind checks them
    multiples = assumed_multiples(signature, getattr(module, "MULTIPLE_OF", {}))
    names = tuple(n for n, t in signature.items() if t != "constexpr")
    check_multiples(launch.spec.describe(), names, tuple(launch.args), multiples)
    facts = launch.spec.fact
    constexprs = {k: facts[k] for k, t in signature.items() if t == "constexpr"}
    constexprs.update({k: v for k, v in INTERPRETER_CONSTANTS.items() if k in constexprs})
    fn[tuple(launch.grid)](*launch.args, **constexprs)
