"""Model sources, checkpoint loading errors and family registry: every bad input is a one-line UserError."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mcore.common.errors import UserError
from mcore.families import family_for_config, family_names, get_family
from mcore.families import weights as W
from mcore.families.source import load_tokenizer, resolve_model, special_tokens
from mcore.model.buildargs import BuildArgs

from .checkpoints import make_bert_checkpoint, make_distilbert_checkpoint, make_qwen3_checkpoint


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("src") / "qwen3")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return make_bert_checkpoint(tmp_path_factory.mktemp("src") / "bert")


def _err(fn, *a, **kw) -> str:
    with pytest.raises(UserError) as e:
        fn(*a, **kw)
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _load(folder):
    source = resolve_model(str(folder))
    fam = get_family(source.family)
    extra = {"max_cache_length": 16} if fam.kind == "decoder" else {"max_seq_length": 16}
    gargs = fam.graph_args(source.config, BuildArgs(model=str(folder), **extra))
    core = fam.build_core(source.config, gargs, "cpu")
    fam.load_checkpoint(core, source)
    return core


# ----------------------------------------------------------------------------- registry


def test_registry():
    assert family_names() == ["qwen3", "llama", "mistral", "qwen2", "distilbert", "bert"]
    for n in family_names():
        assert get_family(n).name == n
    for decoder in ("qwen3", "llama", "mistral", "qwen2"):
        assert family_for_config({"model_type": decoder}).kind == "decoder"
        assert family_for_config({"model_type": decoder}).roles == ("prefill", "decode")
    assert family_for_config({"model_type": "bert"}).kind == "encoder"
    assert family_for_config({"model_type": "distilbert"}).roles == ("encoder",)
    msg = _err(get_family, "phi3")
    assert "phi3" in msg and "qwen3" in msg and "llama" in msg


def test_unknown_model_type(tmp_path, qwen3_dir):
    msg = _err(family_for_config, {"model_type": "phi3"})
    assert "'phi3'" in msg and "qwen3" in msg and "llama" in msg and "distilbert" in msg and "bert" in msg
    d = _copy(qwen3_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    msg = _err(resolve_model, str(d))
    assert "gpt2" in msg and "qwen3" in msg
    assert "missing" in _err(family_for_config, {})


# ----------------------------------------------------------------------------- resolve


def test_folder_resolves(qwen3_dir):
    s = resolve_model(str(qwen3_dir), revision="abc123")
    assert s.family == "qwen3" and s.path == qwen3_dir.resolve() and s.revision == "abc123"
    assert s.config["model_type"] == "qwen3" and s.spec == str(qwen3_dir)


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    msg = _err(resolve_model, str(tmp_path / "empty"))
    assert "config.json" in msg and str(tmp_path / "empty") in msg


def test_malformed_config(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    assert "malformed JSON" in _err(resolve_model, str(d))


def test_file_not_folder(tmp_path):
    f = tmp_path / "config.json"
    f.write_text("{}")
    assert "folder" in _err(resolve_model, str(f))


def test_nonexistent_path(tmp_path):
    msg = _err(resolve_model, str(tmp_path / "nope" / "deeper"))
    assert "no such folder" in msg
    assert "no model" in _err(resolve_model, "  ")


def test_unknown_demo():
    msg = _err(resolve_model, "demo:gpt-huge")
    assert "gpt-huge" in msg and "demo:qwen3-tiny" in msg


def test_hub_id_not_cached_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as C

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(tmp_path / "hub"))
    msg = _err(resolve_model, "some-org/some-model", revision="0123abc")
    assert "some-org/some-model" in msg and "not in the local" in msg and "folder" in msg


def test_hub_id_from_local_cache(tmp_path, monkeypatch, qwen3_dir):
    """A hub ID present in the Hugging Face cache resolves offline, revision by ref or by commit."""
    import huggingface_hub.constants as C

    commit = "a" * 40
    repo = tmp_path / "hub" / "models--acme--tiny-qwen3"
    snap = repo / "snapshots" / commit
    shutil.copytree(qwen3_dir, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(tmp_path / "hub"))
    s = resolve_model("acme/tiny-qwen3")
    assert s.family == "qwen3" and s.path == snap.resolve() and s.spec == "acme/tiny-qwen3"
    assert s.revision == commit  # the resolved commit is recorded when none was pinned
    s = resolve_model("acme/tiny-qwen3", revision=commit)
    assert s.revision == commit and s.path == snap.resolve()
    msg = _err(resolve_model, "acme/tiny-qwen3", revision="b" * 40)
    assert "not in the local" in msg
    # its kind is read from the cached config.json too (no download), and unknown when not cached
    from mcore import model_kind

    assert model_kind("acme/tiny-qwen3") == "decoder" and model_kind("acme/not-cached") is None


# ----------------------------------------------------------------------------- weights


def test_missing_weight_tensor(tmp_path, qwen3_dir):
    from safetensors.torch import load_file, save_file

    d = _copy(qwen3_dir, tmp_path / "m")
    t = load_file(str(d / "model.safetensors"))
    del t["model.layers.1.self_attn.k_norm.weight"]
    save_file(t, str(d / "model.safetensors"))
    msg = _err(_load, d)
    assert "missing" in msg and "layers.1.self_attn.k_norm.weight" in msg


def test_unexpected_weight_tensor(tmp_path, qwen3_dir):
    from safetensors.torch import load_file, save_file

    d = _copy(qwen3_dir, tmp_path / "m")
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.0.self_attn.rotary.weight"] = torch.zeros(2)
    save_file(t, str(d / "model.safetensors"))
    msg = _err(_load, d)
    assert "unexpected" in msg and "model.layers.0.self_attn.rotary.weight" in msg


def test_wrong_shape_weight_tensor(tmp_path, qwen3_dir):
    from safetensors.torch import load_file, save_file

    d = _copy(qwen3_dir, tmp_path / "m")
    t = load_file(str(d / "model.safetensors"))
    t["model.norm.weight"] = torch.ones(3)
    save_file(t, str(d / "model.safetensors"))
    msg = _err(_load, d)
    assert "model.norm.weight" in msg and "[3]" in msg


def test_untied_checkpoint_missing_lm_head(tmp_path, qwen3_dir):
    from safetensors.torch import load_file, save_file

    d = _copy(qwen3_dir, tmp_path / "m")
    t = load_file(str(d / "model.safetensors"))
    del t["lm_head.weight"]
    save_file(t, str(d / "model.safetensors"))
    assert "lm_head.weight" in _err(_load, d)


def test_no_safetensors(tmp_path, qwen3_dir):
    d = _copy(qwen3_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"")
    msg = _err(_load, d)
    assert "safetensors" in msg and ".bin" in msg


def test_sharded_index_with_missing_shard(tmp_path):
    d = make_qwen3_checkpoint(tmp_path / "s", sharded=True)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[0]
    (d / victim).unlink()
    assert victim in _err(_load, d)


def test_read_checkpoint_sharded_equals_single(tmp_path):
    a = W.read_checkpoint(make_qwen3_checkpoint(tmp_path / "a", seed=9))
    b = W.read_checkpoint(make_qwen3_checkpoint(tmp_path / "b", seed=9, sharded=True))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert W.cast(a["model.norm.weight"], torch.bfloat16).dtype == torch.bfloat16
    assert W.cast(torch.zeros(2, dtype=torch.int64), torch.bfloat16).dtype == torch.int64
    assert W.dtype_name(torch.bfloat16) == "BF16" and W.dtype_name(torch.int32) == "INT32"


def test_random_init_deterministic(qwen3_dir):
    source = resolve_model(str(qwen3_dir))
    fam = get_family("qwen3")
    g = fam.graph_args(source.config, BuildArgs(model="x", max_cache_length=8, precision="bf16"))
    a, b, c = (fam.build_core(source.config, g, "cpu") for _ in range(3))
    fam.random_init(a, 1)
    fam.random_init(b, 1)
    fam.random_init(c, 2)
    for (n, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True):
        assert torch.equal(pa, pb) and pa.dtype == torch.bfloat16
        if "norm" in n:
            assert torch.all(pa == 1)
        else:
            assert not torch.equal(pa, pc) and 0.01 < pa.float().std() < 0.03
    fam.random_init(fam.build_core(source.config, g, "meta"), 0)  # meta: a no-op, no error


def test_building_a_core_draws_no_weights_and_loading_fills_them_all(monkeypatch, qwen3_dir, bert_dir):
    """build_core leaves Linear and Embedding weights to the loader (the checkpoint, or random_init):
    their default draws were thrown away (a third of a large core's CPU time to load). So
    the loader must fill every parameter: a core poisoned with NaN after building holds none after
    loading or random_init."""
    drawn: list[str] = []  # default draws on real memory (building on the meta device costs nothing)

    def spy(real, name):
        def draw(t, *a, **k):
            if t.device.type != "meta":
                drawn.append(name)
            return real(t, *a, **k)

        return draw

    for name in ("kaiming_uniform_", "uniform_", "normal_"):
        monkeypatch.setattr(torch.nn.init, name, spy(getattr(torch.nn.init, name), name))
    for folder in (qwen3_dir, bert_dir):
        source = resolve_model(str(folder))
        fam = get_family(source.family)
        extra = {"max_cache_length": 16} if fam.kind == "decoder" else {"max_seq_length": 16}
        gargs = fam.graph_args(source.config, BuildArgs(model=str(folder), **extra))
        for fill in (
            lambda core, fam=fam, source=source: fam.load_checkpoint(core, source),
            lambda core, fam=fam: fam.random_init(core, 3),
        ):
            core = fam.build_core(source.config, gargs, "cpu")
            assert drawn == [], source.family
            with torch.no_grad():
                for p in core.parameters():
                    p.fill_(float("nan"))
            fill(core)
            unfilled = [n for n, p in core.named_parameters() if not torch.isfinite(p).all()]
            assert unfilled == [], (source.family, unfilled)


# ----------------------------------------------------------------------------- config checks


def test_unsupported_rope_scaling(tmp_path, qwen3_dir):
    d = _copy(qwen3_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = 1e6
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    source = resolve_model(str(d))
    msg = _err(get_family("qwen3").graph_args, source.config, BuildArgs(model="x"))
    assert "yarn" in msg and "rope" in msg
    cfg["rope_scaling"] = None  # the pre-v5 spelling of the default type
    from mcore.families.rope import parse_rope

    def rope_theta(config):
        return parse_rope(config, "qwen3").theta

    assert rope_theta(cfg) == 1e6
    assert rope_theta({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}) == 5e5
    assert "linear" in _err(rope_theta, {"rope_parameters": {"rope_type": "linear", "rope_theta": 5e5}})


def test_graph_args_that_do_not_apply(qwen3_dir, bert_dir):
    q = resolve_model(str(qwen3_dir))
    b = resolve_model(str(bert_dir))
    msg = _err(get_family("qwen3").graph_args, q.config, BuildArgs(model="x", max_seq_length=128))
    assert msg == "--max-seq-length does not apply to qwen3 (a decoder); use --max-cache-length"
    assert "does not apply to an encoder" in _err(
        get_family("bert").graph_args, b.config, BuildArgs(model="x", max_cache_length=64)
    )
    assert "does not apply to an encoder" in _err(
        get_family("bert").graph_args, b.config, BuildArgs(model="x", decoder_engine_layout="split")
    )
    assert "max_position_embeddings" in _err(
        get_family("qwen3").graph_args, q.config, BuildArgs(model="x", max_cache_length=100000)
    )
    assert "max_position_embeddings" in _err(
        get_family("bert").graph_args, b.config, BuildArgs(model="x", max_seq_length=1000)
    )
    assert "role" in _err(get_family("qwen3").role_io, q.config, {}, "encoder")


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_and_special_tokens(tmp_path, qwen3_dir, bert_dir):
    q = resolve_model(str(qwen3_dir))
    tok = load_tokenizer(q)
    assert tok.decode(tok.encode("hello world").ids) == "hello world"
    st = special_tokens(q)
    eos = tok.token_to_id("<|endoftext|>")
    assert st["eos_token_id"] == eos and st["eos_token_ids"] == [eos]
    assert "cls_token_id" not in st
    b = resolve_model(str(bert_dir))
    st = special_tokens(b)
    assert st["pad_token_id"] == 0 and st["cls_token_id"] == 2 and st["sep_token_id"] == 3
    d = _copy(bert_dir, tmp_path / "notok")
    (d / "tokenizer.json").unlink()
    msg = _err(load_tokenizer, resolve_model(str(d)))
    assert "tokenizer.json" in msg
    (d / "tokenizer.json").write_text("{broken")
    assert "tokenizer.json" in _err(load_tokenizer, resolve_model(str(d)))


def test_distilbert_ignores_mlm_head(tmp_path):
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    d = make_distilbert_checkpoint(tmp_path / "d")
    cfg = DistilBertConfig.from_pretrained(str(d))
    DistilBertForMaskedLM(cfg).save_pretrained(tmp_path / "mlm")
    shutil.copy(d / "tokenizer.json", tmp_path / "mlm" / "tokenizer.json")
    core = _load(tmp_path / "mlm")
    assert core.layers[1].attention.q_lin.weight.shape == (64, 64)
