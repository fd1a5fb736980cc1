"""The decoder families (llama, mistral, qwen2, and qwen3 on the same implementation) against transformers,
on tiny twins of published checkpoints (tests/checkpoints.py PUBLISHED: the published config.json,
tokenizer files and generation config at small widths): token IDs and chat templates, logits and KV
caches in lockstep (fp32), greedy generation through a built bundle, `mcore verify reference` and
`mcore run --chat`, the RoPE tables at long positions, the recipes, and the config errors."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import transformers

from mcore.bundle.build import build_bundle
from mcore.common.errors import UserError
from mcore.families import family_for_config, get_family
from mcore.families.source import resolve_model
from mcore.model.buildargs import BuildArgs
from mcore.model.tokenization import load_tokenizer_from_folder
from mcore.runtime.pipeline import DecoderPipeline

from .checkpoints import PUBLISHED, make_published_checkpoint
from .conftest import assert_user_error

NAMES = list(PUBLISHED)
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 12345 and 7, spaces  \n\nnew lines, accents: é ü ß, 日本語",
    "a",
]
ATOL = 1e-4  # fp32: the same operations in another order


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("published")
    return {n: make_published_checkpoint(base / n, n, seed=i) for i, n in enumerate(NAMES)}


def _core(folder, cap=32, precision="fp32"):
    source = resolve_model(str(folder))
    fam = get_family(source.family)
    gargs = fam.graph_args(source.config, BuildArgs(model=str(folder), max_cache_length=cap, precision=precision))
    core = fam.build_core(source.config, gargs, "cpu")
    fam.load_checkpoint(core, source)
    return source, fam, gargs, core.eval()


def _reference(folder, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()


# ------------------------------------------------------------------------------- the families


@pytest.mark.parametrize("name", NAMES)
def test_family_comes_from_model_type(ckpts, name):
    source = resolve_model(str(ckpts[name]))
    fam = family_for_config(source.config)
    assert source.family == fam.name == source.config["model_type"]
    assert fam.kind == "decoder" and fam.roles == ("prefill", "decode")


@pytest.mark.parametrize("name", NAMES)
def test_prefill_and_decode_match_transformers_in_lockstep(ckpts, name):
    """prefill(5), decode s=1 x3, s=3, s=1: every step's logits and the caches against one
    transformers forward over the 12 tokens (its keys and values are the cache transformers keeps)."""
    source, fam, gargs, core = _core(ckpts[name])
    prefill, decode = fam.role_module(core, "prefill"), fam.role_module(core, "decode")
    caches = [torch.zeros(fam.cache_shape(source.config, gargs)) for _ in range(2 * core.dims.num_layers)]
    toks = torch.randint(0, source.config["vocab_size"], (12,), generator=torch.Generator().manual_seed(7))
    got, positions = [], []
    with torch.no_grad():
        got.append(prefill(toks[None, :5].to(torch.int32), *caches))
        positions.append(4)
        for a, b in [(5, 6), (6, 7), (7, 8), (8, 11), (11, 12)]:
            got.append(decode(toks[None, a:b].to(torch.int32), torch.tensor([a], dtype=torch.int32), *caches))
            positions.append(b - 1)
        out = _reference(ckpts[name])(toks[None], use_cache=True)
    for logits, p in zip(got, positions, strict=True):
        torch.testing.assert_close(logits[0], out.logits[0, p], atol=ATOL, rtol=0)
    for i in range(core.dims.num_layers):
        layer = out.past_key_values.layers[i]
        torch.testing.assert_close(caches[2 * i][0, :, :12], layer.keys[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(caches[2 * i + 1][0, :, :12], layer.values[0], atol=ATOL, rtol=0)
        assert caches[2 * i][0, :, 12:].abs().max() == 0


@pytest.mark.parametrize("name", ["llama-3.2-1b", "mistral-7b-v0.1", "qwen2.5-0.5b"])
def test_configs_as_transformers_5_saves_them_load_the_same_model(ckpts, name, tmp_path):
    """save_pretrained rewrites config.json (rope_parameters instead of rope_theta and rope_scaling,
    layer_types): the same weights read through either spelling give the same logits."""
    saved = make_published_checkpoint(tmp_path / name, name, seed=NAMES.index(name), as_saved=True)
    cfg = json.loads((saved / "config.json").read_text())
    assert "rope_parameters" in cfg and cfg != json.loads((ckpts[name] / "config.json").read_text())
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]], dtype=torch.int32)
    logits = []
    for folder in (ckpts[name], saved):
        source, fam, gargs, core = _core(folder)
        caches = [torch.zeros(fam.cache_shape(source.config, gargs)) for _ in range(2 * core.dims.num_layers)]
        with torch.no_grad():
            logits.append(fam.role_module(core, "prefill")(ids, *caches))
    assert torch.equal(logits[0], logits[1])
    with torch.no_grad():
        want = _reference(saved)(ids.long()).logits[0, -1]
    torch.testing.assert_close(logits[1][0], want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_token_ids_and_chat_match_transformers_tokenizer(ckpts, name):
    folder = ckpts[name]
    source = resolve_model(str(folder))
    ours = load_tokenizer_from_folder(folder, source.config["model_type"])
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == ref.decode(ref(text)["input_ids"], skip_special_tokens=True)
    if ours.chat_template is None:
        assert ref.chat_template is None
        return
    for text in TEXTS:
        want = ref.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        assert ours.render_chat(text) == want
        want_ids = ref(want, add_special_tokens=False)["input_ids"]
        assert ours.encode(ours.render_chat(text), add_special_tokens=False) == want_ids


@pytest.mark.parametrize("name", NAMES)
def test_bundle_generates_transformers_greedy_tokens(ckpts, name, tmp_path):
    folder = ckpts[name]
    bundle = build_bundle(BuildArgs(model=str(folder), max_cache_length=64), tmp_path / "n.bundle").bundle_path
    pipe = DecoderPipeline(str(bundle), device="cpu", engine="torch")
    r = pipe.generate(TEXTS[0], 16, greedy=True, stop_at_eos=False)
    with torch.no_grad():
        gen = _reference(folder).generate(
            torch.tensor([r.prompt_tokens]),
            attention_mask=torch.ones(1, len(r.prompt_tokens), dtype=torch.long),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )
    assert r.tokens == gen[0, len(r.prompt_tokens) :].tolist()
    assert len(set(r.tokens)) >= 3, f"degenerate greedy output: {r.tokens}"
    m = pipe.manifest
    assert m.family == resolve_model(str(folder)).config["model_type"] and m.family_kind == "decoder"
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert pipe.eos_ids == set(eos if isinstance(eos, list) else [eos])


def _steps(out: str) -> list[tuple[int, float, float, int, int]]:
    rows = re.findall(r"step (\d+) \([^)]*\): max_abs=(\S+) cosine=(\S+) engine_token=(\d+) reference_token=(\d+)", out)
    return [(int(a), float(b), float(c), int(d), int(e)) for a, b, c, d, e in rows]


@pytest.mark.parametrize("name", NAMES)
def test_verify_reference_passes(ckpts, name, tmp_path, mcore):
    folder = ckpts[name]
    bundle = tmp_path / "n.bundle"
    assert mcore("build", folder, "--max-cache-length", "256", "-o", bundle).code == 0
    chat = ["--chat"] if PUBLISHED[name]()[2].get("chat_template") else []
    res = mcore(
        "verify", "reference", bundle, "--checkpoint", folder, "--prompt", TEXTS[1], "--max-new-tokens", "6", *chat
    )
    assert res.code == 0, res
    steps = _steps(res.out)
    assert [s[0] for s in steps] == list(range(6))
    assert all(m < ATOL and c > 0.99999 and e == r for _, m, c, e, r in steps), steps
    assert "token IDs equal to transformers' tokenizer" in res.out
    assert res.out.strip().splitlines()[-1].startswith("PASS: reference check (6 step(s)")


@pytest.mark.parametrize("name", NAMES)
def test_verify_reference_in_bf16_is_within_bf16_error(ckpts, name, tmp_path, mcore):
    """bf16 on both sides, in lockstep: every step's cosine >= 0.999 (the default bound). Greedy picks
    may differ only where the reference's two candidates lie within twice that step's max_abs of each
    other (a tie within bf16 rounding, which a random tiny model has now and then); verify reference
    then says FAIL and names the step, as it should."""
    folder = ckpts[name]
    bundle = tmp_path / "b.bundle"
    assert mcore("build", folder, "--precision", "bf16", "--max-cache-length", "64", "-o", bundle).code == 0
    res = mcore("verify", "reference", bundle, "--checkpoint", folder, "--prompt", TEXTS[0], "--max-new-tokens", "6")
    steps = _steps(res.out)
    assert len(steps) == 6 and all(c >= 0.999 for _, _, c, _, _ in steps), res
    if res.code == 0:
        assert all(e == r for *_, e, r in steps)
        return
    assert res.code == 1 and "first_diverging_token=" in res.out, res
    ids = load_tokenizer_from_folder(folder, resolve_model(str(folder)).config["model_type"]).encode(TEXTS[0])
    seq = ids + [r for *_, r in steps]
    with torch.no_grad():
        logits = _reference(folder, torch.bfloat16)(torch.tensor([seq])).logits[0].float()
    for step, max_abs, _, e, r in steps:
        if e != r:
            row = logits[len(ids) - 1 + step]
            assert row[r] - row[e] <= 2 * max_abs, (step, float(row[r] - row[e]), max_abs)


def test_run_chat_generates_what_transformers_generates_for_the_template(ckpts, tmp_path, mcore):
    folder = ckpts["llama-3.2-1b"]
    bundle = tmp_path / "n.bundle"
    assert mcore("build", folder, "--max-cache-length", "128", "-o", bundle).code == 0
    out = tmp_path / "out.jsonl"
    res = mcore("run", bundle, "--prompt", "Say hi", "--max-new-tokens", "8", "--greedy", "--chat", "--output", out)
    assert res.code == 0, res
    row = json.loads(out.read_text().splitlines()[0])
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok(
        tok.apply_chat_template([{"role": "user", "content": "Say hi"}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )["input_ids"]
    assert (
        ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>") and ids.count(ids[0]) == 1
    )  # the template's BOS only
    with torch.no_grad():
        gen = _reference(folder).generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )
    want = gen[0, len(ids) :].tolist()
    assert row["tokens"] == want, row  # both stop at the first of the checkpoint's end tokens, if any


# ------------------------------------------------------------------------------------ RoPE


ROPES = {
    "llama3-factor-32": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "llama3-factor-8": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "linear-4": {"type": "linear", "factor": 4.0},
    "default": None,
}


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("rope", list(ROPES))
def test_rope_tables_equal_transformers_at_long_positions(rope, head_dim):
    """cos/sin at positions up to 131071 (Llama 3.1's context) against transformers' rotary embedding."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from mcore.families.rope import parse_rope, rope_tables

    fields = {"rope_theta": 500000.0, "rope_scaling": ROPES[rope], "max_position_embeddings": 131072}
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim, **fields)
    positions = torch.tensor([[0, 1, 2, 100, 4095, 8191, 8192, 32767, 65536, 131071]])
    with torch.no_grad():
        cos_ref, sin_ref = LlamaRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = rope_tables(parse_rope(fields, "llama", ("default", "linear", "llama3")), head_dim, 131072, "cpu")
    assert torch.equal(cos[positions[0]], cos_ref[0]) and torch.equal(sin[positions[0]], sin_ref[0])


