"""vLLM 0.33: csf behind the FLASHMLA_SPARSE backend name, switched on by CSF_SPARSE_MLA (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend, FlashMLASparseImpl

from csf_serving_adapters.vllm.attention import CLASS_PATH, CsfFlashMLASparseBackend, CsfFlashMLASparseImpl, decode_rows

_PROBE = """
import json
from csf_serving_adapters.vllm import register
from vllm.v1.attention.backends.registry import AttentionBackendEnum
register(); register()
member = AttentionBackendEnum.FLASHMLA_SPARSE
cls = member.get_class()
print(json.dumps({"path": member.get_path(), "name": cls.get_name(), "impl": cls.get_impl_cls().__name__}))
"""


@pytest.mark.parametrize("switch", ["1", "0"])
def test_the_switch_decides_what_flashmla_sparse_resolves_to(switch):
    env = dict(os.environ, CSF_SPARSE_MLA=switch, VLLM_PLUGINS="csf")
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["name"] == "FLASHMLA_SPARSE"  # vLLM special-cases this name: it must not change
    if switch == "1":
        assert got == {"path": CLASS_PATH, "name": "FLASHMLA_SPARSE", "impl": "CsfFlashMLASparseImpl"}
    else:
        assert got["path"] != CLASS_PATH and got["impl"] == "FlashMLASparseImpl"


def test_only_the_fp8_decode_call_changes(monkeypatch):
    assert issubclass(CsfFlashMLASparseBackend, FlashMLASparseBackend)
    assert issubclass(CsfFlashMLASparseImpl, FlashMLASparseImpl)
    assert CsfFlashMLASparseBackend.get_builder_cls() is FlashMLASparseBackend.get_builder_cls()
    own = {k for k, v in vars(CsfFlashMLASparseImpl).items() if callable(v)}
    assert own == {"__init__", "_fp8_flash_mla_kernel"}  # __init__: only sizes the service (below)

    calls = []

    class Service:
        def decode(self, q, kv, indices, sm_scale):
            calls.append((q.shape, kv.shape, indices.shape, sm_scale))
            return "out", "lse"

    from csf_serving_adapters.vllm import attention

    monkeypatch.setattr(attention, "service", lambda: Service())
    impl = object.__new__(CsfFlashMLASparseImpl)  # no GPU: only the method under test
    impl.softmax_scale = 0.07
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    got = CsfFlashMLASparseImpl._fp8_flash_mla_kernel(impl, q, torch.zeros(3, 64, 656, dtype=torch.uint8),
                                                      torch.zeros(2, 1, 2048, dtype=torch.int32), None)  # fmt: skip
    assert got == ("out", "lse") and calls == [((2, 1, 16, 576), (3, 64, 656), (2, 1, 2048), 0.07)]


def test_the_service_is_sized_for_vllms_decode_batch():
    from types import SimpleNamespace

    from vllm.config import SchedulerConfig, SpeculativeConfig

    # the fields read exist on vLLM's own config classes
    assert {"max_num_seqs"} <= set(SchedulerConfig.__dataclass_fields__)
    assert {"num_speculative_tokens"} <= set(SpeculativeConfig.__dataclass_fields__)

    def cfg(seqs, spec):
        return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=seqs), speculative_config=spec)

    assert decode_rows(cfg(256, None)) == 256
    assert decode_rows(cfg(64, SimpleNamespace(num_speculative_tokens=3))) == 256  # MTP: 4 query rows each
    assert decode_rows(None) is None
