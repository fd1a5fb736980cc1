"""Tiny random transformers checkpoints (+ tokenizer.json) written into a folder, for tests.

Every function is seeded, fp32, small and fast (well under a second). Weights are perturbed
after transformers' own init so that biases and norm weights are not trivially 0/1: a loader
that swaps or drops them fails parity.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mcore.families.demo import (
    LLAMA3_CHAT_TEMPLATE,
    LLAMA3_SPECIALS,
    LLAMA3_SPLIT,
    MISTRAL_CHAT_TEMPLATE,
    MISTRAL_CONTROLS,
    QWEN2_CHAT_TEMPLATE,
    QWEN2_SPECIALS,
    QWEN2_SPLIT,
    build_tokenizer,
    sentencepiece_tokenizer,
    split_byte_level_tokenizer,
)

QWEN3_VOCAB = 300
ENCODER_VOCAB = 300


def _perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _save(model, folder: Path, sharded: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if sharded:
        model.save_pretrained(folder, max_shard_size="40KB")
        assert (folder / "model.safetensors.index.json").exists(), "expected a sharded checkpoint"
    else:
        model.save_pretrained(folder)
        assert (folder / "model.safetensors").exists()


def make_qwen3_checkpoint(
    dir: str | Path,
    sharded: bool = False,
    tie_word_embeddings: bool = False,
    attention_bias: bool = False,
    seed: int = 0,
    **config_overrides,
) -> Path:
    """Qwen3ForCausalLM: 2 layers, hidden 64, 4 heads, 2 KV heads, head_dim 16, vocab 300+1."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer([], ["<|endoftext|>"], QWEN3_VOCAB, encoder=False)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = tok.token_to_id("<|endoftext|>")
    kw = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        attention_bias=attention_bias,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    kw.update(config_overrides)
    config = Qwen3Config(**kw)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    _perturb(model, seed + 1)
    _save(model, folder, sharded)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder


