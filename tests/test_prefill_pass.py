"""The compiled engine's prefill rewrites (mcore/engines/prefill_pass.py) and mcore::matmul_glu
(mcore/ops/glu_matmul.py).

CPU: the attention context handed to o_proj without its copies (on by default, MCORE_PREFILL_ROWS=0
off) and the gating moved into the gate/up product (MCORE_PREFILL_GLU=1) on a demo pipeline, each
against the unrewritten prefill bit for bit; the op against prefill_attention; the GLU kernel under
Triton's interpreter against float64. GPU (pytest -m gpu): the kernel in bf16 and fp16 at the 8B
shapes against float64, pointer and TMA forms, and a pipeline with it."""

from __future__ import annotations

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.model.buildargs import BuildArgs
from mcore.ops.attention import prefill_attention, prefill_attention_rows
from mcore.runtime.pipeline import DecoderPipeline

from .conftest import run_under_triton_interpreter

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    args = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=128)
    return build_bundle(args, tmp_path_factory.mktemp("prefill") / "n.bundle", device="cpu").bundle_path


def _targets(pipe: DecoderPipeline, role: str) -> list:
    return [n.target for n in pipe.runners[role].prepared.gm.graph.nodes]


def _prefill_logits(pipe: DecoderPipeline, ids: list[int]) -> torch.Tensor:
    for c in pipe.cache_list:
        c.zero_()
    (logits,) = pipe.runners["prefill"](torch.tensor([ids], dtype=torch.int32), *pipe.cache_list)
    return torch.cat([logits.reshape(-1).float(), *(c.reshape(-1).float() for c in pipe.cache_list)])


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
    assert _targets(pipe, "prefill").count(rows) == layers and att not in _targets(pipe, "prefill")
    assert _targets(plain, "prefill").count(att) == layers and rows not in _targets(plain, "prefill")
    assert _targets(pipe, "decode") == _targets(plain, "decode")
    assert pipe.runners["prefill"].key != plain.runners["prefill"].key
    ids = pipe.encode(PROMPT)
    assert torch.equal(_prefill_logits(pipe, ids), _prefill_logits(plain, ids))
    assert pipe.generate(PROMPT, 6, stop_at_eos=False).tokens == plain.generate(PROMPT, 6, stop_at_eos=False).tokens


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


def test_the_prefill_gating_moves_into_the_gate_up_product(tiny_bf16, monkeypatch):
    """MCORE_PREFILL_GLU=1: each layer's fused gate/up product and its silu(gate) * up become one
    mcore::matmul_glu over the concatenated weight, read straight by down_proj; no silu left in the
    prefill, the decode step untouched, compiled code of its own; on the CPU (the library product,
    then the gating from the rounded halves) the same bits as the unfused prefill."""
    plain = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_PREFILL_GLU", "1")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    gm = pipe.runners["prefill"].prepared.gm
    glu = [n for n in gm.graph.nodes if n.target is torch.ops.mcore.matmul_glu.default]
    assert len(glu) == layers and all(n.args[1].name.startswith("mcore_fused_weight_") for n in glu)
    assert all([u.target for u in n.users] == [torch.ops.aten.linear.default] for n in glu)
    assert torch.ops.aten.silu.default not in _targets(pipe, "prefill")
    assert _targets(pipe, "decode") == _targets(plain, "decode")
    assert pipe.runners["prefill"].key != plain.runners["prefill"].key
    ids = pipe.encode(PROMPT)
    assert torch.equal(_prefill_logits(pipe, ids), _prefill_logits(plain, ids))


_INTERP_GLU = r"""
import json, sys, torch
from mcore.ops.gemv import silu_mul
from mcore.ops.glu_matmul import glu_matmul_triton
out = []
for m, n, k, dt, cfg in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(m + n + k)
    dtype = getattr(torch, dt)
    x = torch.randn(1, m, k, generator=g).to(dtype)
    w = torch.randn(2 * n, k, generator=g).to(dtype)
    y = glu_matmul_triton(x, w, tuple(cfg), tma=False)
    prod = x.double().reshape(m, k) @ w.double().T
    ref = silu_mul(prod[:, :n].to(dtype), prod[:, n:].to(dtype)).double()  # halves rounded as stored
    err = ((y.double().reshape(m, n) - ref).abs() / (ref.abs() + 1e-2 * ref.abs().max())).max().item()
    out.append({"shape": list(y.shape), "err": err, "same": bool(torch.equal(y, glu_matmul_triton(x, w, tuple(cfg), tma=False)))})
print(json.dumps(out))
"""

