"""Tiny random transformers checkpoints (+ tokenizer.json) written into a folder, for tests.

Every function is seeded, fp32, small and fast (well under a second). Weights are perturbed
after transformers' own init so that biases and norm weights are not trivially 0/1: a loader
that swaps or drops them fails parity.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mcore.families.demo import build_tokenizer

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
