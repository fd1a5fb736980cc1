"""The compiled engine's prefill rewrite (mcore/engines/prefill_pass.py): the attention context handed
to o_proj without its copies (on by default, MCORE_PREFILL_ROWS=0 off).

CPU: on a demo pipeline against the unrewritten prefill bit for bit; the op against prefill_attention.
The other decoder families (Llama, Qwen2) are checked where they are compiled, in
tests/test_compiled_engine.py::test_cpu_compiled_runs_the_other_families.
GPU (pytest -m gpu): the same on CUDA, where the attention kernels write the context tokens-major."""

from __future__ import annotations

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.model.buildargs import BuildArgs
from mcore.ops.attention import prefill_attention, prefill_attention_rows
from mcore.runtime.pipeline import DecoderPipeline

from .pipelines import graph_targets, prefill_outputs

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    args = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=128)
    return build_bundle(args, tmp_path_factory.mktemp("prefill") / "n.bundle", device="cpu").bundle_path


def test_the_prefill_context_reaches_o_proj_without_copies(tiny_bf16, monkeypatch):
    """By default every layer's prefill_attention -> transpose -> reshape is one
    mcore::prefill_attention_rows; the decode step is untouched; the prefill's logits and the caches
    it writes are bit for bit those of the graph as captured (MCORE_PREFILL_ROWS=0), whose compiled
    code is its own."""
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_PREFILL_ROWS", "0")
    plain = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    rows, att = torch.ops.mcore.prefill_attention_rows.default, torch.ops.mcore.prefill_attention.default
    assert graph_targets(pipe, "prefill").count(rows) == layers and att not in graph_targets(pipe, "prefill")
    assert graph_targets(plain, "prefill").count(att) == layers and rows not in graph_targets(plain, "prefill")
    assert graph_targets(pipe, "decode") == graph_targets(plain, "decode")
    assert pipe.runners["prefill"].key != plain.runners["prefill"].key
    ids = pipe.encode(PROMPT)
    assert torch.equal(prefill_outputs(pipe, ids), prefill_outputs(plain, ids))
    assert pipe.generate(PROMPT, 6, stop_at_eos=False).tokens == plain.generate(PROMPT, 6, stop_at_eos=False).tokens


def test_precompiled_regions_carry_the_rows_and_reload_them(tiny_bf16, monkeypatch, tmp_path):
    """As on CUDA by default: each role compiled by regions into an artifact (MCORE_PRECOMPILED=1).
    The prefill with the context rows gives the bits of the one without, and a second pipeline that
    loads the artifact instead of compiling gives them again."""
    monkeypatch.setenv("MCORE_PRECOMPILED", "1")
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    assert torch.ops.mcore.prefill_attention_rows.default in graph_targets(pipe, "prefill")
    reload = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    assert reload.runners["prefill"].artifact is not None and reload.runners["prefill"].cached
    monkeypatch.setenv("MCORE_PREFILL_ROWS", "0")
    plain = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    ids = pipe.encode(PROMPT)
    a = prefill_outputs(pipe, ids)
    assert torch.equal(a, prefill_outputs(reload, ids)) and torch.equal(a, prefill_outputs(plain, ids))


@pytest.mark.parametrize("tokens_major", [True, False])
def test_the_rows_op_is_prefill_attention_as_o_proj_reads_it(tokens_major):
    """GQA (8 query heads on 2 KV heads), q laid out as the decoder makes it (tokens-major) or
    contiguous: the same values as prefill_attention transposed and flattened, a fresh tensor of
    the fake's shape and layout; shapes that do not fit are refused by name."""
    g = torch.Generator().manual_seed(0)
    s, d = 11, 16
    q = torch.randn(1, s, 8, d, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, s, 2, d, generator=g).transpose(1, 2) for _ in range(2))
    if not tokens_major:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = prefill_attention_rows(q, k, v, 0.25)
    ref = prefill_attention(q, k, v, 0.25).transpose(1, 2).reshape(1, s, 8 * d)
    assert out.shape == (1, s, 8 * d) and out.is_contiguous() and torch.equal(out, ref)
    assert out.untyped_storage().data_ptr() not in {t.untyped_storage().data_ptr() for t in (q, k, v)}
    with pytest.raises(ValueError, match="prefill_attention_rows: q"):
        prefill_attention_rows(q, k[:, :, :3], v[:, :, :3], 0.25)


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_rows_op_matches_prefill_attention(dtype):
    """On CUDA (cuDNN or flash, as PyTorch picks), q laid out tokens-major as the decoder makes it:
    the same bits as prefill_attention transposed and flattened, contiguous, at a short and a long prompt."""
    for s, h, kv, d in [(7, 8, 2, 64), (1000, 32, 8, 128)]:
        g = torch.Generator(device="cuda").manual_seed(s)
        q = torch.randn(1, s, h, d, device="cuda", generator=g).to(dtype).transpose(1, 2)
        k, v = (torch.randn(1, s, kv, d, device="cuda", generator=g).to(dtype).transpose(1, 2) for _ in range(2))
        out = prefill_attention_rows(q, k, v, d**-0.5)
        ref = prefill_attention(q, k, v, d**-0.5).transpose(1, 2).reshape(1, s, h * d)
        assert out.is_contiguous() and torch.equal(out, ref), (s, h, kv, d)


@gpu
@needs_cuda
def test_gpu_prefill_keeps_its_bits_without_the_copies(tmp_path, monkeypatch):
    """A bf16 demo pipeline on the GPU: the prefill's logits and the caches it writes bit for bit
    those of the graph as captured (MCORE_PREFILL_ROWS=0), and the same twice."""
    args = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=256)
    bundle = build_bundle(args, tmp_path / "n.bundle", device="cuda").bundle_path
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    pipe = DecoderPipeline(str(bundle), device="cuda", engine="compiled")
    monkeypatch.setenv("MCORE_PREFILL_ROWS", "0")
    plain = DecoderPipeline(str(bundle), device="cuda", engine="compiled")
    assert torch.ops.mcore.prefill_attention_rows.default in graph_targets(pipe, "prefill")
    ids = torch.randint(0, int(pipe.config["vocab_size"]), (1, 200), device="cuda", dtype=torch.int32)

    def out(p):
        for c in p.cache_list:
            c.zero_()
        (logits,) = p.runners["prefill"](ids, *p.cache_list)
        return torch.cat([logits.reshape(-1).float(), *(c.reshape(-1).float() for c in p.cache_list)])

    a = out(pipe)
    assert torch.equal(a, out(pipe)) and torch.equal(a, out(plain))
