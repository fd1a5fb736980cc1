"""mcore::rope_decode_attention (mcore/ops/rope_attention.py): the decode step's q/k norms, rotary
embedding and cache writes in the attention's split kernel, and the compiled engine's rewrite to it
(on by default, MCORE_ATTN_ROPE=0 turns it off; mcore/engines/rope_pass.py).

CPU: the Triton kernel under Triton's interpreter against float64 (in a subprocess), and the rewrite on
demo pipelines (the op runs the unfused computation on CPU). GPU (pytest -m gpu): the compiled kernel at
the Qwen3-8B shapes against the unfused path and float64, run to run and inside a CUDA graph."""

from __future__ import annotations

import json

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

from .conftest import run_under_triton_interpreter

# (heads, kv heads, head_dim, capacity, cached before the step, new tokens, dtype, splits, q/k norms)
CASES = [
    (8, 2, 64, 300, 128, 1, "float16", 5, True),  # the new key opens a block
    (8, 8, 32, 64, 0, 1, "float16", 3, True),  # the first token: the cache was empty
    (4, 1, 128, 200, 196, 3, "float16", 4, False),  # several new tokens, no q/k norms (Llama)
    (16, 2, 64, 130, 127, 3, "float16", 7, True),  # fills the cache to its capacity
    (8, 2, 64, 300, 128, 1, "bfloat16", 5, True),  # bf16 (the interpreter truncates where the GPU rounds)
]

_INTERP = r"""
import json, sys, torch
from mcore.ops import flash_decode as fd
from mcore.ops.rope_attention import rope_decode_attention
from tests.test_rope_attention import exact_reference, rope_tables

out = []
for h, kv, d, cap, cached, s, dt, ns, norm in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(h * 1000 + cached)
    dtype = getattr(torch, dt)
    qkv = (2 * torch.randn(1, s, (h + 2 * kv) * d, generator=g)).to(dtype)
    qn = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype) if norm else None
    kn = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype) if norm else None
    cos_t, sin_t = rope_tables(cap, d, "cpu")
    kc = torch.randn(1, kv, cap, d, generator=g).to(dtype)
    vc = torch.randn(1, kv, cap, d, generator=g).to(dtype)
    length = torch.tensor([cached], dtype=torch.int32)
    scale = d ** -0.5
    ref, k64, v64 = exact_reference(qkv, qn, kn, 1e-6, cos_t, sin_t, kc, vc, cached, scale)
    caches = [(kc.clone(), vc.clone()) for _ in range(4)]
    a = fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, *caches[0], length, scale, nsplit=ns)
    b = fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, *caches[1], length, scale, nsplit=ns)
    qi, li = fd.decode_inputs_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, *caches[3], length, scale)  # the prologue alone
    ai = fd.decode_attention(qi, *caches[3], li, nsplit=ns)
    u = rope_decode_attention(qkv, qn, kn, 1e-6, cos_t, sin_t, *caches[2], length, scale)  # CPU: the unfused path
    new = slice(cached, cached + s)
    rel = lambda t, r: ((t.double() - r).norm() / r.norm()).item()
    old = [i for i in range(cap) if not cached <= i < cached + s]
    out.append({
        "rel": rel(a, ref), "unfused_rel": rel(u, ref), "floor": rel(ref.to(dtype), ref),
        "same": bool(torch.equal(a, b) and torch.equal(caches[0][0], caches[1][0])),
        "inputs_same": bool(torch.equal(ai, a) and all(torch.equal(x, y) for x, y in zip(caches[3], caches[0]))
                            and li.dtype == torch.int32 and li.tolist() == [cached + s]),
        "k_rel": rel(caches[0][0][:, :, new], k64[:, :, new]), "k_floor": rel(k64[:, :, new].to(dtype), k64[:, :, new]),
        "v_new": bool(torch.equal(caches[0][1][:, :, new], v64[:, :, new].to(dtype))),
        "rest_kept": all(bool(torch.equal(c[:, :, old], o[:, :, old])) for c, o in ((caches[0][0], kc), (caches[0][1], vc))),
    })
print(json.dumps(out))
"""


