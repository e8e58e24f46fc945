import torch

from csf_codec import MXFP4, encode_inline
from csf_codec.synthetic import SEED_REGIME, synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.expand import expand_inline

runtime.freeze()
plane = synthetic_scale_plane((384, 5120, 18), MXFP4, stats=SEED_REGIME, seed=7).cuda()
inline = encode_inline(plane, MXFP4)
out = torch.empty_like(plane)
expand_inline(inline, out)
torch.cuda.synchronize()
assert torch.equal(out, plane)