# --------------------------------------------------------------------- graph, recipes, ABI


def test_llama_recipes_one_attention_instance_per_layer_with_qwen3s_boundary(tmp_path):
    """The attention recipe of a Llama-3.1-8B-shaped config (one layer, random weights): the region is
    the one mcore::decode_attention node and its boundary the Qwen3 recipe's, so the ABI hash is the
    one a Qwen3 build of the same shapes gives (same contract, same hash)."""
    from mcore.graph.capture import capture
    from mcore.selection.recipes import select_recipe

    from .checkpoints import _llama_3_1_8b

    shapes = dict(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=64,
        num_hidden_layers=2,
        vocab_size=256,
    )
    cfg, *_ = _llama_3_1_8b()
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**cfg, **shapes}))
    qcfg = {"model_type": "qwen3", "head_dim": 128, "max_position_embeddings": 4096, **shapes}
    (tmp_path / "qwen3").mkdir()
    (tmp_path / "qwen3" / "config.json").write_text(json.dumps(qcfg))
    receipts = {}
    for fam, recipe in (("llama", "llama.decode_attention_region@1"), ("qwen3", "qwen.decode_attention_region@2")):
        args = BuildArgs(model=str(tmp_path / fam), precision="bf16", max_cache_length=256, weights="random")
        snap = capture(args, "decode").snapshot
        rows = [r for r in snap.recipe_rows if r.id == recipe]
        assert [r.instance for r in rows] == [f"decoder.layers.{i}.decode_attention" for i in range(2)]
        assert snap.metadata["family"] == fam
        receipts[fam] = select_recipe(snap, recipe, "decoder.layers.1.decode_attention")
        assert {r.id for r in snap.recipe_rows} == {recipe, recipe.split(".")[0] + ".decode_logits_copy@1"}
    r = receipts["llama"]
    assert len(r.node_ids) == 1 and r.binding_id == "llama.decode_attention_region@1"
    assert [(t["dtype"], t["shape"]) for t in r.to_dict()["abi"]["inputs"]] == [
        ("BF16", [1, 32, -1, 128]),
        ("BF16", [1, 8, 256, 128]),
        ("BF16", [1, 8, 256, 128]),
        ("INT32", [1]),
    ]
    assert r.abi_sha256 == receipts["qwen3"].abi_sha256


