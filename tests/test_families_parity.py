"""Numerics of the family graph builders against transformers (fp32, CPU), the decode-attention
op against a float64 brute force, and torch.export of every role on the meta device."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from mcore.families import get_family
from mcore.families.source import resolve_model
from mcore.model.buildargs import BuildArgs
from mcore.ops import attention as ops

from .checkpoints import make_bert_checkpoint, make_distilbert_checkpoint, make_qwen3_checkpoint

ATOL = 1e-4


def _build(folder, **args):
    source = resolve_model(str(folder))
    fam = get_family(source.family)
    gargs = fam.graph_args(source.config, BuildArgs(model=str(folder), **args))
    core = fam.build_core(source.config, gargs, "cpu")
    fam.load_checkpoint(core, source)
    return source, fam, gargs, core.eval()


# ------------------------------------------------------------------------------------- qwen3


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("qwen3")
    return {
        "plain": make_qwen3_checkpoint(base / "plain"),
        "sharded": make_qwen3_checkpoint(base / "sharded", sharded=True, seed=3),
        "tied": make_qwen3_checkpoint(base / "tied", tie_word_embeddings=True, attention_bias=True, seed=5),
    }


def _qwen3_steps(folder, max_cache_length=32):
    """Run prefill(5) + decode s=1 x3 + decode s=3 + decode s=1; return logits and reference logits."""
    source, fam, gargs, core = _build(folder, max_cache_length=max_cache_length)
    prefill, decode = fam.role_module(core, "prefill"), fam.role_module(core, "decode")
    shape = fam.cache_shape(source.config, gargs)
    caches = [torch.zeros(shape) for _ in range(2 * core.dims.num_layers)]
    ptrs = [c.data_ptr() for c in caches]
    vocab = source.config["vocab_size"]
    toks = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(7))
    got, positions = [], []
    with torch.no_grad():
        got.append(prefill(toks[None, :5].to(torch.int32), *caches))
        positions.append(4)
        for a, b in [(5, 6), (6, 7), (7, 8), (8, 11), (11, 12)]:
            cl = torch.tensor([a], dtype=torch.int32)
            got.append(decode(toks[None, a:b].to(torch.int32), cl, *caches))
            positions.append(b - 1)
            assert cl.item() == a, "the graph must not modify cache_length"
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        out = ref(toks[None], use_cache=True)
    assert [c.data_ptr() for c in caches] == ptrs, "caches must be updated in place, never reallocated"
    return got, positions, out, caches, core


@pytest.mark.parametrize("variant", ["plain", "sharded", "tied"])
def test_qwen3_prefill_decode_matches_transformers(qwen3_dirs, variant):
    got, positions, out, caches, core = _qwen3_steps(qwen3_dirs[variant])
    ref_logits = out.logits[0]
    for logits, p in zip(got, positions, strict=True):
        assert logits.shape == (1, ref_logits.shape[-1]) and logits.dtype == torch.float32
        torch.testing.assert_close(logits[0], ref_logits[p], atol=ATOL, rtol=0)
    # The caches hold transformers' keys/values for positions 0..11 and zeros beyond.
    pkv = out.past_key_values
    for i in range(core.dims.num_layers):
        k_ref, v_ref = pkv.layers[i].keys[0], pkv.layers[i].values[0]
        torch.testing.assert_close(caches[2 * i][0, :, :12], k_ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(caches[2 * i + 1][0, :, :12], v_ref, atol=ATOL, rtol=0)
        assert caches[2 * i][0, :, 12:].abs().max() == 0 and caches[2 * i + 1][0, :, 12:].abs().max() == 0


def test_qwen3_tied_checkpoint_has_no_lm_head_and_core_ties(qwen3_dirs):
    from safetensors import safe_open

    with safe_open(str(qwen3_dirs["tied"] / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    _, _, _, core = _build(qwen3_dirs["tied"], max_cache_length=16)
    assert core.lm_head.weight is core.embed_tokens.weight
    assert core.layers[0].self_attn.q_proj.bias is not None


def test_qwen3_sharded_checkpoint_is_sharded(qwen3_dirs):
    index = json.loads((qwen3_dirs["sharded"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


def test_qwen3_graph_args(qwen3_dirs):
    source = resolve_model(str(qwen3_dirs["plain"]))
    fam = get_family("qwen3")
    g = fam.graph_args(source.config, BuildArgs(model="x"))
    assert g.to_dict() == {
        "precision": "fp32",
        "max_cache_length": 256,
        "decoder_engine_layout": "split",
    }  # min(256, 4096)
    g = fam.graph_args(source.config, BuildArgs(model="x", precision="bf16", max_cache_length=100))
    assert g.to_dict() == {"precision": "bf16", "max_cache_length": 100, "decoder_engine_layout": "split"}
    io = fam.role_io(source.config, g, "decode")
    assert io.inputs == ("input_ids", "cache_length", "key_cache.0", "value_cache.0", "key_cache.1", "value_cache.1")
    assert io.outputs == ("logits",)
    assert fam.role_io(source.config, g, "prefill").inputs == io.inputs[:1] + io.inputs[2:]
    assert fam.kind == "decoder" and fam.roles == ("prefill", "decode")


def test_qwen3_rope_tables_and_zero_bias_are_fp32_nonpersistent(qwen3_dirs):
    source, fam, gargs, core = _build(qwen3_dirs["plain"], max_cache_length=16, precision="bf16")
    assert core.rope_cos.dtype == torch.float32 and core.rope_cos.shape == (16, 16)
    assert core.logits_zero_bias.bias.dtype == torch.float32
    assert core.logits_zero_bias.bias.shape == (source.config["vocab_size"],)
    assert not any("rope" in k or "zero_bias" in k for k in core.state_dict())
    assert core.embed_tokens.weight.dtype == torch.bfloat16


def test_qwen3_bf16_close_to_fp32(qwen3_dirs):
    """bf16 runs end to end and stays near the fp32 logits (a smoke check of the casts)."""
    folder = qwen3_dirs["plain"]
    res = {}
    for prec in ("fp32", "bf16"):
        source, fam, gargs, core = _build(folder, max_cache_length=16, precision=prec)
        dt = core.dtype
        caches = [torch.zeros(fam.cache_shape(source.config, gargs), dtype=dt) for _ in range(4)]
        ids = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
        with torch.no_grad():
            fam.role_module(core, "prefill")(ids, *caches)
            res[prec] = fam.role_module(core, "decode")(
                torch.tensor([[5]], dtype=torch.int32), torch.tensor([4], dtype=torch.int32), *caches
            )
        assert res[prec].dtype == torch.float32
    torch.testing.assert_close(res["bf16"], res["fp32"], atol=0.1, rtol=0)


# ---------------------------------------------------------------------------------- encoders


@pytest.fixture(scope="module")
def encoder_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("encoders")
    return {"distilbert": make_distilbert_checkpoint(base / "distilbert"), "bert": make_bert_checkpoint(base / "bert")}


@pytest.mark.parametrize("family", ["distilbert", "bert"])
@pytest.mark.parametrize("n_real", [11, 16])
def test_encoder_matches_transformers(encoder_dirs, family, n_real):
    folder = encoder_dirs[family]
    S = 16
    source, fam, gargs, core = _build(folder, max_seq_length=S)
    assert gargs.to_dict() == {"precision": "fp32", "max_seq_length": S}
    role = fam.role_module(core, "encoder")
    g = torch.Generator().manual_seed(11)
    real = torch.randint(5, source.config["vocab_size"], (n_real,), generator=g)
    ids = torch.zeros(S, dtype=torch.int32)
    ids[:n_real] = real.to(torch.int32)
    mask = torch.zeros(S, dtype=torch.int32)
    mask[:n_real] = 1
    with torch.no_grad():
        hidden = role(ids, mask)
        ref = transformers.AutoModel.from_pretrained(str(folder)).eval()
        ref_padded = ref(input_ids=ids[None].long(), attention_mask=mask[None].long()).last_hidden_state[0]
        ref_unpadded = ref(input_ids=real[None].long()).last_hidden_state[0]
    assert hidden.shape == (S, source.config.get("dim", source.config.get("hidden_size")))
    assert hidden.dtype == torch.float32
    torch.testing.assert_close(hidden[:n_real], ref_padded[:n_real], atol=ATOL, rtol=0)
    torch.testing.assert_close(hidden[:n_real], ref_unpadded, atol=ATOL, rtol=0)


def test_bert_prefixed_checkpoint_loads(tmp_path, encoder_dirs):
    """BertForMaskedLM-style names (bert. prefix, cls.* head, gamma/beta) load; the head is ignored."""
    from safetensors.torch import load_file, save_file

    src = encoder_dirs["bert"]
    out = tmp_path / "bert-prefixed"
    out.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (out / f).write_bytes((src / f).read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    renamed = {}
    for k, v in tensors.items():
        k = "bert." + k
        if k.endswith("LayerNorm.weight"):
            k = k[: -len("weight")] + "gamma"
        elif k.endswith("LayerNorm.bias"):
            k = k[: -len("bias")] + "beta"
        renamed[k] = v
    renamed["cls.predictions.bias"] = torch.zeros(3)
    save_file(renamed, str(out / "model.safetensors"))
    _, _, _, a = _build(src, max_seq_length=8)
    _, _, _, b = _build(out, max_seq_length=8)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)


def test_encoder_recipes_and_io(encoder_dirs):
    for family in ("distilbert", "bert"):
        source = resolve_model(str(encoder_dirs[family]))
        fam = get_family(family)
        g = fam.graph_args(source.config, BuildArgs(model="x"))
        assert g.to_dict() == {"precision": "fp32", "max_seq_length": 128}  # capped by max_position_embeddings 128
        io = fam.role_io(source.config, g, "encoder")
        assert io.inputs == ("input_ids", "attention_mask") and io.outputs == ("hidden_states",)
        (r,) = fam.recipes(source.config, g)
        assert r.id == f"{family}.attention_residual_add@1" and r.engine_role == "encoder"
        assert r.instances == tuple((f"encoder.layers.{i}.attention_residual",) * 2 for i in range(2))
        assert r.output_shape_input is None


# ------------------------------------------------------------------------ decode_attention op


@pytest.mark.parametrize(
    "h,kv,s,cap,kv_len",
    [
        (4, 2, 1, 16, 1),
        (4, 2, 1, 16, 9),
        (4, 2, 3, 16, 3),
        (4, 2, 3, 16, 16),
        (6, 2, 5, 24, 11),
        (2, 2, 2, 8, 5),
        (8, 1, 4, 12, 7),
    ],
)
@pytest.mark.parametrize("impl", ["op", "device_path"])
def test_decode_attention_matches_float64_reference(h, kv, s, cap, kv_len, impl):
    g = torch.Generator().manual_seed(h * 1000 + kv * 100 + s * 10 + kv_len)
    d = 16
    q = torch.randn(1, h, s, d, generator=g)
    k = torch.randn(1, kv, cap, d, generator=g)
    v = torch.randn(1, kv, cap, d, generator=g)
    # Garbage beyond the active length must not leak into the result. (The CPU path never reads it;
    # the device path masks it, so it must be finite there: caches start zeroed.)
    k[:, :, kv_len:] = 1e4
    v[:, :, kv_len:] = float("nan") if impl == "op" else 1e4
    lengths = torch.tensor([kv_len], dtype=torch.int32)
    ref = ops.decode_attention_reference(q, k, v, lengths)
    if impl == "op":
        out = torch.ops.mcore.decode_attention(q, k, v, lengths)
    else:  # the no-host-sync path used on CUDA, exercised here on CPU tensors
        out = ops._device_impl(q, k, v, lengths)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


def test_decode_attention_half_types_softmax_in_fp32():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 2, 16, generator=g)
    k = torch.randn(1, 2, 10, 16, generator=g)
    v = torch.randn(1, 2, 10, 16, generator=g)
    lengths = torch.tensor([7], dtype=torch.int32)
    ref = ops.decode_attention_reference(q, k, v, lengths)
    for dt in (torch.bfloat16, torch.float16):
        out = torch.ops.mcore.decode_attention(q.to(dt), k.to(dt), v.to(dt), lengths)
        assert out.dtype == dt
        torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=0)


def test_decode_attention_fake_is_shape_of_query():
    q = torch.empty(1, 8, 5, 32, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, 2, 64, 32, device="meta", dtype=torch.bfloat16)
    out = torch.ops.mcore.decode_attention(q, k, k, torch.empty(1, dtype=torch.int32, device="meta"))
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"


# ------------------------------------------------------------------------ export on meta


def _module_paths(ep):
    out = []
    for n in ep.graph.nodes:
        stack = n.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        out.append((n, path))
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_qwen3_exports_on_meta(qwen3_dirs, role, precision):
    source = resolve_model(str(qwen3_dirs["plain"]))
    fam = get_family("qwen3")
    gargs = fam.graph_args(source.config, BuildArgs(model="x", precision=precision, max_cache_length=64))
    core = fam.build_core(source.config, gargs, "meta")
    module = fam.role_module(core, role)
    args, dyn = fam.example_inputs(source.config, gargs, role, "meta")
    assert len(args) == len(fam.role_io(source.config, gargs, role).inputs)
    ep = torch.export.export(module, args, dynamic_shapes=dyn)
    nodes = _module_paths(ep)
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert user_inputs[0] == "input_ids" and len(user_inputs) == len(args)
    calls = [(n.target, p) for n, p in nodes if n.op == "call_function"]
    copies = [p for t, p in calls if t == torch.ops.aten.index_copy_.default]
    assert len(copies) == 2 * core.dims.num_layers  # in place, one per cache
    # The final cast is under `decoder`; the zero-bias cast+add under decoder.logits_zero_bias.
    out_node = [n for n in ep.graph.nodes if n.op == "output"][0].args[0][0]
    assert out_node.target == torch.ops.aten._to_copy.default
    assert dict(nodes)[out_node] == "decoder"
    zb = [t for t, p in calls if p == "decoder.logits_zero_bias"]
    assert zb == [torch.ops.aten._to_copy.default, torch.ops.aten.add.Tensor]
    attn = [(t, p) for t, p in calls if p.endswith(".self_attn.decode_attention")]
    prefill_ops = [t for t, p in calls if t == torch.ops.mcore.prefill_attention.default]
    assert len(prefill_ops) == (core.dims.num_layers if role == "prefill" else 0)
    if role == "decode":
        assert attn == [
            (torch.ops.mcore.decode_attention.default, f"decoder.layers.{i}.self_attn.decode_attention")
            for i in range(core.dims.num_layers)
        ]
        (ra, rl) = fam.recipes(source.config, gargs)
        assert ra.id == "qwen.decode_attention_region@2" and ra.output_shape_input == 0
        assert ra.instances[1] == ("decoder.layers.1.decode_attention", "decoder.layers.1.self_attn.decode_attention")
        assert rl.id == "qwen.decode_logits_copy@1" and rl.output_shape_input is None
        assert rl.instances == (("decoder.logits_zero_bias", "decoder.logits_zero_bias"),)
        # The attention op's inputs: scaled query, the updated caches, kv_lengths.
        n_attn = [
            n for n, p in nodes if n.op == "call_function" and n.target == torch.ops.mcore.decode_attention.default
        ][0]
        assert n_attn.args[1].target == torch.ops.aten.index_copy_.default
        assert n_attn.args[2].target == torch.ops.aten.index_copy_.default
        assert n_attn.args[0].meta["val"].dtype == core.dtype
    else:
        assert attn == []
    # Dynamic token dimension on input_ids; static caches.
    ids_node = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "input_ids"][0]
    assert not isinstance(ids_node.meta["val"].shape[1], int)


@pytest.mark.parametrize("family", ["distilbert", "bert"])
def test_encoder_exports_on_meta(encoder_dirs, family):
    source = resolve_model(str(encoder_dirs[family]))
    fam = get_family(family)
    gargs = fam.graph_args(source.config, BuildArgs(model="x", precision="fp16", max_seq_length=32))
    core = fam.build_core(source.config, gargs, "meta")
    args, dyn = fam.example_inputs(source.config, gargs, "encoder", "meta")
    ep = torch.export.export(fam.role_module(core, "encoder"), args, dynamic_shapes=dyn)
    nodes = _module_paths(ep)
    for i in range(2):
        adds = [n for n, p in nodes if n.op == "call_function" and p == f"encoder.layers.{i}.attention_residual"]
        assert [n.target for n in adds] == [torch.ops.aten.add.Tensor]
        a, b = adds[0].args
        assert list(a.meta["val"].shape) == [32, 64] and list(b.meta["val"].shape) == [32, 64]
        assert a.meta["val"].dtype == torch.float16
        # hidden first: the left operand is the layer input, the right one the attention projection
        assert b.target == torch.ops.aten.linear.default
    out_node = [n for n in ep.graph.nodes if n.op == "output"][0].args[0][0]
    assert list(out_node.meta["val"].shape) == [32, 64] and out_node.meta["val"].dtype == torch.float16


# ------------------------------------------------------------------------ CUDA (device machine)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "h,kv,s,cap,kv_len", [(4, 2, 1, 64, 1), (8, 2, 3, 64, 40), (32, 8, 1, 4096, 3000), (4, 4, 7, 32, 32)]
)
def test_decode_attention_cuda_matches_reference_without_host_sync(dtype, h, kv, s, cap, kv_len):
    g = torch.Generator().manual_seed(kv_len)
    d = 64
    q = torch.randn(1, h, s, d, generator=g)
    k = torch.randn(1, kv, cap, d, generator=g)
    v = torch.randn(1, kv, cap, d, generator=g)
    k[:, :, kv_len:] = 100.0  # stale but finite beyond the active length
    lengths = torch.tensor([kv_len], dtype=torch.int32)
    ref = ops.decode_attention_reference(q.to(dtype), k.to(dtype), v.to(dtype), lengths)
    qc, kc, vc, lc = (t.to(dtype).cuda() if t.is_floating_point() else t.cuda() for t in (q, k, v, lengths))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = torch.ops.mcore.decode_attention(qc, kc, vc, lc)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.dtype == dtype and out.shape == qc.shape and out.is_cuda
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=0)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_qwen3_roles_on_cuda_match_cpu(qwen3_dirs, precision):
    folder = qwen3_dirs["plain"]
    results = {}
    for device in ("cpu", "cuda"):
        source = resolve_model(str(folder))
        fam = get_family("qwen3")
        gargs = fam.graph_args(source.config, BuildArgs(model="x", precision=precision, max_cache_length=32))
        core = fam.build_core(source.config, gargs, device)
        fam.load_checkpoint(core, source)
        caches = [torch.zeros(fam.cache_shape(source.config, gargs), dtype=core.dtype, device=device) for _ in range(4)]
        prefill, decode = fam.role_module(core, "prefill"), fam.role_module(core, "decode")
        outs = []
        with torch.no_grad():
            outs.append(prefill(torch.tensor([[3, 1, 4, 1, 5]], dtype=torch.int32, device=device), *caches))
            cl = torch.tensor([5], dtype=torch.int32, device=device)
            outs.append(decode(torch.tensor([[9]], dtype=torch.int32, device=device), cl, *caches))
            cl.fill_(6)
            outs.append(decode(torch.tensor([[2, 6, 5]], dtype=torch.int32, device=device), cl, *caches))
        results[device] = [o.cpu() for o in outs]
    tol = 1e-4 if precision == "fp32" else 5e-2
    for a, b in zip(results["cpu"], results["cuda"], strict=True):
        torch.testing.assert_close(b, a, atol=tol, rtol=0)


@pytest.mark.gpu
@cuda
def test_random_init_qwen3_8b_sized_on_cuda():
    import time

    config = {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
    }
    fam = get_family("qwen3")
    gargs = fam.graph_args(config, BuildArgs(model="x", precision="bf16", max_cache_length=40960))
    t0 = time.perf_counter()
    core = fam.build_core(config, gargs, "cuda")
    fam.random_init(core, 0)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    n = sum(p.numel() for p in core.parameters())
    assert 8.0e9 < n < 8.3e9
    assert core.rope_cos.shape == (40960, 128) and core.rope_cos.dtype == torch.float32
    w = core.layers[35].mlp.down_proj.weight
    assert w.dtype == torch.bfloat16 and 0.015 < w.float().std().item() < 0.025
    print(f"qwen3-8b-sized core built and random-initialized on cuda in {took:.1f}s ({n / 1e9:.2f}B params)")
    del core
    torch.cuda.empty_cache()


@pytest.mark.parametrize("h,kv,s", [(4, 2, 1), (4, 2, 7), (6, 3, 5), (4, 4, 3)])
def test_prefill_attention_matches_float64_reference(h, kv, s):
    g = torch.Generator().manual_seed(h + kv + s)
    q = torch.randn(1, h, s, 16, generator=g)
    k = torch.randn(1, kv, s, 16, generator=g)
    v = torch.randn(1, kv, s, 16, generator=g)
    out = torch.ops.mcore.prefill_attention(q, k, v, 0.25)
    # prefill == decode into an empty cache: kv_len = s, queries at positions 0..s-1
    ref = ops.decode_attention_reference(q * 0.25, k, v, torch.tensor([s], dtype=torch.int32))
    assert out.shape == q.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
