"""csf's sparse MLA decode behind each engine's sparse MLA backend, switched on by CSF_SPARSE_MLA (CPU): vLLM's
FLASHMLA_SPARSE backend name, SGLang's "dsa" / "nsa" backends. The engines' backends differ in shape, so the
tests are engine-specific; the process-wide registration is probed in a fresh process."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from .engines import only, run_probe

_VLLM_PROBE = """
import json
from csf_serving_adapters.vllm import register
from vllm.v1.attention.backends.registry import AttentionBackendEnum
register(); register()
member = AttentionBackendEnum.FLASHMLA_SPARSE
cls = member.get_class()
print(json.dumps({"path": member.get_path(), "name": cls.get_name(), "impl": cls.get_impl_cls().__name__}))
"""

_SGLANG_PROBE = """
import json
from csf_serving_adapters.sglang import register
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
register(); register()
print(json.dumps({n: ATTENTION_BACKENDS[n].__module__ + "." + ATTENTION_BACKENDS[n].__name__ for n in ("dsa", "nsa")}))
"""


class _Service:
    """Stands in for the process's sparse-MLA service: records what each decode call hands it."""

    def __init__(self):
        self.calls = []

    def decode(self, q, kv, indices, sm_scale):
        self.calls.append((q.shape, kv.shape, indices.shape, sm_scale))
        return "out", "lse"


@only("vllm")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_vllm_switch_decides_what_flashmla_sparse_resolves_to(engine, switch):
    from csf_serving_adapters.vllm.attention import CLASS_PATH

    got = run_probe(_VLLM_PROBE, dict(os.environ, CSF_SPARSE_MLA=switch, VLLM_PLUGINS="csf"))
    assert got["name"] == "FLASHMLA_SPARSE"  # vLLM special-cases this name: it must not change
    if switch == "1":
        assert got == {"path": CLASS_PATH, "name": "FLASHMLA_SPARSE", "impl": "CsfFlashMLASparseImpl"}
    else:
        assert got["path"] != CLASS_PATH and got["impl"] == "FlashMLASparseImpl"


@only("vllm")
def test_vllm_only_the_fp8_decode_call_changes(engine, monkeypatch):
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend, FlashMLASparseImpl

    from csf_serving_adapters.vllm import attention
    from csf_serving_adapters.vllm.attention import CsfFlashMLASparseBackend, CsfFlashMLASparseImpl

    assert issubclass(CsfFlashMLASparseBackend, FlashMLASparseBackend)
    assert issubclass(CsfFlashMLASparseImpl, FlashMLASparseImpl)
    assert CsfFlashMLASparseBackend.get_builder_cls() is FlashMLASparseBackend.get_builder_cls()
    own = {k for k, v in vars(CsfFlashMLASparseImpl).items() if callable(v)}
    assert own == {"__init__", "_fp8_flash_mla_kernel"}  # __init__: only sizes the service (below)

    svc = _Service()
    monkeypatch.setattr(attention, "service", lambda: svc)
    impl = object.__new__(CsfFlashMLASparseImpl)  # no GPU: only the method under test
    impl.softmax_scale = 0.07
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    got = CsfFlashMLASparseImpl._fp8_flash_mla_kernel(impl, q, torch.zeros(3, 64, 656, dtype=torch.uint8),
                                                      torch.zeros(2, 1, 2048, dtype=torch.int32), None)  # fmt: skip
    assert got == ("out", "lse") and svc.calls == [((2, 1, 16, 576), (3, 64, 656), (2, 1, 2048), 0.07)]


@only("vllm")
def test_vllm_service_is_sized_for_vllms_decode_batch(engine):
    from vllm.config import SchedulerConfig, SpeculativeConfig

    from csf_serving_adapters.vllm.attention import decode_rows

    # the fields read exist on vLLM's own config classes
    assert {"max_num_seqs"} <= set(SchedulerConfig.__dataclass_fields__)
    assert {"num_speculative_tokens"} <= set(SpeculativeConfig.__dataclass_fields__)

    def cfg(seqs, spec):
        return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=seqs), speculative_config=spec)

    assert decode_rows(cfg(256, None)) == 256
    assert decode_rows(cfg(64, SimpleNamespace(num_speculative_tokens=3))) == 256  # MTP: 4 query rows each
    assert decode_rows(None) is None


@only("sglang")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_sglang_switch_decides_what_dsa_builds(engine, switch):
    got = run_probe(_SGLANG_PROBE, dict(os.environ, CSF_SPARSE_MLA=switch))
    ours = "csf_serving_adapters.sglang.attention.create_backend"
    assert (set(got.values()) == {ours}) is (switch == "1"), got


def _sglang_backend(fmt, fp8=True):
    from csf_serving_adapters.sglang.attention import CsfDeepseekSparseAttnBackend

    b = object.__new__(CsfDeepseekSparseAttnBackend)  # no GPU: only the method under test
    b.dsa_kv_cache_store_fp8, b.flashmla_kv_format = fp8, fmt
    return b


@only("sglang")
def test_sglang_fp8_decode_call_goes_to_csf_and_other_caches_keep_flashmla(engine, monkeypatch):
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    from csf_serving_adapters.sglang import attention
    from csf_serving_adapters.sglang.attention import CsfDeepseekSparseAttnBackend

    assert issubclass(CsfDeepseekSparseAttnBackend, DeepseekSparseAttnBackend)
    svc = _Service()
    monkeypatch.setattr(attention, "service", lambda: svc)
    monkeypatch.setattr(DeepseekSparseAttnBackend, "_forward_flashmla_kv", lambda self, *a: "flashmla")
    layer = SimpleNamespace(tp_q_head_num=16, head_dim=576)
    args = (torch.zeros(4, 16 * 576, dtype=torch.bfloat16), torch.zeros(2, 64, 656, dtype=torch.uint8), 512, 0.05,
            layer, None, torch.zeros(4, 2048, dtype=torch.int32))  # fmt: skip
    assert _sglang_backend("V32")._forward_flashmla_kv(*args) == "out"
    assert [(q, idx, scale) for q, _, idx, scale in svc.calls] == [((4, 1, 16, 576), (4, 1, 2048), 0.05)]
    assert _sglang_backend("V32_NO_ROPE")._forward_flashmla_kv(*args) == "flashmla"
    assert _sglang_backend("V32", fp8=False)._forward_flashmla_kv(*args) == "flashmla"


@only("sglang")
def test_sglang_service_is_sized_by_sglangs_cuda_graph_state(engine, monkeypatch):
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    from csf_serving_adapters.sglang import attention

    sized = []
    monkeypatch.setattr(attention, "service", lambda rows=None: sized.append(rows))
    monkeypatch.setattr(DeepseekSparseAttnBackend, "init_cuda_graph_state", lambda self, bs, tokens: None)
    _sglang_backend("V32").init_cuda_graph_state(64, 256)  # 64 requests, 4 query rows each (speculative decoding)
    assert sized == [256]
