"""SGLang 0.5.23: csf behind the "dsa" / "nsa" attention backends, switched on by CSF_SPARSE_MLA (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

from csf_serving_adapters.sglang.attention import CsfDeepseekSparseAttnBackend

_PROBE = """
import json
from csf_serving_adapters.sglang import register
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
register(); register()
print(json.dumps({n: ATTENTION_BACKENDS[n].__module__ + "." + ATTENTION_BACKENDS[n].__name__ for n in ("dsa", "nsa")}))
"""


@pytest.mark.parametrize("switch", ["1", "0"])
def test_the_switch_decides_what_dsa_builds(switch):
    env = dict(os.environ, CSF_SPARSE_MLA=switch)
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    ours = "csf_serving_adapters.sglang.attention.create_backend"
    assert (set(got.values()) == {ours}) is (switch == "1"), got


def _backend(fmt, fp8=True):
    b = object.__new__(CsfDeepseekSparseAttnBackend)  # no GPU: only the method under test
    b.dsa_kv_cache_store_fp8, b.flashmla_kv_format = fp8, fmt
    return b


def test_the_fp8_decode_call_goes_to_csf_and_other_caches_keep_flashmla(monkeypatch):
    assert issubclass(CsfDeepseekSparseAttnBackend, DeepseekSparseAttnBackend)
    calls = []

    class Service:
        def decode(self, q, kv, indices, sm_scale):
            calls.append((q.shape, indices.shape, sm_scale))
            return "out", "lse"

    from csf_serving_adapters.sglang import attention

    monkeypatch.setattr(attention, "service", lambda: Service())
    monkeypatch.setattr(DeepseekSparseAttnBackend, "_forward_flashmla_kv", lambda self, *a: "flashmla")
    layer = SimpleNamespace(tp_q_head_num=16, head_dim=576)
    args = (torch.zeros(4, 16 * 576, dtype=torch.bfloat16), torch.zeros(2, 64, 656, dtype=torch.uint8), 512, 0.05,
            layer, None, torch.zeros(4, 2048, dtype=torch.int32))  # fmt: skip
    assert _backend("V32")._forward_flashmla_kv(*args) == "out"
    assert calls == [((4, 1, 16, 576), (4, 1, 2048), 0.05)]
    assert _backend("V32_NO_ROPE")._forward_flashmla_kv(*args) == "flashmla"
    assert _backend("V32", fp8=False)._forward_flashmla_kv(*args) == "flashmla"


def test_the_service_is_sized_by_sglangs_cuda_graph_state(monkeypatch):
    sized = []
    from csf_serving_adapters.sglang import attention

    monkeypatch.setattr(attention, "service", lambda rows=None: sized.append(rows))
    monkeypatch.setattr(DeepseekSparseAttnBackend, "init_cuda_graph_state", lambda self, bs, tokens: None)
    _backend("V32").init_cuda_graph_state(64, 256)  # 64 requests, 4 query rows each (speculative decoding)
    assert sized == [256]
