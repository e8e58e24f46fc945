"""A layer's planes expanded concurrently (csf_kernels.expand.layer): the CPU-side checks; the GPU tests
(exactness, routed experts, graph capture) are in test_expand_layer_gpu.py."""

from __future__ import annotations

import pytest

from csf_kernels.expand.layer import bind_expand_inline_layer, side_stream


def test_a_layer_expansion_needs_planes():
    with pytest.raises(ValueError, match="no planes"):
        bind_expand_inline_layer([])


def test_the_side_stream_is_a_cuda_stream():
    with pytest.raises(ValueError, match="not a CUDA device"):
        side_stream("cpu")