# (rows, output columns, K, dtype, (BM, BN, BK, GROUP_M, warps, stages)): rows and columns that fill
# no tile evenly, one row, several K steps. bf16 is left to the GPU test: Triton's interpreter
# computes bf16 tl.dot wrongly (3.9: errors of 1e10 on a 16 x 16 product)
GLU_CASES = [
    (37, 48, 64, "float16", (32, 16, 32, 2, 4, 2)),
    (1, 40, 96, "float16", (16, 32, 32, 1, 4, 2)),
    (70, 33, 32, "float32", (32, 16, 16, 4, 4, 2)),
]


def test_the_glu_kernel_matches_float64_under_the_triton_interpreter():
    for case, res in zip(GLU_CASES, run_under_triton_interpreter(_INTERP_GLU, GLU_CASES), strict=True):
        m, n, _, dt, _ = case
        assert res["shape"] == [1, m, n] and res["same"], (case, res)
        # the halves and the output each one rounding (the interpreter truncates: up to 2 ulp); near
        # zero the error is measured against a hundredth of the largest value
        assert res["err"] < (1e-5 if dt == "float32" else 4 * 2**-10), (case, res)


def test_bad_glu_inputs_are_refused():
    from mcore.ops.glu_matmul import glu_matmul_triton

    with pytest.raises(ValueError, match="does not fit weight"):
        glu_matmul_triton(torch.zeros(1, 3, 64, dtype=torch.float16), torch.zeros(7, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="not a multiple of the tile"):
        glu_matmul_triton(torch.zeros(1, 3, 40, dtype=torch.float16), torch.zeros(8, 40, dtype=torch.float16))


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_glu_kernel_at_the_8b_shapes(dtype):
    """Qwen3-8B's gate/up product with its gating, at a short and a long prompt and an odd shape:
    both forms (pointer loads; TMA where the card and Triton have it) against float64 of the halves
    rounded as stored, bit-equal run to run."""
    from mcore.ops.gemv import silu_mul
    from mcore.ops.glu_matmul import _tma, glu_matmul_triton

    for m, n, k in [(300, 12288, 4096), (2048, 12288, 4096), (77, 200, 320)]:
        g = torch.Generator(device="cuda").manual_seed(m + n)
        x = torch.randn(1, m, k, device="cuda", generator=g).to(dtype)
        w = (torch.randn(2 * n, k, device="cuda", generator=g) * k**-0.5).to(dtype)
        prod = x.double().reshape(m, k) @ w.double().T
        ref = silu_mul(prod[:, :n].to(dtype), prod[:, n:].to(dtype)).double()
        for tma in [False, True] if _tma() and torch.cuda.get_device_capability()[0] >= 9 else [False]:
            y = glu_matmul_triton(x, w, tma=tma)
            assert torch.equal(y, glu_matmul_triton(x, w, tma=tma)), (m, n, k, tma)
            err = (y.double().reshape(m, n) - ref).abs()
            # fp32 sums in another order may move a half across one rounding step: within a step of
            # each half (scaled by the gating's slope), and exact for almost every element
            ulp = 2**-7 if dtype == torch.bfloat16 else 2**-10
            assert (err <= 4 * ulp * (ref.abs() + 1)).all(), (m, n, k, tma, err.max().item())
            assert (err == 0).double().mean().item() > 0.9, (m, n, k, tma)


@gpu
@needs_cuda
def test_gpu_prefill_with_the_glu_kernel(tmp_path, monkeypatch):
    """A bf16 demo pipeline on the GPU with MCORE_PREFILL_GLU=1: the prefill's logits the same twice,
    close to the default prefill's (the gating's kernel sums in its own order), the same greedy
    tokens; with the context rows on in both."""
    args = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=256)
    bundle = build_bundle(args, tmp_path / "n.bundle", device="cuda").bundle_path
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    plain = DecoderPipeline(str(bundle), device="cuda", engine="compiled")
    monkeypatch.setenv("MCORE_PREFILL_GLU", "1")
    pipe = DecoderPipeline(str(bundle), device="cuda", engine="compiled")
    assert torch.ops.mcore.matmul_glu.default in _targets(pipe, "prefill")
    ids = torch.randint(0, int(pipe.config["vocab_size"]), (1, 200), device="cuda", dtype=torch.int32)

    def logits(p):
        for c in p.cache_list:
            c.zero_()
        return p.runners["prefill"](ids, *p.cache_list)[0].float()

    a, b = logits(pipe), logits(plain)
    assert torch.equal(a, logits(pipe))
    assert torch.nn.functional.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)).item() > 0.999
    assert pipe.generate(PROMPT, 8, stop_at_eos=False).tokens == plain.generate(PROMPT, 8, stop_at_eos=False).tokens
