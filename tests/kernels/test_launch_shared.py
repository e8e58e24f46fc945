"""Launching with more dynamic shared memory than a program needs, so that at most N of its programs share an SM
(the runtime's ``at_most_per_sm``; CPU: the arithmetic and the function attribute's bookkeeping)."""

from __future__ import annotations

import pytest

from csf_kernels.runtime.driver import Driver, shared_for_at_most

H200_SHARED_PER_SM, RESERVED = 233472, 1024  # 228 KiB per SM, 1 KiB reserved per program


def test_a_cap_reserves_just_enough_shared_memory():
    one = shared_for_at_most(1, 104704, H200_SHARED_PER_SM, RESERVED)  # the 16-head MLA decode's 102.25 KiB
    assert (one + RESERVED) * 2 > H200_SHARED_PER_SM >= one + RESERVED
    assert shared_for_at_most(2, 104704, H200_SHARED_PER_SM, RESERVED) == 104704  # at most two already
    three = shared_for_at_most(3, 1024, H200_SHARED_PER_SM, RESERVED)
    assert (three + RESERVED) * 4 > H200_SHARED_PER_SM >= (three + RESERVED) * 3
    with pytest.raises(ValueError, match="positive"):
        shared_for_at_most(0, 1024, H200_SHARED_PER_SM, RESERVED)


class _FakeCu:
    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self):
        self.calls = []

    def CUfunction(self, handle):
        return handle

    def cuFuncSetAttribute(self, fn, attr, value):
        self.calls.append((fn, value))
        return (0,)


def test_a_functions_shared_memory_limit_only_rises():
    """Two bindings of one program with different caps: the limit set for the larger stays (lowering it would make
    the larger binding's launches fail)."""
    drv = Driver.__new__(Driver)  # no libcuda here: only the bookkeeping is under test
    drv.cu, drv._allowed = _FakeCu(), {}
    drv.allow_shared(7, "decode", 40 * 1024)  # under the default 48 KiB: nothing to set
    drv.allow_shared(7, "decode", 115713)
    drv.allow_shared(7, "decode", 104704)  # less than allowed already: kept
    drv.allow_shared(9, "merge", 60000)
    assert drv.cu.calls == [(7, 115713), (9, 60000)]
