"""csf-attention: DeepSeek-V3.2-style sparse MLA decode over an FP8 KV cache on Hopper.

``plan(MLACaps(...))`` -> ``bind(plan, scratch)`` -> ``decoder.run_decode(q, kv_cache, indices, lengths,
sm_scale, attn_sink=None)``; the cache writer (``write_kv``) and the float32 reference are here too.
"""

from .cache import dequantize_records, group_scales, pack_query, quantize_records, read_kv, write_kv
from .decode import SparseMLADecoder, bind
from .plan import MLACaps, MLAPlan, MLAScratch, plan
from .reference import live_candidates, sparse_mla_reference

__all__ = [
    "MLACaps",
    "MLAPlan",
    "MLAScratch",
    "SparseMLADecoder",
    "bind",
    "dequantize_records",
    "group_scales",
    "live_candidates",
    "pack_query",
    "plan",
    "quantize_records",
    "read_kv",
    "sparse_mla_reference",
    "write_kv",
]
