"""vLLM: FlashMLA's sparse backend with its FP8 decode kernel replaced by csf (``CSF_SPARSE_MLA=1``).

vLLM selects DeepSeek-V3.2's sparse backend by the name ``FLASHMLA_SPARSE`` (and special-cases that
name), so csf overrides that member's class path rather than adding a backend: everything but the FP8
decode call (metadata, indexer, prefill, cache writing) stays vLLM's. csf needs no head padding (16 and
32 heads per rank run as they are, where FlashMLA pads to 64).
"""

from __future__ import annotations

from vllm.config import get_current_vllm_config_or_none
from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend, FlashMLASparseImpl

from ..sparse_mla import service

__all__ = ["CLASS_PATH", "CsfFlashMLASparseBackend", "CsfFlashMLASparseImpl", "decode_rows"]

CLASS_PATH = f"{__name__}.CsfFlashMLASparseBackend"


def decode_rows(vllm_config) -> int | None:
    """Query rows of vLLM's largest decode batch: sequences x (1 + speculative tokens). Mixed batches that
    send prefill tokens through the decode kernel too run in slices of this size (see ``sparse_mla``)."""
    if vllm_config is None:
        return None
    spec = vllm_config.speculative_config
    per_seq = 1 + (int(spec.num_speculative_tokens or 0) if spec is not None else 0)
    return int(vllm_config.scheduler_config.max_num_seqs) * per_seq


class CsfFlashMLASparseImpl(FlashMLASparseImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        service(decode_rows(get_current_vllm_config_or_none()))  # planned for the engine's decode batch

    def _fp8_flash_mla_kernel(self, q, kv_c_and_k_pe_cache, topk_indices, kernel_metadata):
        # q [batch, q_rows, heads, 576], topk_indices [batch, q_rows, topk] global slots (-1 = skip)
        if q.shape[-1] != 576:  # the rope-less record layout: not csf's
            return super()._fp8_flash_mla_kernel(q, kv_c_and_k_pe_cache, topk_indices, kernel_metadata)
        return service().decode(q, kv_c_and_k_pe_cache, topk_indices, self.softmax_scale)


class CsfFlashMLASparseBackend(FlashMLASparseBackend):
    @staticmethod
    def get_impl_cls() -> type[CsfFlashMLASparseImpl]:
        return CsfFlashMLASparseImpl