def test_tied_llama_has_no_lm_head_tensor_and_ties(ckpts):
    from safetensors import safe_open

    with safe_open(str(ckpts["llama-3.2-1b"] / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    *_, core = _core(ckpts["llama-3.2-1b"])
    assert core.lm_head.weight is core.embed_tokens.weight
    *_, untied = _core(ckpts["llama-3.1-8b"])
    assert untied.lm_head.weight is not untied.embed_tokens.weight


def test_llama_biases_load_and_matter(ckpts):
    """llama-2-linear sets attention_bias and mlp_bias: every projection carries its bias."""
    *_, core = _core(ckpts["llama-2-linear"])
    attn, mlp = core.layers[0].self_attn, core.layers[0].mlp
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        assert lin.bias is not None and lin.bias.abs().max() > 0
    assert attn.q_norm is None and attn.k_norm is None


# ------------------------------------------------------------------------------ config errors


_DROP = object()


def _edited(src, tmp_path, **fields):
    folder = tmp_path / "edited"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in fields.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


LLAMA_BAD = [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}}, "yarn"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}}, "high_freq_factor"),
    (
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
        "high_freq_factor",
    ),
    ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "factor"),
    ({"rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_scaling": "llama3"}, "rope_scaling"),
    ({"hidden_act": "relu2"}, "hidden_act"),
    ({"mlp_bias": "false"}, "mlp_bias"),
    ({"attention_bias": 1}, "attention_bias"),
    ({"head_dim": 15}, "head_dim"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
]


