"""The encoders give the same bytes on a GPU as on the CPU, and the GPU decodes them exactly."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4, NVFP4, decode_compact, decode_inline, encode_compact, encode_inline

from .planes_for_tests import clustered_plane, special_rows

pytestmark = pytest.mark.gpu


def _planes():
    yield MXFP4, special_rows(clustered_plane((4, 1152, 160), seed=11), seed=1), 576
    yield MXFP4, clustered_plane((4, 5120, 18), seed=12, exception_rate=0.02), None
    yield MXFP4, torch.randint(0, 256, (3, 300, 22), generator=torch.Generator().manual_seed(3)).to(torch.uint8), None
    yield NVFP4, special_rows(clustered_plane((4, 1152, 320), seed=13, window=4, spread=1), seed=2), 576
    yield NVFP4, clustered_plane((2, 5120, 36), seed=14, window=4, exception_rate=0.05), None
    yield MXFP4, clustered_plane((576, 18), seed=15), None


@pytest.mark.parametrize("case", range(6))
def test_gpu_encoders_match_cpu_bytes(case):
    fmt, plane, group = list(_planes())[case]
    cpu_c = encode_compact(plane, fmt)
    gpu_c = encode_compact(plane.cuda(), fmt)
    assert gpu_c.payload.is_cuda
    assert torch.equal(gpu_c.payload.cpu(), cpu_c.payload)
    assert torch.equal(decode_compact(gpu_c.payload), plane.cuda())

    cpu_i = encode_inline(plane, fmt, row_group=group)
    gpu_i = encode_inline(plane.cuda(), fmt, row_group=group)
    assert gpu_i.records.is_cuda
    assert torch.equal(gpu_i.to_payload().cpu(), cpu_i.to_payload())
    assert torch.equal(decode_inline(gpu_i), plane.cuda())


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_gpu_parity_on_full_ds41_tp4_planes(fmt):
    k = 2 if fmt is NVFP4 else 1
    for shape, group in (((384, 1152, 160 * k), 576), ((384, 5120, 18 * k), None)):
        plane = clustered_plane(shape, seed=21, window=fmt.row_base_width, spread=2)
        gpu = plane.cuda()
        assert torch.equal(encode_compact(gpu, fmt).payload.cpu(), encode_compact(plane, fmt).payload)
        assert torch.equal(
            encode_inline(gpu, fmt, row_group=group).to_payload().cpu(),
            encode_inline(plane, fmt, row_group=group).to_payload(),
        )