def rope_tables(capacity: int, d: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 cos and sin tables [capacity, d] (theta 1e6, Qwen3's)."""
    ang = torch.arange(capacity, device=device).float()[:, None] * (1e6 ** -(torch.arange(0, d, 2, device=device) / d))
    return torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()


def exact_reference(qkv, q_norm, k_norm, eps, cos_t, sin_t, k_cache, v_cache, cached, scale):
    """(context, k cache, v cache) in float64 on the CPU: the norms and the rotation exact, the cos and sin
    rows rounded to the model dtype as the decoder reads them, then decode_attention_reference."""
    from mcore.ops.attention import decode_attention_reference

    kvh, d, s = k_cache.shape[1], k_cache.shape[3], qkv.shape[1]
    h = qkv.shape[-1] // d - 2 * kvh
    x = qkv.double().cpu().reshape(s, h + 2 * kvh, d)
    q, k, v = x[:, :h], x[:, h : h + kvh], x[:, h + kvh :]
    if q_norm is not None:
        q = q / (q.pow(2).mean(-1, keepdim=True) + eps).sqrt() * q_norm.double().cpu()
        k = k / (k.pow(2).mean(-1, keepdim=True) + eps).sqrt() * k_norm.double().cpu()
    pos = torch.arange(cached, cached + s)
    cos = cos_t.cpu()[pos].to(qkv.dtype).double()[:, None]
    sin = sin_t.cpu()[pos].to(qkv.dtype).double()[:, None]
    q = q * cos + torch.cat((-q[..., d // 2 :], q[..., : d // 2]), -1) * sin
    k = k * cos + torch.cat((-k[..., d // 2 :], k[..., : d // 2]), -1) * sin
    k64, v64 = k_cache.double().cpu().clone(), v_cache.double().cpu().clone()
    k64[0, :, pos], v64[0, :, pos] = k.transpose(0, 1), v.transpose(0, 1)
    q = (q * scale).permute(1, 0, 2)[None]
    return decode_attention_reference(q, k64, v64, torch.tensor([cached + s])), k64, v64


def test_the_kernel_matches_float64_under_the_triton_interpreter():
    """The split kernel with the rotary prologue: the context close to float64 (no further from it than
    the unfused computation, which rounds after every op), the new keys within a rounding of the exact
    rotated keys, the new values the product's bits, every other cache row untouched, the same bits
    call after call; and the prologue as a kernel of its own (mcore::rope_decode_inputs, for a bound
    slot) writes the same caches and a query the plain split kernel attends to the same bits."""
    for case, res in zip(CASES, run_under_triton_interpreter(_INTERP, CASES), strict=True):
        assert res["same"] and res["v_new"] and res["rest_kept"] and res["inputs_same"], (case, res)
        if case[6] == "bfloat16":  # the interpreter's bf16 casts truncate (the cos rows, the norm, the stores)
            assert res["rel"] < 2.5e-2 and res["k_rel"] < 8 * res["k_floor"], (case, res)
            continue
        assert res["rel"] < 2e-3 and res["rel"] <= 1.5 * res["unfused_rel"] + res["floor"], (case, res)
        # the norm's rounding (part of the model), then the stored key's
        assert res["k_rel"] < 2 * res["k_floor"] + 1e-6, (case, res)


@pytest.mark.parametrize("launch", ["decode_attention_from_qkv", "decode_inputs_from_qkv"])
def test_bad_inputs_are_refused(launch):
    """Both launchers (the attention with its prologue, and the prologue alone before a bound slot)
    refuse the same inputs with the same messages, before any launch."""
    from mcore.ops import flash_decode
    from mcore.ops.rope_attention import split_heads

    fn = getattr(flash_decode, launch)

    with pytest.raises(ValueError, match="not \\(H \\+ 2"):
        split_heads(torch.zeros(1, 1, 100), 2, 16)
    with pytest.raises(ValueError, match="not \\[1, tokens"):
        split_heads(torch.zeros(2, 1, 128), 2, 16)
    qkv, kc = torch.zeros(1, 1, 128, dtype=torch.bfloat16), torch.zeros(1, 2, 64, 16, dtype=torch.bfloat16)
    table = torch.zeros(64, 16)
    length = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="both q/k norm weights or neither"):
        fn(qkv, torch.ones(16), None, 1e-6, table, table, kc, kc.clone(), length, 0.25)
    with pytest.raises(ValueError, match="cos table"):
        fn(qkv, None, None, 1e-6, table[:8], table, kc, kc.clone(), length, 0.25)
    with pytest.raises(ValueError, match="must be contiguous"):
        strided = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16).transpose(2, 3)  # the cache's shape, not its layout
        fn(qkv, None, None, 1e-6, table, table, strided, kc, length, 0.25)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rope")
    return {
        model: build_bundle(
            BuildArgs(model=f"demo:{model}", precision="bf16", max_cache_length=128),
            folder / f"{model}.bundle",
            device="cpu",
        ).bundle_path
        for model in ("qwen3-tiny", "llama-tiny")
    }


def _decode_nodes(pipe: DecoderPipeline) -> list:
    return list(pipe.runners["decode"].prepared.gm.graph.nodes)


@pytest.mark.parametrize("model, norm", [("qwen3-tiny", "1"), ("llama-tiny", "0")])
def test_the_engine_moves_the_norms_rotation_and_cache_writes_into_the_attention(bundles, monkeypatch, model, norm):
    """MCORE_GEMV=1 and the default (Qwen3, with q/k norms, beside MCORE_GEMV_NORM=1; Llama without
    them, alone) against MCORE_ATTN_ROPE=0: each layer's decode attention becomes one mcore::rope_decode_attention reading the q/k/v
    product itself, and nothing is left between the two (no slice of the product, no norm, rotation,
    cache write or scaling); prefill keeps its graph; its own compiled code; the same tokens over 12
    steps (each reading the caches the steps before wrote), logits as close to the op-by-op engine's
    as the unfused step's are."""
    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_NORM", norm)
    monkeypatch.setenv("MCORE_ATTN_ROPE", "0")
    apart = DecoderPipeline(str(bundles[model]), device="cpu", engine="compiled")
    monkeypatch.delenv("MCORE_ATTN_ROPE")  # on by default
    pipe = DecoderPipeline(str(bundles[model]), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    nodes = _decode_nodes(pipe)
    fused = [n for n in nodes if n.target is torch.ops.mcore.rope_decode_attention.default]
    targets = [n.target for n in nodes]
    assert len(fused) == layers and torch.ops.mcore.decode_attention.default not in targets
    for gone in (torch.ops.aten.index_copy_.default, torch.ops.aten.cat.default, torch.ops.aten.slice.Tensor):
        assert gone not in targets, gone
    products = {torch.ops.mcore.gemv.default, torch.ops.mcore.rms_gemv.default}
    assert all(n.args[0].target in products for n in fused)  # straight from the q/k/v product
    assert all((n.args[1] is None) == (model == "llama-tiny") for n in fused)  # Llama: no q/k norms
    assert all(n.args[4].name == "b_decoder_rope_cos" and n.args[8].name == "cache_length" for n in fused)
    assert all("decode_attention" in "".join(n.meta["mcore_fused_nodes"]) for n in fused)  # the profile's charge
    prefill = [n.target for n in pipe.runners["prefill"].prepared.gm.graph.nodes]
    assert torch.ops.aten.index_copy_.default in prefill
    assert pipe.runners["decode"].key != apart.runners["decode"].key
    prompt = "the quick brown fox"
    r = pipe.generate(prompt, 12, stop_at_eos=False)
    assert r.tokens == apart.generate(prompt, 12, stop_at_eos=False).tokens
    steps = (r.prompt_tokens, r.tokens[:-1])
    ref = DecoderPipeline(str(bundles[model]), device="cpu", engine="torch").step_logits(*steps)
    dist = lambda logits: max(((x - y).norm() / y.norm()).item() for x, y in zip(logits, ref, strict=True))  # noqa: E731
    # bf16 rounds the chain in other places in each engine: as close to the op-by-op engine as the unfused step
    assert dist(pipe.step_logits(*steps)) < 1.25 * dist(apart.step_logits(*steps)) + 2e-3


def test_a_cache_read_elsewhere_keeps_the_chain_apart(bundles, monkeypatch):
    """The rewrite moves cache writes into a kernel: where anything else reads a layer's cache (or the
    chain's pieces), that layer keeps its own nodes and the others are still fused."""
    from mcore.engines.rope_pass import fuse_rope_attention

    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_ATTN_ROPE", "0")  # the chain as the decoder writes it, fused below
    pipe = DecoderPipeline(str(bundles["qwen3-tiny"]), device="cpu", engine="compiled")
    prepared = pipe.runners["decode"].prepared
    gm = prepared.gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state = {placeholders[i]: prepared.state_args[i] for i in range(len(prepared.state_args))}
    layers = int(pipe.config["num_hidden_layers"])
    cache = next(n for n in placeholders if n.name == "key_cache_0")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        gm.graph.call_function(torch.ops.aten.sum.default, (cache,))  # another reader of layer 0's cache
    assert fuse_rope_attention(gm, state) == layers - 1
    fused = [n for n in gm.graph.nodes if n.target is torch.ops.mcore.rope_decode_attention.default]
    assert [n.args[6].name for n in fused] == [f"key_cache_{i}" for i in range(1, layers)]
    assert [n.target for n in gm.graph.nodes].count(torch.ops.aten.cat.default) == 2  # layer 0's q and k rotations


def test_a_bound_attention_gets_its_inputs_from_one_op_and_keeps_its_slot(bundles, tmp_path, monkeypatch):
    """Tutorial step 5's slots (the attention of every layer bound to a kernel) with MCORE_GEMV=1: the
    chain before each slot becomes one mcore::rope_decode_inputs from the q/k/v product, which writes
    the caches the slot then reads and hands it the scaled query and the length; the slot node and its
    key stay. The kernel is called every step of every layer with its own cache and the
    length so far; the tokens are those of MCORE_ATTN_ROPE=0 (the chain as Inductor compiles it) and
    of the op-by-op native engine, the logits as close to the latter as the unfused chain's."""
    from mcore.cli.main import main
    from mcore.runtime import bindings

    from .test_attention_slots import RECIPE, AttentionStandIn, bind_manifest

    args = ["demo:qwen3-tiny", "--precision", "bf16", "--max-cache-length", "128"]
    slot = tmp_path / "attn.bundle"
    assert main(["build", *args, "--recipe", RECIPE, "all-instances", "-o", str(slot)]) == 0
    abi = json.loads(next(tmp_path.glob("attn.selection.*.json")).read_text())["abi_sha256"]
    manifest = str(bind_manifest(tmp_path, abi))
    kernel = AttentionStandIn()
    monkeypatch.setattr(bindings, "_load_function", lambda library, function, bid: (None, kernel))
    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_ATTN_ROPE", "0")
    apart = DecoderPipeline(str(slot), kernel_bindings=manifest, device="cpu", engine="compiled")
    monkeypatch.delenv("MCORE_ATTN_ROPE")  # on by default
    pipe = DecoderPipeline(str(slot), kernel_bindings=manifest, device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    nodes = _decode_nodes(pipe)
    slots = [n for n in nodes if n.target is torch.ops.mcore.slot.default]
    inputs = [n for n in nodes if n.target is torch.ops.mcore.rope_decode_inputs.default]
    assert len(slots) == len(inputs) == layers
    # each slot's query and length are its layer's op's two outputs (the length no kernel of its own)
    assert [[(a.args[0], a.args[1]) for a in (n.args[0][0], n.args[0][3])] for n in slots] == [
        [(op, 0), (op, 1)] for op in inputs
    ]
    assert [n.args[0][1].name for n in slots] == [f"key_cache_{i}" for i in range(layers)]  # written by the op
    assert [n.args[0][2].name for n in slots] == [f"value_cache_{i}" for i in range(layers)]
    assert [n.args[6] for n in inputs] == [n.args[0][1] for n in slots]
    targets = [n.target for n in nodes]
    for gone in (
        torch.ops.aten.index_copy_.default,
        torch.ops.aten.cat.default,
        torch.ops.mcore.rope_decode_attention.default,
    ):
        assert gone not in targets, gone
    assert all(n.args[0].target is torch.ops.mcore.gemv.default for n in inputs)  # straight from the product
    prompt = "the quick brown fox"
    kernel.calls.clear()
    r = pipe.generate(prompt, 8, stop_at_eos=False)
    assert len(kernel.calls) == 7 * layers and len({ptr for ptr, _ in kernel.calls}) == layers
    lengths = [n for _, n in kernel.calls][::layers]
    assert lengths == list(range(lengths[0], lengths[0] + 7))
    assert r.tokens == apart.generate(prompt, 8, stop_at_eos=False).tokens
    native = DecoderPipeline(str(bundles["qwen3-tiny"]), device="cpu", engine="torch")
    assert r.tokens == native.generate(prompt, 8, stop_at_eos=False).tokens
    steps = (r.prompt_tokens, r.tokens[:-1])
    ref = native.step_logits(*steps)
    dist = lambda logits: max(((x - y).norm() / y.norm()).item() for x, y in zip(logits, ref, strict=True))  # noqa: E731
    assert dist(pipe.step_logits(*steps)) < 1.25 * dist(apart.step_logits(*steps)) + 2e-3


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@gpu
@needs_cuda
@pytest.mark.parametrize("s", [1, 3])
def test_gpu_kernel_at_the_8b_shapes(s):
    """Qwen3-8B's decode attention (32 query heads on 8 KV heads, head_dim 128, bf16, q/k norms) from
    the q/k/v row, at lengths across the splits: as close to float64 as the unfused path (the same ops
    one by one, rounding after each), the new keys within the norm's and the store's roundings, the new
    values the product's bits, the rest of the caches untouched, the same bits call after call and
    replayed in a CUDA graph; the prologue alone (mcore::rope_decode_inputs) the same caches and a query
    the plain split kernel attends to the same bits."""
    from mcore.ops import flash_decode as fd
    from mcore.ops.rope_attention import _unfused

    g = torch.Generator(device="cuda").manual_seed(5 + s)
    h, kv, d, cap = 32, 8, 128, 8192
    qkv = (2 * torch.randn(1, s, (h + 2 * kv) * d, device="cuda", generator=g)).bfloat16()
    qn = (1 + 0.2 * torch.randn(d, device="cuda", generator=g)).bfloat16()
    kn = (1 + 0.2 * torch.randn(d, device="cuda", generator=g)).bfloat16()
    cos_t, sin_t = rope_tables(cap, d, "cuda")
    kc = torch.randn(1, kv, cap, d, device="cuda", generator=g).bfloat16()
    vc = torch.randn(1, kv, cap, d, device="cuda", generator=g).bfloat16()
    length = torch.zeros(1, dtype=torch.int32, device="cuda")
    rel = lambda t, r: ((t.double().cpu() - r).norm() / r.norm()).item()  # noqa: E731
    for cached in (0, 63, 64, 1000, 4097, cap - s):
        length.fill_(cached)
        k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        want = _unfused(qkv, qn, kn, 1e-6, cos_t, sin_t, k2, v2, length, d**-0.5)
        got = fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, k1, v1, length, d**-0.5)
        ref, k64, _ = exact_reference(qkv, qn, kn, 1e-6, cos_t, sin_t, kc, vc, cached, d**-0.5)
        floor = rel(ref.bfloat16(), ref)  # rounding the exact context once
        assert rel(got, ref) <= 1.25 * rel(want, ref) + floor, (cached, rel(got, ref), rel(want, ref), floor)
        new = slice(cached, cached + s)
        assert rel(k1[:, :, new], k64[:, :, new]) <= 2 * rel(k64[:, :, new].bfloat16(), k64[:, :, new]), cached
        assert torch.equal(v1, v2) and torch.equal(k1[:, :, :cached], kc[:, :, :cached]), cached
        # the prologue alone (a bound slot's inputs): the same caches, a query attended to the same bits
        k3, v3 = kc.clone(), vc.clone()
        qi, li = fd.decode_inputs_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, k3, v3, length, d**-0.5)
        assert li.dtype == torch.int32 and li.tolist() == [cached + s], cached
        assert torch.equal(fd.decode_attention(qi, k3, v3, li), got), cached
        assert torch.equal(k3, k1) and torch.equal(v3, v1), cached
        for _ in range(10):
            again = fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, k1, v1, length, d**-0.5)
            assert torch.equal(again, got), cached
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, kc, vc, length, d**-0.5)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [
            fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, kc, vc, length, d**-0.5) for _ in range(4)
        ]
    for cached in (5, 4097):
        length.fill_(cached)
        want = fd.decode_attention_from_qkv(qkv, qn, kn, 1e-6, cos_t, sin_t, kc, vc, length, d**-0.5)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o, want) for o in outs), cached
