"""SGLang: the DSA (DeepSeek sparse attention) backend with its FP8 FlashMLA decode replaced by csf
(``CSF_SPARSE_MLA=1``).

Model code asks the attention registry for "dsa" (or its deprecated alias "nsa"); csf registers a
factory under both names that builds a subclass whose only change is ``_forward_flashmla_kv``, the FP8
decode call. Caches csf does not read (bf16, or the rope-less V32_NO_ROPE records) keep FlashMLA.
"""

from __future__ import annotations

from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

from ..sparse_mla import service

__all__ = ["CsfDeepseekSparseAttnBackend", "create_backend"]


class CsfDeepseekSparseAttnBackend(DeepseekSparseAttnBackend):
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        # the largest decode batch SGLang captures, in query rows (draft tokens included): csf plans for it
        service(max_num_tokens)

    def _forward_flashmla_kv(self, q_all, kv_cache, v_head_dim, sm_scale, layer, metadata, page_table_1):
        if not self.dsa_kv_cache_store_fp8 or self.flashmla_kv_format != "V32":
            return super()._forward_flashmla_kv(q_all, kv_cache, v_head_dim, sm_scale, layer, metadata, page_table_1)
        q = q_all.view(-1, 1, layer.tp_q_head_num, layer.head_dim)
        out, _ = service().decode(q, kv_cache, page_table_1.unsqueeze(1), sm_scale)
        return out


def create_backend(runner) -> CsfDeepseekSparseAttnBackend:
    return CsfDeepseekSparseAttnBackend(runner)
