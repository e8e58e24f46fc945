"""bench_mla's ``flashmla`` arm (benchmarks/peer_flashmla.py) on the CPU: the staged tree's manifest, csf's problem
instances in FlashMLA's sparse-decode layout (checked against what FlashMLA computes on its inputs, and where
FlashMLA is staged, against its own tests/quant.py), and the arm's skip and refusal paths. FlashMLA's kernels need
the device (scripts/build_flashmla.sh, then bench_mla --arms csf,flashmla)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from csf_attention import dequantize_records, sparse_mla_reference, write_kv
from csf_kernels.mla.layout import HEAD_DIM, LATENT, PAGE_SIZE, RECORD_BYTES, VALUE_DIM
from tests.attention.mla_cases import mla_inputs
from tests.repo_scripts import ROOT, load_script

peer = load_script("benchmarks/peer_flashmla.py", "peer_flashmla")
bench = load_script("benchmarks/bench_mla.py", "bench_mla")
manifest = peer.manifest
PIN = peer.pinned_commit()
STAGED = ROOT / ".peers" / "flashmla"
FLASHMLA_GIT = Path("/work/.mirror/deepseek-ai+FlashMLA/repo")


def _fake_stage(root: Path, commit: str = PIN) -> Path:
    for rel in ("flashmla/csrc/params.h", "cutlass/include/cutlass/cutlass.h"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"// {rel}\n")
    manifest.write_manifest(root, commit, "c" * 40)
    return root


# ---- the staged tree's manifest


def test_manifest_accepts_the_tree_it_describes(tmp_path):
    doc = manifest.check_manifest(_fake_stage(tmp_path), PIN)
    assert doc["files"] == 2 and doc["flashmla_commit"] == PIN


def test_manifest_refuses_a_changed_file_a_new_file_and_another_commit(tmp_path):
    staged = _fake_stage(tmp_path)
    (staged / "flashmla/csrc/params.h").write_text("// edited\n")
    with pytest.raises(manifest.ManifestError, match="differs from what was staged"):
        manifest.check_manifest(staged, PIN)
    staged = _fake_stage(tmp_path / "b")
    (staged / "cutlass/include/extra.h").write_text("")
    with pytest.raises(manifest.ManifestError, match="differs"):
        manifest.check_manifest(staged)
    with pytest.raises(manifest.ManifestError, match="not the pinned"):
        manifest.check_manifest(_fake_stage(tmp_path / "c", "0" * 40), PIN)


def test_manifest_refuses_a_missing_or_malformed_manifest(tmp_path):
    with pytest.raises(manifest.ManifestError, match=r"stage_flashmla\.sh"):
        manifest.check_manifest(tmp_path, PIN)
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"flashmla_commit": PIN}))
    with pytest.raises(manifest.ManifestError, match="lacks cutlass_commit, tree_sha256"):
        manifest.check_manifest(tmp_path, PIN)
    (tmp_path / manifest.MANIFEST).write_text("[1, 2]")
    with pytest.raises(manifest.ManifestError, match="not a manifest"):
        manifest.check_manifest(tmp_path, PIN)


def test_manifest_command_line_exit_codes(tmp_path):
    script = ROOT / "scripts" / "flashmla" / "manifest.py"
    run = lambda *a: subprocess.run(["python3", str(script), *a], capture_output=True, text=True)  # noqa: E731
    assert run("check", str(tmp_path)).returncode == 1
    assert run("write", str(tmp_path), PIN, "c" * 40).returncode == 0
    assert run("check", str(tmp_path), PIN).returncode == 0
    assert run("check", str(tmp_path), "0" * 40).returncode == 1
    assert run("bogus").returncode == 2


def test_the_pin_is_the_scripts_and_the_issues_commit():
    assert PIN.startswith("9241ae3") and len(PIN) == 40


@pytest.mark.skipif(not FLASHMLA_GIT.is_dir(), reason="no FlashMLA mirror here (the fetch tool's)")
def test_stage_script_refuses_another_commit():
    other = subprocess.run(["git", "-C", str(FLASHMLA_GIT), "rev-parse", f"{PIN}~1"], capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    done = subprocess.run(["bash", str(ROOT / "scripts" / "stage_flashmla.sh")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "FLASHMLA_REF": other})  # fmt: skip
    assert done.returncode == 2
    assert f"only the pinned {PIN} is staged" in done.stderr


@pytest.mark.skipif(not (STAGED / manifest.MANIFEST).is_file(), reason="FlashMLA not staged (stage_flashmla.sh)")
def test_staged_tree_is_intact_and_holds_only_the_sparse_decode():
    doc = manifest.check_manifest(STAGED, PIN)
    assert doc["bytes"] < 16 << 20  # the included CUTLASS headers, not CUTLASS
    cu = sorted(p.relative_to(STAGED / "flashmla").as_posix() for p in (STAGED / "flashmla").rglob("*.cu"))
    assert cu == sorted(
        ["csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu", "csrc/smxx/decode/combine/combine.cu",
         "csrc/sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu",
         "csrc/sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu"]
    )  # fmt: skip


# ---- csf's instances in FlashMLA's layout


def _flashmla_decode_reference(x, sm_scale):
    """What FlashMLA's sparse decode computes on its inputs (its tests/ref.py, ``ref_sparse_attn_decode``), keys
    read by its documented V32 record (flash_mla_with_kvcache's docstring): candidates of id -1 are skipped, the
    rest gathered from the flat cache; out [b, s_q, h, 512], lse [b, h, s_q]."""
    flat = x.k_cache.reshape(-1, RECORD_BYTES)
    nope = flat[:, :LATENT].view(torch.float8_e4m3fn).float().reshape(-1, 4, 128)
    scales = flat[:, LATENT : LATENT + 16].contiguous().view(torch.float32)
    rope = flat[:, LATENT + 16 :].contiguous().view(torch.bfloat16).float()
    keys = torch.cat([(nope * scales[..., None]).reshape(-1, LATENT), rope], dim=1)
    b, s_q, h, _ = x.q.shape
    idx = x.indices.reshape(b * s_q, -1)
    gathered = keys[idx.clamp_min(0).long()]  # [rows, topk, 576]
    scores = torch.einsum("rhd,rkd->rhk", x.q.reshape(b * s_q, h, HEAD_DIM).float(), gathered) * sm_scale
    scores = scores.masked_fill((idx == -1)[:, None, :], float("-inf"))
    lse = scores.logsumexp(-1)
    out = torch.exp(scores - lse[..., None]) @ gathered[..., :VALUE_DIM]
    lonely = lse == float("-inf")
    out[lonely] = 0.0
    lse[lonely] = float("inf")
    return out.reshape(b, s_q, h, VALUE_DIM), lse.reshape(b, s_q, h).transpose(1, 2)


@pytest.mark.parametrize(("heads", "s_q"), [(16, 2), (32, 1), (64, 2), (128, 1)])
def test_flashmla_inputs_compute_csfs_function(heads, s_q):
    """Every skip of csf's (-1, at or past the row's length, past the cache) is FlashMLA's -1; padded heads and
    the reshapes give back csf's rows: FlashMLA's semantics on the converted inputs equal csf's reference."""
    gen = torch.Generator().manual_seed(heads + s_q)
    rows = 4
    lengths = [64, 37, 0, 64][:rows]
    c = mla_inputs(gen, rows=rows, heads=heads, topk=64, pages=3, lengths=lengths)
    x = peer.to_flashmla(c.q, c.kv_cache, c.indices, c.lengths, s_q)
    assert x.q.shape == (rows // s_q, s_q, peer.padded_heads(heads), HEAD_DIM)
    assert x.k_cache.data_ptr() == c.kv_cache.data_ptr() and x.k_cache.stride(1) == RECORD_BYTES
    assert x.indices.dtype == torch.int32 and x.indices.is_contiguous()
    out, lse = peer.from_flashmla(*_flashmla_decode_reference(x, c.sm_scale), heads)
    want, want_lse = sparse_mla_reference(c.q, c.kv_cache, c.indices, c.lengths, c.sm_scale)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    live = torch.isfinite(want_lse)
    assert not live[2].any() and live[0].all()  # row 2 has no live candidate: csf -inf, FlashMLA +inf
    torch.testing.assert_close(lse[live], want_lse[live], rtol=1e-5, atol=1e-5)
    assert (lse[~live] == float("inf")).all()


def test_padded_heads_and_refused_shapes():
    assert [peer.padded_heads(h) for h in (1, 16, 32, 64, 128)] == [64, 64, 64, 64, 128]
    for bad in (0, 96, 256):
        with pytest.raises(ValueError, match="64 or 128 heads"):
            peer.padded_heads(bad)
    c = mla_inputs(torch.Generator().manual_seed(0), rows=3, heads=16, topk=8, pages=1, lengths=[8, 8, 8])
    with pytest.raises(ValueError, match="whole number"):
        peer.to_flashmla(c.q, c.kv_cache, c.indices, c.lengths, 2)
    with pytest.raises(ValueError, match="contiguous"):
        wide = torch.zeros(1, PAGE_SIZE, RECORD_BYTES + 16, dtype=torch.uint8)
        peer.to_flashmla(c.q, wide[..., :RECORD_BYTES], c.indices, c.lengths, 1)
    with pytest.raises(ValueError, match="bf16"):
        peer.to_flashmla(c.q.float(), c.kv_cache, c.indices, c.lengths, 1)


def test_outputs_map_back_to_rows():
    b, s_q, h, heads = 2, 3, 64, 16
    out = torch.arange(b * s_q * h * VALUE_DIM, dtype=torch.float32).reshape(b, s_q, h, VALUE_DIM)
    lse = torch.arange(b * h * s_q, dtype=torch.float32).reshape(b, h, s_q)
    rows_out, rows_lse = peer.from_flashmla(out, lse, heads)
    assert rows_out.shape == (b * s_q, heads, VALUE_DIM) and rows_lse.shape == (b * s_q, heads)
    assert torch.equal(rows_out[1 * s_q + 2, 5], out[1, 2, 5])
    assert rows_lse[1 * s_q + 2, 5] == lse[1, 5, 2]


@pytest.fixture(scope="module")
def flashmla_quant():
    if not (STAGED / "flashmla" / "tests" / "quant.py").is_file():
        pytest.skip("FlashMLA not staged (scripts/stage_flashmla.sh)")
    return load_script(".peers/flashmla/flashmla/tests/quant.py", "flashmla_quant")


def test_flashmla_quantizes_tokens_into_csfs_records(flashmla_quant):
    """FlashMLA's own V32 quantizer (tests/quant.py) writes the bytes csf's write_kv writes, and its dequantizer
    reads csf's records as csf does (its bf16 result: exact, E4M3 times a power of two)."""
    gen = torch.Generator().manual_seed(3)
    pages = 2
    tokens = torch.randn(pages * PAGE_SIZE, HEAD_DIM, generator=gen).to(torch.bfloat16)
    kv = torch.empty(pages, PAGE_SIZE, RECORD_BYTES, dtype=torch.uint8)
    write_kv(kv, torch.arange(pages * PAGE_SIZE), tokens[:, :LATENT].float(), tokens[:, LATENT:].float())
    layout = flashmla_quant.FP8KVCacheLayout.V32_FP8Sparse
    theirs = flashmla_quant.quantize_k_cache(tokens.view(pages, PAGE_SIZE, 1, HEAD_DIM), layout)
    assert torch.equal(theirs.contiguous().view(torch.uint8).reshape(kv.shape), kv)
    c = mla_inputs(gen, rows=2, heads=64, topk=8, pages=pages, lengths=[8, 8])
    x = peer.to_flashmla(c.q, c.kv_cache, c.indices, c.lengths, 1)
    # the kernel takes the bytes as uint8; FlashMLA's own tests hold them as float8_e4m3fn, as its dequantizer reads
    read = flashmla_quant.dequantize_k_cache(x.k_cache.view(torch.float8_e4m3fn), layout).reshape(-1, HEAD_DIM)
    assert torch.equal(read.float(), dequantize_records(c.kv_cache.reshape(-1, RECORD_BYTES)))


# ---- the arm in bench_mla: skipped, or refused, never a made-up figure


def test_arms_are_parsed_with_csf_required():
    assert bench.parse_arms("csf,flashmla") == ("csf", "flashmla")
    for bad in ("flashmla", "csf,flash", ""):
        with pytest.raises(Exception, match="csf among them"):
            bench.parse_arms(bad)


def test_arm_not_asked_for_has_no_status(tmp_path):
    assert bench.peer_of(("csf",), tmp_path) == (None, None)


def test_arm_is_skipped_with_its_reason(tmp_path, capsys):
    module, st = bench.peer_of(("csf", "flashmla"), tmp_path / "none")
    assert module is None and not st["available"] and "stage_flashmla.sh" in st["why"]
    assert "flashmla arm skipped" in capsys.readouterr().out
    module, st = bench.peer_of(("csf", "flashmla"), _fake_stage(tmp_path / "staged"))
    assert module is None and "not built" in st["why"] and "build_flashmla.sh" in st["why"]
    assert st["flashmla_commit"] == PIN
    (tmp_path / "staged" / "build" / "flash_mla").mkdir(parents=True)
    (tmp_path / "staged" / "build" / "flash_mla" / "cuda.so").write_bytes(b"")
    if not torch.cuda.is_available():
        assert "no SM90 GPU" in bench.peer_of(("csf", "flashmla"), tmp_path / "staged")[1]["why"]


class _WrongFlashMLA:
    """A stand-in whose output is off (or NaN): the arm must report the error and no time, before any capture."""

    def __init__(self, fill):
        self.fill = fill

    def get_mla_metadata(self):
        return object(), None

    def flash_mla_with_kvcache(self, q, k_cache, block_table, seqlens, d_v, sched, **kw):
        b, s_q, h, _ = q.shape
        out = torch.full((b, s_q, h, d_v), self.fill, dtype=torch.bfloat16)
        return out, torch.zeros(b, h, s_q)


@pytest.mark.parametrize("fill", [0.0, float("nan")])
def test_arm_refuses_a_time_when_the_output_is_wrong(fill, monkeypatch):
    monkeypatch.setattr(bench, "capture", lambda fn: pytest.fail("timed a wrong output"))
    c = mla_inputs(torch.Generator().manual_seed(1), rows=2, heads=16, topk=16, pages=1, lengths=[16, 16])
    arm = bench.flashmla_arm(_WrongFlashMLA(fill), c.q, c.kv_cache, c.indices, c.lengths, [c.indices], 1,
                             c.sm_scale, reps=1, flush=None, copy_gbps=1.0)  # fmt: skip
    assert arm["median_us"] is None and not arm["correct"] and "no time" in arm["why"]
    assert arm["heads_run"] == 64 and "samples_s" not in arm