def make_distilbert_checkpoint(dir: str | Path, seed: int = 0, **config_overrides) -> Path:
    """DistilBertModel: 2 layers, dim 64, 4 heads, hidden_dim 128, vocab 300."""
    from transformers import DistilBertConfig, DistilBertModel

    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], [], ENCODER_VOCAB, encoder=True)
    kw = dict(
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        dim=64,
        n_layers=2,
        n_heads=4,
        hidden_dim=128,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    kw.update(config_overrides)
    torch.manual_seed(seed)
    model = DistilBertModel(DistilBertConfig(**kw)).eval()
    _perturb(model, seed + 1)
    _save(model, folder, False)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def make_bert_checkpoint(dir: str | Path, seed: int = 0, **config_overrides) -> Path:
    """BertModel (with pooler): 2 layers, hidden 64, 4 heads, intermediate 128, vocab 300."""
    from transformers import BertConfig, BertModel

    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], [], ENCODER_VOCAB, encoder=True)
    kw = dict(
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    kw.update(config_overrides)
    torch.manual_seed(seed)
    model = BertModel(BertConfig(**kw)).eval()
    _perturb(model, seed + 1)
    _save(model, folder, False)
    tok.save(str(folder / "tokenizer.json"))
    return folder


# ------------------------------------------------------------------ tokenizers as published


def build_wordpiece_tokenizer(vocab_size: int = ENCODER_VOCAB, lowercase: bool = True, pad_to: int = 128):
    """A BERT-style WordPiece tokenizer.json as published checkpoints ship it: BertNormalizer
    (lowercasing), `[CLS] $A [SEP]`, and fixed padding to `pad_to` plus truncation switched on."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from mcore.families.demo import DEMO_TEXT

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
    )
    tok.train_from_iterator(DEMO_TEXT.splitlines(), trainer)
    v = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", v["[CLS]"]), ("[SEP]", v["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    tok.enable_padding(length=pad_to, pad_id=v["[PAD]"], pad_token="[PAD]")
    tok.enable_truncation(max_length=pad_to)
    return tok


def make_sentence_encoder_checkpoint(
    dir: str | Path,
    family: str = "bert",
    pooling: str = "mean",
    normalize: bool = True,
    do_lower_case: bool = True,
    seed: int = 0,
) -> Path:
    """A sentence-embedding checkpoint as published (e.g. a MiniLM): BERT or DistilBERT weights, the
    WordPiece tokenizer above (fixed padding to 128, truncation on), tokenizer_config.json with
    do_lower_case, and modules.json with a Pooling module (and Normalize)."""
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_wordpiece_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if family == "bert":
        make_bert_checkpoint(folder, seed=seed, vocab_size=vocab, max_position_embeddings=256)
    else:
        make_distilbert_checkpoint(folder, seed=seed, vocab_size=vocab, max_position_embeddings=256)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "BertTokenizer" if family == "bert" else "DistilBertTokenizer",
                "do_lower_case": do_lower_case,
                "model_max_length": 512,
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "unk_token": "[UNK]",
                "mask_token": "[MASK]",
            }
        )
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 64,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": pooling == "max",
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )
    return folder


CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_qwen3_bos_checkpoint(dir: str | Path, chat_template: bool = True, seed: int = 0) -> Path:
    """A Qwen3 checkpoint whose tokenizer.json adds a BOS through its post-processor (as Llama-style
    published tokenizers do), enables fixed padding and truncation, and whose tokenizer_config.json
    carries a chat template (Qwen's im_start/im_end format)."""
    from tokenizers import processors

    folder = Path(dir)
    tok = build_tokenizer([], ["<|endoftext|>", "<s>", "<|im_start|>", "<|im_end|>"], QWEN3_VOCAB, encoder=False)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.enable_padding(length=64, pad_id=tok.token_to_id("<|endoftext|>"), pad_token="<|endoftext|>")
    tok.enable_truncation(max_length=64)
    eos = tok.token_to_id("<|endoftext|>")
    make_qwen3_checkpoint(
        folder, seed=seed, vocab_size=tok.get_vocab_size(with_added_tokens=True), bos_token_id=bos, eos_token_id=eos
    )
    tok.save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": "<s>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 256,
    }
    if chat_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


# ------------------------------------------------------------------ decoders as published
#
# Tiny checkpoints whose config.json, tokenizer.json, tokenizer_config.json and generation_config.json
# carry every field the published model's do (rope_scaling objects, head_dim, bos/eos ids, tied
# embeddings, sliding windows, chat templates, the BOS-adding post-processors), at small widths and
# with the published ratios kept: GQA group (query heads per KV head) and head_dim rules.


def _llama3_tokenizer(vocab: int = 400):
    return split_byte_level_tokenizer([], LLAMA3_SPECIALS, vocab, LLAMA3_SPLIT, bos="<|begin_of_text|>")


def _sentencepiece_tokenizer(vocab: int = 400):
    return sentencepiece_tokenizer(MISTRAL_CONTROLS, vocab)


def _qwen2_tokenizer(vocab: int = 400):
    return split_byte_level_tokenizer([], QWEN2_SPECIALS, vocab, QWEN2_SPLIT, nfc=True)


def _llama3_files(tok, instruct: bool) -> tuple[dict, dict, dict]:
    """(config ids, tokenizer_config.json, generation_config.json) of a Llama 3.x release."""
    ids = {t: tok.token_to_id(t) for t in LLAMA3_SPECIALS}
    bos, eot = ids["<|begin_of_text|>"], ids["<|eot_id|>"]
    eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], eot] if instruct else ids["<|end_of_text|>"]
    tok_cfg = {
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>" if instruct else "<|end_of_text|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    gen = {"bos_token_id": bos, "do_sample": True, "eos_token_id": eos, "temperature": 0.6, "top_p": 0.9}
    return {"bos_token_id": bos, "eos_token_id": eos}, tok_cfg, gen


def _llama_3_2_1b() -> tuple:
    """Llama-3.2-1B-Instruct: 16 layers of 32/8 heads, head_dim 64, tied, llama3 RoPE factor 32."""
    tok = _llama3_tokenizer()
    ids, tok_cfg, gen = _llama3_files(tok, instruct=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        **ids,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0",
        "use_cache": True,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }
    return config, tok, tok_cfg, gen


def _llama_3_1_8b() -> tuple:
    """Llama-3.1-8B: 32 layers of 32/8 heads, no head_dim field (hidden/heads), untied, llama3 factor 8."""
    tok = _llama3_tokenizer()
    ids, tok_cfg, gen = _llama3_files(tok, instruct=False)
    config, *_ = _llama_3_2_1b()
    config = {k: v for k, v in config.items() if k != "head_dim"}
    config.update(ids)
    config.update(
        intermediate_size=224,  # 14336 / 4096 of the hidden size
        rope_scaling={
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        tie_word_embeddings=False,
        transformers_version="4.43.0.dev0",
    )
    return config, tok, tok_cfg, gen


def _llama_2_linear() -> tuple:
    """A Llama 2 long-context fine-tune: SentencePiece tokenizer, `{"type": "linear", "factor": 4.0}`
    RoPE, and the attention and MLP biases switched on (the fields Llama checkpoints may set)."""
    tok = _sentencepiece_tokenizer()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 172,
        "max_position_embeddings": 16384,
        "mlp_bias": True,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "pad_token_id": 0,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 4.0, "type": "linear"},
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.31.0",
        "use_cache": True,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }
    tok_cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "legacy": False,
        "pad_token": None,
        "tokenizer_class": "LlamaTokenizer",
        "model_max_length": 16384,
    }
    return config, tok, tok_cfg, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _mistral_7b_v0_3() -> tuple:
    """Mistral-7B-v0.3: 32 layers of 32/8 heads (head_dim 128 from hidden/heads), sliding_window null,
    the SentencePiece tokenizer with add_bos_token and the [INST] chat format."""
    tok = _sentencepiece_tokenizer()
    config = {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 224,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0",
        "use_cache": True,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }
    tok_cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "chat_template": MISTRAL_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    return config, tok, tok_cfg, {"bos_token_id": 1, "eos_token_id": 2}