@pytest.mark.parametrize("fields,named", LLAMA_BAD, ids=[f"{n}-{i}" for i, (_, n) in enumerate(LLAMA_BAD)])
def test_llama_config_errors_name_the_field(ckpts, tmp_path, mcore, fields, named):
    folder = _edited(ckpts["llama-3.1-8b"], tmp_path, **fields)
    res = mcore("graph", "inspect", folder, "--engine-role", "decode", "--snapshot", tmp_path / "s.json")
    assert_user_error(res, "config.json", named)
    assert not (tmp_path / "s.json").exists()


MISTRAL_BAD = [
    ({"sliding_window": "4096"}, "sliding_window"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3"),
    ({"hidden_act": "gelu"}, "hidden_act"),
]
QWEN2_BAD = [
    ({"use_sliding_window": True, "max_window_layers": 1}, "use_sliding_window"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "linear"),
    ({"tie_word_embeddings": "true"}, "tie_word_embeddings"),
]


@pytest.mark.parametrize(
    "name,fields,named",
    [("mistral-7b-v0.3", f, n) for f, n in MISTRAL_BAD] + [("qwen2.5-0.5b", f, n) for f, n in QWEN2_BAD],
    ids=[f"mistral-{n}" for _, n in MISTRAL_BAD] + [f"qwen2-{n}" for _, n in QWEN2_BAD],
)
def test_mistral_and_qwen2_config_errors_name_the_field(ckpts, tmp_path, mcore, name, fields, named):
    folder = _edited(ckpts[name], tmp_path, **fields)
    res = mcore("build", folder, "--max-cache-length", "64", "-o", tmp_path / "x.bundle")
    assert_user_error(res, "config.json", named)
    assert not (tmp_path / "x.bundle").exists()


def test_mistral_sliding_window_no_smaller_than_the_cache_is_full_attention(ckpts, tmp_path, mcore):
    """A window W serves a cache of at most W positions: the last token still sees the first, so the
    model is exactly full attention there (lockstep against transformers with the window at W); one
    position more is refused, naming the field. An omitted window is transformers' default, 4096;
    null allows any cache up to max_position_embeddings."""
    v01 = ckpts["mistral-7b-v0.1"]
    fam = get_family("mistral")
    assert fam.graph_args(resolve_model(str(v01)).config, BuildArgs(model="x")).max_cache_length == 4096
    res = mcore("build", v01, "--max-cache-length", "4097", "-o", tmp_path / "x.bundle")
    assert_user_error(res, "config.json", "sliding_window 4096", "--max-cache-length 4097")
    omitted = _edited(v01, tmp_path, sliding_window=_DROP)
    assert_user_error(
        mcore("build", omitted, "--max-cache-length", "8192", "-o", tmp_path / "x.bundle"), "sliding_window"
    )
    null = resolve_model(str(ckpts["mistral-7b-v0.3"])).config
    assert fam.graph_args(null, BuildArgs(model="x", max_cache_length=32768)).max_cache_length == 32768

    shutil.rmtree(omitted)
    folder = _edited(v01, tmp_path, sliding_window=12)
    source, fam, gargs, core = _core(folder, cap=12)
    caches = [torch.zeros(fam.cache_shape(source.config, gargs)) for _ in range(2 * core.dims.num_layers)]
    toks = torch.randint(0, source.config["vocab_size"], (12,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fam.role_module(core, "prefill")(toks[None, :4].to(torch.int32), *caches)
        for a in range(4, 12):
            lg = fam.role_module(core, "decode")(
                toks[None, a : a + 1].to(torch.int32), torch.tensor([a], dtype=torch.int32), *caches
            )
        ref = _reference(folder)(toks[None]).logits[0, -1]
    torch.testing.assert_close(lg[0], ref, atol=ATOL, rtol=0)
    assert "sliding_window 12" in str(pytest.raises(UserError, _core, folder, cap=13).value)


def test_qwen2_has_qkv_biases_only_and_ties_small_models(ckpts):
    *_, core = _core(ckpts["qwen2.5-0.5b"])
    attn, mlp = core.layers[0].self_attn, core.layers[0].mlp
    assert all(p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert attn.o_proj.bias is None and mlp.gate_proj.bias is None and attn.q_norm is None
    assert core.lm_head.weight is core.embed_tokens.weight
    *_, big = _core(ckpts["qwen2.5-7b"])
    assert big.lm_head.weight is not big.embed_tokens.weight
    assert big.dims.num_heads // big.dims.num_kv_heads == 7


# ------------------------------------------------------------------ the kind comes from mcore


def test_family_kind_comes_from_the_config_never_the_name(ckpts, tmp_path):
    """A folder named like a Qwen holding a BERT config is an encoder, one named like a BERT holding a
    Llama is a decoder: the workbench asks mcore (model_kind, family_kind), which reads config.json."""
    import mcore
    from workbench.app import WorkbenchState

    from .checkpoints import make_bert_checkpoint

    enc = make_bert_checkpoint(tmp_path / "qwen3-lookalike")
    dec = shutil.copytree(ckpts["llama-3.1-8b"], tmp_path / "bert-lookalike")
    assert mcore.model_kind(str(enc)) == "encoder" and mcore.model_kind(str(dec)) == "decoder"
    assert mcore.model_kind(str(tmp_path / "qwen3-missing")) is None
    assert mcore.model_kind("demo:mistral-tiny") == "decoder" and mcore.model_kind("demo:bert-tiny") == "encoder"
    assert [mcore.family_kind(n) for n in ("qwen3", "llama", "mistral", "qwen2", "bert")] == ["decoder"] * 4 + [
        "encoder"
    ]
    assert WorkbenchState(tmp_path, build_args={"model": str(enc)}).is_decoder is False
    assert WorkbenchState(tmp_path, build_args={"model": str(dec)}).is_decoder is True
    assert WorkbenchState(tmp_path, build_args={"model": "Qwen/not-cached"}).is_decoder is False


# ------------------------------------------------------------------------- sessions and replay


def test_a_llama_session_records_and_replays_clean(tmp_path):
    """The tutorial's recipe flow on demo:llama-tiny through the workbench's actions (what the TUI
    records), saved as a session and replayed headless: every recorded fingerprint, ABI hash, token
    and verdict reproduces."""
    from workbench.actions import ActionContext
    from workbench.dispatch import run_action
    from workbench.replay import replay
    from workbench.session import Session

    args = BuildArgs("demo:llama-tiny", precision="fp32", max_cache_length=128).validate().to_dict()
    prompt, recipe = "Explain grouped-query attention.", ["llama.decode_logits_copy@1", "decoder.logits_zero_bias"]
    steps = [
        ("capture_graph", dict(build_args=args, engine_role="decode", snapshot="decode.graph.json")),
        ("list_recipes", dict(snapshot="decode.graph.json")),
        ("build_bundle", dict(build_args=args, recipe=recipe, output="llama-slot.bundle")),
        ("build_kernel", dict(name="identity-copy", output="kernel.so", overwrite=True)),
        ("write_bindings", dict(receipt="llama-slot.selection.json", library="kernel.so", manifest="bindings.json")),
        ("build_bundle", dict(build_args=args, output="llama-native.bundle")),
        ("generate", dict(bundle="llama-native.bundle", prompt=prompt, max_new_tokens=8, output="native.jsonl")),
        (
            "generate",
            dict(
                bundle="llama-slot.bundle",
                kernel_bindings="bindings.json",
                prompt=prompt,
                max_new_tokens=8,
                output="external.jsonl",
            ),
        ),
        ("gate_tokens", dict(native="native.jsonl", external="external.jsonl")),
    ]
    session = Session.new("llama recipe flow", guided=False)
    ctx = ActionContext(workdir=tmp_path / "rec", log=lambda line: None)
    for action, params in steps:
        results, error = run_action(ctx, action, params)
        assert error is None, (action, error)
        session.record(action, params, results)
    assert session.steps[4].results["binding_id"] == "llama.decode_logits_copy@1"
    assert session.steps[0].results["recipes"] and session.steps[-1].results["passed"] is True
    path = session.save(tmp_path / "llama.json")
    report = replay(path, tmp_path / "wd", trust_libraries=".")
    assert report.ok and report.differences == [], report.render_table()


def test_profile_attributes_a_llama_step_to_its_recipe_instances(tmp_path, mcore):
    bundle = tmp_path / "llama.bundle"
    assert mcore("build", "demo:llama-tiny", "--max-cache-length", "64", "-o", bundle).code == 0
    res = mcore("profile", bundle, "--context", "16", "--steps", "1", "--top", "20", "-o", tmp_path / "p.json")
    assert res.code == 0, res
    for layer in (0, 1):
        assert f"llama.decode_attention_region@1 decoder.layers.{layer}.decode_attention" in res.out
    report = json.loads((tmp_path / "p.json").read_text())
    attention = [r for r in report["recipes"] if r["recipe"] == "llama.decode_attention_region@1"]
    assert sorted(r["instance"] for r in attention) == [f"decoder.layers.{i}.decode_attention" for i in (0, 1)]


# ------------------------------------------------------------------ Qwen3 on the shared decoder


@pytest.mark.parametrize("session", ["qwen-recipe", "qwen-attention"])
def test_qwen3_graphs_and_abi_hashes_are_the_ones_the_shipped_sessions_recorded(session):
    """Qwen3 runs on the shared decoder with the graphs it had: every role's fingerprint and the recipe
    receipts' ABI hashes a shipped tutorial recorded come out of a fresh capture unchanged."""
    from mcore.graph.capture import capture
    from mcore.selection.recipes import select_recipe_instances

    from .conftest import REPO

    steps = json.loads((REPO / "sessions" / f"{session}.json").read_text())["steps"]
    build = next(s for s in steps if s["action"] == "build_bundle" and s["params"].get("recipe"))
    args = BuildArgs.from_dict(build["params"]["build_args"])
    recipe_id, *instances = build["params"]["recipe"]
    for role, fingerprint in build["results"]["fingerprints"].items():
        snap = capture(args, role).snapshot
        assert snap.fingerprint == fingerprint, role
        if role == "decode":
            receipts = select_recipe_instances(snap, recipe_id, instances, build["params"].get("workspace_bytes"))
            assert [r.abi_sha256 for r in receipts] == [k["abi_sha256"] for k in build["results"]["kernel_slots"]]


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["llama-3.1-8b", "mistral-7b-v0.3", "qwen2.5-0.5b"])
def test_roles_on_cuda_match_cpu(ckpts, name, precision):
    """The op-by-op roles on CUDA (mcore::decode_attention's split-KV Triton kernel there) against CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    results = {}
    for device in ("cpu", "cuda"):
        source = resolve_model(str(ckpts[name]))
        fam = get_family(source.family)
        gargs = fam.graph_args(source.config, BuildArgs(model="x", precision=precision, max_cache_length=32))
        core = fam.build_core(source.config, gargs, device)
        fam.load_checkpoint(core, source)
        shape = fam.cache_shape(source.config, gargs)
        caches = [torch.zeros(shape, dtype=core.dtype, device=device) for _ in range(2 * core.dims.num_layers)]
        prefill, decode = fam.role_module(core.eval(), "prefill"), fam.role_module(core, "decode")
        with torch.no_grad():
            outs = [prefill(torch.tensor([[3, 1, 4, 1, 5]], dtype=torch.int32, device=device), *caches)]
            cl = torch.tensor([5], dtype=torch.int32, device=device)
            outs.append(decode(torch.tensor([[9]], dtype=torch.int32, device=device), cl, *caches))
            cl.fill_(6)
            outs.append(decode(torch.tensor([[2, 6, 5]], dtype=torch.int32, device=device), cl, *caches))
        results[device] = [o.cpu() for o in outs]
    tol = 1e-4 if precision == "fp32" else 5e-2
    for a, b in zip(results["cpu"], results["cuda"], strict=True):
        scale = max(a.abs().max().item(), 1.0)
        torch.testing.assert_close(b, a, atol=tol * scale, rtol=0)
