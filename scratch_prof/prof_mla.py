import sys
sys.path.insert(0, "benchmarks")
import torch
from bench_mla import TOPK, _inputs
from csf_attention import MLACaps, bind, plan
from csf_kernels import runtime
from csf_kernels.mla_layout import HEAD_DIM
from csf_kernels.mla_specs import decode_config
runtime.unfreeze()
batch, heads = int(sys.argv[1]), int(sys.argv[2])
q, kv, indices, lengths = _inputs(batch, heads, 1, torch.Generator(device="cuda").manual_seed(0))
p = plan(MLACaps(heads=heads, max_rows=batch, topk=TOPK))
dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))
for _ in range(2):
    dec.run_decode(q, kv, indices, lengths, 1.0 / HEAD_DIM**0.5)
torch.cuda.synchronize()