def _mistral_7b_v0_1() -> tuple:
    """Mistral-7B-v0.1: as v0.3 but a 4096-token sliding window and RoPE base 10000 (no chat template)."""
    config, tok, tok_cfg, gen = _mistral_7b_v0_3()
    config.update(sliding_window=4096, rope_theta=10000.0, transformers_version="4.34.0.dev0")
    tok_cfg = {k: v for k, v in tok_cfg.items() if k != "chat_template"}
    return config, tok, tok_cfg, gen


def _qwen2_5(hidden_ratio: float, tied: bool, max_positions: int, window_layers: int) -> tuple:
    tok = _qwen2_tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    padded = (tok.get_vocab_size(with_added_tokens=True) + 63) // 64 * 64 + 64  # published: 151936 for 151665
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": 112,
        "initializer_range": 0.02,
        "intermediate_size": int(112 * hidden_ratio) // 16 * 16,
        "max_position_embeddings": max_positions,
        "max_window_layers": window_layers,
        "model_type": "qwen2",
        "num_attention_heads": 7,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": max_positions,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": padded,
    }
    tok_cfg = {
        "add_prefix_space": False,
        "bos_token": None,
        "chat_template": QWEN2_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    gen = {"bos_token_id": eos, "do_sample": False, "eos_token_id": eos, "max_new_tokens": 2048}
    return config, tok, tok_cfg, gen


def _qwen2_5_0_5b() -> tuple:
    """Qwen2.5-0.5B: 24 layers of 14/2 heads (GQA 7, head_dim 64), tied embeddings, q/k/v biases."""
    return _qwen2_5(5.43, tied=True, max_positions=32768, window_layers=24)


def _qwen2_5_7b() -> tuple:
    """Qwen2.5-7B: 28 layers of 28/4 heads (GQA 7, head_dim 128), untied, a 131072-token context."""
    return _qwen2_5(5.29, tied=False, max_positions=131072, window_layers=28)


PUBLISHED = {
    "llama-3.2-1b": _llama_3_2_1b,
    "llama-3.1-8b": _llama_3_1_8b,
    "llama-2-linear": _llama_2_linear,
    "mistral-7b-v0.3": _mistral_7b_v0_3,
    "mistral-7b-v0.1": _mistral_7b_v0_1,
    "qwen2.5-0.5b": _qwen2_5_0_5b,
    "qwen2.5-7b": _qwen2_5_7b,
}


def make_published_checkpoint(
    dir: str | Path, name: str, seed: int = 0, as_saved: bool = False, **config_overrides
) -> Path:
    """The tiny twin of a published checkpoint (PUBLISHED[name]): transformers builds and saves the
    model, then config.json and generation_config.json are written back as published (v4 spellings
    such as `rope_scaling`, which save_pretrained would rewrite), or, `as_saved`, config.json stays
    as this transformers saved it (v5: `rope_parameters`, `layer_types`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    config, tok, tok_cfg, gen = PUBLISHED[name]()
    config.update(config_overrides)
    text = json.dumps(config, indent=2)
    (folder / "config.json").write_text(text)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32).eval()
    _perturb(model, seed + 1, scale=0.2)  # large enough that greedy decoding does not repeat one token
    _save(model, folder, False)
    if not as_saved:
        (folder / "config.json").write_text(text)
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    return folder
