"""Tokenization, pooling and chat as transformers does them, on checkpoints that mimic published ones:
fixed padding and truncation enabled in tokenizer.json, lowercasing WordPiece, a BOS-adding decoder
post-processor, a chat template, a sentence-transformers modules.json. Token IDs, embeddings and
generated tokens are compared with transformers (the reference)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from mcore.model.tokenization import load_tokenizer_from_folder

from .checkpoints import make_qwen3_bos_checkpoint, make_qwen3_checkpoint, make_sentence_encoder_checkpoint
from .conftest import assert_user_error

TEXTS = [
    "The Quick brown FOX jumps over the lazy dog!",
    "Ünïcode naïve café: 12345 + 67 = 12412?",
    "def add(a, b):\n    return a + b",
    "  spaces   and\ttabs  ",
    "x " * 150,
]


def reference_ids(folder, text):
    return list(transformers.AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"])


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("tok")
    return {
        "bert": make_sentence_encoder_checkpoint(base / "bert", "bert", pooling="mean", normalize=True),
        "distilbert": make_sentence_encoder_checkpoint(
            base / "distilbert", "distilbert", pooling="cls", normalize=False
        ),
        "bert-cased-config": make_sentence_encoder_checkpoint(base / "cased", "bert", do_lower_case=False),
        "qwen3-bos": make_qwen3_bos_checkpoint(base / "qwen3-bos"),
        "qwen3": make_qwen3_checkpoint(base / "qwen3"),
    }


@pytest.mark.parametrize("name", ["bert", "distilbert", "bert-cased-config", "qwen3-bos", "qwen3"])
def test_token_ids_match_transformers(ckpts, name):
    folder = ckpts[name]
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    tok = load_tokenizer_from_folder(folder, model_type)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == reference_ids(folder, text), (name, text)
        # the tokenizer.json pads to a fixed length and truncates; transformers' plain call does neither
        assert len(ids) not in (64, 128) or len(text) > 200


def test_published_settings_are_really_in_the_files(ckpts):
    """Guard the fixtures: padding and truncation are on in tokenizer.json, so the tests above bite."""
    from tokenizers import Tokenizer

    for name in ("bert", "qwen3-bos"):
        raw = Tokenizer.from_file(str(ckpts[name] / "tokenizer.json"))
        assert raw.padding is not None and raw.truncation is not None
        assert len(raw.encode("hi").ids) in (64, 128)
    # the BOS comes from the post-processor; the cased config overrides the lowercasing json
    bos = transformers.AutoTokenizer.from_pretrained(str(ckpts["qwen3-bos"])).bos_token_id
    assert reference_ids(ckpts["qwen3-bos"], "hi")[0] == bos
    assert reference_ids(ckpts["bert-cased-config"], "FOX") != reference_ids(ckpts["bert"], "FOX")


def _st_reference(folder, text, pooling, normalize):
    """sentence-transformers' embedding computed with transformers: pool, then L2-normalize."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state[0]
    v = h.mean(0) if pooling == "mean" else h[0]
    return torch.nn.functional.normalize(v, dim=0) if normalize else v


def _cos(a, b):
    a, b = torch.tensor(a, dtype=torch.float64), b.double()
    return float(a @ b / (a.norm() * b.norm())), float((a - b).abs().max())


@pytest.mark.parametrize("name,pooling,normalize", [("bert", "mean", True), ("distilbert", "cls", False)])
def test_embed_uses_checkpoint_pooling_and_matches_transformers(ckpts, name, pooling, normalize, tmp_path, mcore):
    folder = ckpts[name]
    bundle = tmp_path / "e.bundle"
    assert mcore("build", folder, "-o", bundle).code == 0
    text = "The quick brown fox jumps over the lazy dog."
    res = mcore("embed", bundle, "--prompt", text)
    assert res.code == 0, res
    assert f"pooling={pooling} normalize={str(normalize).lower()} (from the checkpoint's modules.json)" in res.err
    emb = json.loads(res.out)["embedding"]
    cos, max_abs = _cos(emb, _st_reference(folder, text, pooling, normalize))
    assert cos > 0.99999 and max_abs < 1e-5, (cos, max_abs)
    # an explicit --pooling wins (no normalization unless asked)
    res = mcore("embed", bundle, "--prompt", text, "--pooling", "mean")
    assert "pooling=mean normalize=false (from --pooling)" in res.err
    cos, max_abs = _cos(json.loads(res.out)["embedding"], _st_reference(folder, text, "mean", False))
    assert cos > 0.99999 and max_abs < 1e-5, (cos, max_abs)


def test_too_long_prompt_is_a_length_error_not_truncated(ckpts, tmp_path, mcore):
    bundle = tmp_path / "e.bundle"
    assert mcore("build", ckpts["bert"], "--max-seq-length", "32", "-o", bundle).code == 0
    assert_user_error(mcore("embed", bundle, "--prompt", "word " * 40), "--max-seq-length is 32")


def test_unsupported_sentence_module_is_refused(ckpts, tmp_path, mcore):
    import shutil

    folder = tmp_path / "dense"
    shutil.copytree(ckpts["bert"], folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    res = mcore("build", folder, "-o", tmp_path / "x.bundle")
    assert_user_error(res, "modules.json", "sentence_transformers.models.Dense")
    assert not (tmp_path / "x.bundle").exists()


def _reference_generate(folder, ids, n):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
        )
    return out[0, len(ids) :].tolist()


def test_generation_with_bos_and_chat_matches_transformers(ckpts, tmp_path, mcore):
    folder = ckpts["qwen3-bos"]
    bundle = tmp_path / "q.bundle"
    assert mcore("build", folder, "--max-cache-length", "128", "-o", bundle).code == 0
    prompt = "Explain grouped-query attention."
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    for chat in (False, True):
        if chat:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            assert text.endswith("<|im_start|>assistant\n")
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(prompt)["input_ids"]
        out = tmp_path / f"chat{chat}.jsonl"
        args = ["run", bundle, "--prompt", prompt, "--greedy", "--max-new-tokens", "8", "--ignore-eos", "--output", out]
        res = mcore(*args, *(["--chat"] if chat else []))
        assert res.code == 0, res
        got = json.loads(out.read_text())["tokens"]
        assert got == _reference_generate(folder, ids, 8), chat


def test_chat_without_template_is_a_clear_error(ckpts, tmp_path, mcore):
    bundle = tmp_path / "q.bundle"
    assert mcore("build", ckpts["qwen3"], "--max-cache-length", "64", "-o", bundle).code == 0
    res = mcore("run", bundle, "--prompt", "hi", "--chat", "--max-new-tokens", "2")
    assert_user_error(res, "no chat template", "run without --chat")


@pytest.mark.parametrize("field,value", [("cls_token", None), ("sep_token", 7)])
def test_bert_special_token_of_the_wrong_type_is_one_line(ckpts, field, value):
    # a published BERT tokenizer_config names its special tokens as strings; null or a number is a
    # damaged file, said in one line (it was a TypeError from the tokenizers library)
    from mcore.common.errors import UserError
    from mcore.model.tokenization import TextTokenizer

    folder = ckpts["bert"]
    config = {**json.loads((folder / "tokenizer_config.json").read_text()), field: value}
    with pytest.raises(UserError, match=f"tokenizer_config.json field '{field}' must be a token string"):
        TextTokenizer((folder / "tokenizer.json").read_text(), config, "bert", where=str(folder))
