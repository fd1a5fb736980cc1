"""Config fields a family does not implement, or holds with a wrong type or range, are one-line errors
naming the field; tensors stored with a wrong dtype are refused. Published field sets (Qwen3 with
tied and untied embeddings, BERT, DistilBERT) load and match transformers."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from mcore.families import get_family
from mcore.families.source import resolve_model
from mcore.model.buildargs import BuildArgs

from .checkpoints import make_bert_checkpoint, make_distilbert_checkpoint, make_qwen3_checkpoint
from .conftest import assert_user_error


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cfg")
    return {
        "qwen3": make_qwen3_checkpoint(base / "qwen3"),
        "bert": make_bert_checkpoint(base / "bert"),
        "distilbert": make_distilbert_checkpoint(base / "distilbert"),
    }


def _edited(src, tmp_path, **fields):
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in fields.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    # json.dumps writes NaN/Infinity literals, as a hand-edited or badly exported config would hold
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


_DROP = object()

QWEN_BAD = [
    ({"rms_norm_eps": math.nan}, "rms_norm_eps"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
    ({"rope_theta": math.inf, "rope_parameters": _DROP}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": math.inf}}, "rope_theta"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"attention_bias": "no"}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "yarn"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "linear"),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
        "partial_rotary_factor",
    ),
    (
        {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1, "layer_types": _DROP},
        "use_sliding_window",
    ),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers"),
    ({"vocab_size": True}, "vocab_size"),
]


@pytest.mark.parametrize("fields,named", QWEN_BAD, ids=[n for _, n in QWEN_BAD])
def test_qwen3_config_errors_name_the_field(dirs, tmp_path, mcore, fields, named):
    folder = _edited(dirs["qwen3"], tmp_path, **fields)
    res = mcore("graph", "inspect", folder, "--engine-role", "decode", "--snapshot", tmp_path / "s.json")
    assert_user_error(res, "config.json", named)
    assert not (tmp_path / "s.json").exists()


ENCODER_BAD = [
    ("bert", {"layer_norm_eps": math.nan}, "layer_norm_eps"),
    ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("bert", {"hidden_act": "mish"}, "hidden_act"),
    ("bert", {"is_decoder": "false"}, "is_decoder"),
    ("bert", {"type_vocab_size": -1}, "type_vocab_size"),
    ("distilbert", {"activation": "tanh"}, "activation"),
    ("distilbert", {"sinusoidal_pos_embds": "true"}, "sinusoidal_pos_embds"),
]


@pytest.mark.parametrize("family,fields,named", ENCODER_BAD, ids=[n for _, _, n in ENCODER_BAD])
def test_encoder_config_errors_name_the_field(dirs, tmp_path, mcore, family, fields, named):
    folder = _edited(dirs[family], tmp_path, **fields)
    res = mcore("build", folder, "-o", tmp_path / "x.bundle")
    assert_user_error(res, "config.json", named)
    assert not (tmp_path / "x.bundle").exists()


def test_float_weight_stored_as_int32_is_refused(dirs, tmp_path, mcore):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "i32"
    shutil.copytree(dirs["bert"], folder)
    state = load_file(str(folder / "model.safetensors"))
    name = next(n for n in sorted(state) if n.endswith("attention.self.query.weight"))
    state[name] = state[name].to(torch.int32)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    res = mcore("build", folder, "-o", tmp_path / "x.bundle")
    assert_user_error(res, name, "INT32", "floating-point")


def _qwen_logits(folder, ids):
    source = resolve_model(str(folder))
    fam = get_family(source.family)
    gargs = fam.graph_args(source.config, BuildArgs(model=str(folder), max_cache_length=32))
    core = fam.build_core(source.config, gargs, "cpu")
    fam.load_checkpoint(core, source)
    caches = [torch.zeros(fam.cache_shape(source.config, gargs)) for _ in range(2 * core.dims.num_layers)]
    with torch.no_grad():
        return fam.role_module(core.eval(), "prefill")(torch.tensor([ids], dtype=torch.int32), *caches)[0]


def test_tied_checkpoint_storing_lm_head(tmp_path, mcore):
    """Published tied checkpoints may store lm_head.weight too. An identical copy ties (logits match
    transformers); a different one, which transformers would leave untied against the config, is
    refused with the field to fix."""
    from safetensors.torch import load_file, save_file

    folder = make_qwen3_checkpoint(tmp_path / "tied", tie_word_embeddings=True, seed=2)
    state = load_file(str(folder / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    ids = [5, 17, 42, 99, 3]
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(_qwen_logits(folder, ids), want, atol=1e-4, rtol=0)

    state["lm_head.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert_user_error(mcore("build", folder, "-o", tmp_path / "x.bundle"), "tie_word_embeddings", "lm_head.weight")


def test_published_qwen3_field_set_loads(tmp_path):
    """The fields a published Qwen3 config.json carries (v4 and v5 spellings) are accepted."""
    folder = make_qwen3_checkpoint(tmp_path / "pub", tie_word_embeddings=False, seed=4)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "max_window_layers": 28,
            "sliding_window": None,
            "use_sliding_window": False,
            "use_cache": True,
            "torch_dtype": "bfloat16",
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "transformers_version": "4.51.0",
        }
    )
    cfg.pop("rope_parameters", None)
    cfg.pop("layer_types", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    ids = [1, 2, 3, 250]
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(_qwen_logits(folder, ids), want, atol=1e-4, rtol=0)


PUBLISHED_ENCODER_FIELDS = {
    "bert": {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "gradient_checkpointing": False,
        "hidden_dropout_prob": 0.1,
        "initializer_range": 0.02,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "transformers_version": "4.8.2",
        "use_cache": True,
        "is_decoder": False,
        "add_cross_attention": False,
        "layer_norm_eps": 1e-12,
    },
    "distilbert": {
        "architectures": ["DistilBertModel"],
        "attention_dropout": 0.1,
        "dropout": 0.1,
        "initializer_range": 0.02,
        "qa_dropout": 0.1,
        "seq_classif_dropout": 0.2,
        "sinusoidal_pos_embds": False,
        "tie_weights_": True,
        "activation": "gelu",
        "transformers_version": "4.6.0.dev0",
    },
}


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_published_encoder_field_sets_load_and_match(dirs, tmp_path, family):
    """The fields published BERT / DistilBERT config.json files carry are accepted and the
    encoder's hidden states still match transformers."""
    folder = _edited(dirs[family], tmp_path, **PUBLISHED_ENCODER_FIELDS[family])
    source = resolve_model(str(folder))
    fam = get_family(source.family)
    gargs = fam.graph_args(source.config, BuildArgs(model=str(folder), max_seq_length=16))
    core = fam.build_core(source.config, gargs, "cpu")
    fam.load_checkpoint(core, source)
    ids = torch.tensor([2, 40, 77, 150, 9, 3] + [0] * 10, dtype=torch.int32)
    mask = torch.tensor([1] * 6 + [0] * 10, dtype=torch.int32)
    ref = transformers.AutoModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        got = fam.role_module(core.eval(), "encoder")(ids, mask)[:6]
        want = ref(input_ids=ids[None, :6].long()).last_hidden_state[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
