"""MCORE_GEMV_PREFETCH=<MB>: each one-row product of the decode step asks L2 for the next product's
weight in its layer (mcore/engines/prefetch_pass.py, the kernel's PREFETCH in mcore/ops/gemv_kernel.py).

CPU: which products prefetch which weights, how many bytes and halves, on the Qwen3 demo with the
defaults and with the norms folded; the same tokens and logits as without; its own compile key; a
bad size is one line, exit 2. GPU: the kernel's values are those without the prefetch, bit for bit,
at the 8B shapes and in a CUDA graph (the prefetch changes where bytes wait, never a value); the
compiled build for sm_90 is checked in tests/test_triton_sm90.py."""

from __future__ import annotations

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.engines.gemv_pass import GEMV_OPS
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

from .conftest import assert_user_error

MB = 1 << 20


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    args = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=128)
    return build_bundle(args, tmp_path_factory.mktemp("prefetch") / "n.bundle", device="cpu").bundle_path


def _products(pipe: DecoderPipeline) -> list[torch.fx.Node]:
    return [n for n in pipe.runners["decode"].prepared.gm.graph.nodes if n.target in GEMV_OPS]


def _weight(n: torch.fx.Node) -> torch.fx.Node:
    return n.args[3] if n.target is torch.ops.mcore.rms_gemv.default else n.args[1]


def _prefetch(n: torch.fx.Node) -> tuple | None:
    """(weight node, bytes, halves) the product prefetches, or None."""
    base = {torch.ops.mcore.rms_gemv.default: 5, torch.ops.mcore.gemv_add.default: 3}.get(n.target, 2)
    return tuple(n.args[base:]) if len(n.args) > base else None


def _nbytes(pipe: DecoderPipeline, node: torch.fx.Node) -> int:
    gm = pipe.runners["decode"].prepared.gm
    placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
    w = pipe.runners["decode"].prepared.state_args[placeholders.index(node)]
    return w.numel() * w.element_size()


def test_each_product_prefetches_the_next_one_in_its_layer(tiny_bf16, monkeypatch):
    """With the defaults (gating in gate/up): q/k/v prefetches o_proj's weight across the attention,
    o_proj the gate/up weight's two halves across the add + RMSNorm; gate/up feeds down directly
    (nothing between them to hide under), down's next product is another layer's (a regional compile
    shares one region's code across layers), lm_head is last: those three prefetch nothing. The size
    is capped at the MB asked for; the tokens and logits are those without the prefetch."""
    monkeypatch.setenv("MCORE_GEMV", "1")
    plain = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_GEMV_PREFETCH", "0.015625")  # 16 KB: less than gate/up's weight
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    products = _products(pipe)
    assert len(products) == 4 * layers + 1
    for i in range(layers):
        qkv, o, gu, down = products[4 * i : 4 * i + 4]
        assert gu.target is torch.ops.mcore.gemv_glu.default and down.args[0] is gu
        assert _prefetch(qkv) == (_weight(o), min(16 * 1024, _nbytes(pipe, _weight(o))), 1)
        assert _nbytes(pipe, _weight(gu)) > 16 * 1024
        assert _prefetch(o) == (_weight(gu), 16 * 1024, 2)
        assert _prefetch(gu) is None and _prefetch(down) is None
    assert _prefetch(products[-1]) is None  # lm_head
    assert all(_prefetch(n) is None for n in _products(plain))
    assert pipe.runners["decode"].key != plain.runners["decode"].key  # its own compiled code
    prompt = "the quick brown fox"
    r = pipe.generate(prompt, 8, stop_at_eos=False)
    assert r.tokens == plain.generate(prompt, 8, stop_at_eos=False).tokens
    a = pipe.step_logits(r.prompt_tokens, r.tokens[:-1])
    b = plain.step_logits(r.prompt_tokens, r.tokens[:-1])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_with_the_norms_folded_only_the_attention_gap_is_left(tiny_bf16, monkeypatch):
    """MCORE_GEMV_NORM=1 folds the add + RMSNorm into the products: gate/up (mcore::rms_gemv) then
    reads o_proj's row directly, so only q/k/v prefetches (o_proj's weight, across the attention)."""
    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_NORM", "1")
    monkeypatch.setenv("MCORE_GEMV_PREFETCH", "16")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    products = _products(pipe)
    for i in range(layers):
        qkv, o, gu, down = products[4 * i : 4 * i + 4]
        assert qkv.target is torch.ops.mcore.rms_gemv.default and gu.args[0] is o
        assert _prefetch(qkv) == (_weight(o), _nbytes(pipe, _weight(o)), 1)  # all of it: under 16 MB
        assert _prefetch(o) is None and _prefetch(gu) is None and _prefetch(down) is None
    r = pipe.generate("the quick brown fox", 4, stop_at_eos=False)
    assert len(r.tokens) == 4


def test_a_bad_prefetch_size_is_one_line(tiny_bf16, monkeypatch, mcore):
    monkeypatch.setenv("MCORE_GEMV", "1")
    for bad in ("lots", "-1", "4096"):
        monkeypatch.setenv("MCORE_GEMV_PREFETCH", bad)
        assert_user_error(
            mcore("run", tiny_bf16, "--prompt", "x", "--engine", "compiled"),
            f"MCORE_GEMV_PREFETCH: {bad!r} is not a size in MB",
        )


gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@needs_cuda
def test_gpu_prefetch_changes_no_value(monkeypatch):
    """At the 8B shapes, each product with the prefetch of the next one's weight (and its weight read
    evict-first) gives the bits it gives without, run to run and replayed in a CUDA graph."""
    from mcore.ops.gemv import gemv_triton

    monkeypatch.setenv("MCORE_GEMV_PREFETCH", "16")  # the weight loads' evict-first policy
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 1, 4096, device="cuda", generator=g).to(torch.bfloat16)
    r = torch.randn(1, 1, 4096, device="cuda", generator=g).to(torch.bfloat16)
    qkv, o = (torch.randn(n, 4096, device="cuda", generator=g).to(torch.bfloat16) * 0.02 for n in (6144, 4096))
    gu = torch.randn(24576, 4096, device="cuda", generator=g).to(torch.bfloat16) * 0.02
    cases = [
        (dict(weight=qkv), o, 32 * MB, 1),
        (dict(weight=o, residual=r), gu, 16 * MB, 2),
        (dict(weight=gu, glu=True), o, 64 * MB, 1),  # asks for more than the weight: capped at its size
        (dict(weight=qkv), gu, 1 << 30, 2),  # more than a line a thread of the grid: capped too
    ]
    for kw, nxt, size, halves in cases:
        want = gemv_triton(x, **kw)
        got = gemv_triton(x, **kw, prefetch=nxt, prefetch_size=size, prefetch_halves=halves)
        assert torch.equal(got, want), (tuple(kw["weight"].shape), size)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            again = gemv_triton(x, **kw, prefetch=nxt, prefetch_size=size, prefetch_halves=halves)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(again, want), (tuple(kw["weight"].shape), size)
