"""Demo models, materialized offline and deterministically on first use.

`demo:qwen3-tiny`, `demo:llama-tiny`, `demo:distilbert-tiny`, ... (DEMOS) become real Hugging Face style
checkpoint folders (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json for the decoder) under

    $MCORE_CACHE_DIR/demo/<name>      (MCORE_CACHE_DIR defaults to ~/.cache/mcore)

The bytes are the same on every machine: the weights come from integer draws of a seeded CPU
torch.Generator mapped to float32 with exact arithmetic (no transcendental functions, whose
vectorized implementations differ between CPUs); the tokenizer is a byte-level BPE whose merges
are learned by a small pure-Python trainer on a fixed embedded text. A folder is written to a
temporary sibling and renamed into place, so readers never see a half-written model; a marker
file records the generator version and the files' SHA-256, and is checked on every use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import torch

from ..common.errors import UserError

GENERATOR_VERSION = 1
MARKER = ".mcore-demo.json"

DEMO_TEXT = """\
Bring your own kernel into the graph. A kernel author picks a model, browses the graph that the
engine will run, circles a region, and gets a receipt with an exact call contract. The kernel
reads its inputs in order, writes its output, and never waits for the host. The engine binds the
library when a pipeline loads, and the new kernel is promoted only when it is correct and fast.

Attention compares each query with every key that came before it. The keys and values live in a
cache of fixed capacity; the active length says how much of the cache holds real tokens. Grouped
query attention shares one key head among several query heads, which makes the cache smaller and
the decode step cheaper. A decode step reads the whole active cache once for every new token.

The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the warm sun, and the fox
runs into the green forest. Small models are useful for tests: they load in a moment, they fit in
any memory, and their numbers can be checked against a reference implementation line by line.

Once upon a time there was a little program that wanted to run faster. It measured itself, found
the slow part, and replaced it with a better kernel. Then it measured again, because a change
that is not measured is only a hope. The program was correct before, and it stayed correct after.

One, two, three, four, five, six, seven, eight, nine, ten. Red, orange, yellow, green, blue,
indigo, violet. Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. The numbers
0 1 2 3 4 5 6 7 8 9 and the symbols + - * / = ( ) [ ] { } < > are part of the alphabet too.
def add(a, b):
    return a + b
for i in range(10):
    print(add(i, i * 2))
"""


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE with a deterministic pure-Python trainer
# ---------------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """The byte-level alphabet (GPT-2 convention): each byte maps to one printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def train_bpe(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learned on `text`: the most frequent pair wins, ties broken by the
    pair's characters, stopping early when no pair occurs twice. Deterministic."""
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    counts = Counter(piece for piece, _ in pre.pre_tokenize_str(text))
    return _train_merges({tuple(w): c for w, c in sorted(counts.items())}, num_merges)


def _train_merges(words: dict[tuple[str, ...], int], num_merges: int) -> list[tuple[str, str]]:
    """BPE merges over `words` (symbol tuples -> counts): the most frequent pair first, ties broken
    by the pair's characters, stopping early when no pair occurs twice. Deterministic."""
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: Counter = Counter()
        for w, c in words.items():
            for a, b in pairwise(w):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        (a, b) = best[0]
        merges.append((a, b))
        merged: dict[tuple[str, ...], int] = {}
        for w, c in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            t = tuple(out)
            merged[t] = merged.get(t, 0) + c
        words = merged
    return merges


def _byte_level_vocab(
    specials_first: list[str], specials_last: list[str], vocab_size: int
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges): specials_first, the 256 byte characters, the learned merges, specials_last."""
    alphabet = [bytes_to_unicode()[b] for b in range(256)]
    n_merges = vocab_size - len(specials_first) - 256 - len(specials_last)
    merges = train_bpe(DEMO_TEXT, n_merges)
    vocab: dict[str, int] = {}
    for text in specials_first + alphabet:
        vocab[text] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    for text in specials_last:
        vocab[text] = len(vocab)
    return vocab, merges


def build_tokenizer(specials_first: list[str], specials_last: list[str], vocab_size: int, encoder: bool):
    """A byte-level BPE tokenizers.Tokenizer with exactly `vocab_size` entries (fewer only if the
    text runs out of repeated pairs): specials_first, 256 bytes, merges, specials_last."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = _byte_level_vocab(specials_first, specials_last, vocab_size)
    model = models.BPE(vocab=vocab, merges=merges, unk_token="[UNK]" if encoder else None)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials_first + specials_last])
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


# The pre-tokenizer splits of published byte-level tokenizers (tokenizer.json's Split pattern): Llama 3
# groups up to three digits, Qwen2/2.5/3 one. Letters, then numbers, punctuation, newlines, spaces.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def split_byte_level_tokenizer(
    specials_first: list[str],
    specials_last: list[str],
    vocab_size: int,
    split: str,
    bos: str | None = None,
    nfc: bool = False,
):
    """A byte-level BPE laid out as Llama 3 (split=LLAMA3_SPLIT, bos="<|begin_of_text|>": its
    post-processor adds the BOS) or Qwen2.5 (split=QWEN2_SPLIT, nfc=True, no BOS) publish theirs: a
    Split pre-tokenizer, then bytes to characters; the same vocabulary rule as build_tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab, merges = _byte_level_vocab(specials_first, specials_last, vocab_size)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=bos is not None))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials_first + specials_last])
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos is None:
        tok.post_processor = byte_level
    else:
        adds_bos = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, vocab[bos])]
        )
        tok.post_processor = processors.Sequence([byte_level, adds_bos])
    return tok


def sentencepiece_tokenizer(controls: list[str], vocab_size: int):
    """A SentencePiece-style BPE laid out as Mistral 7B v0.3 (and Llama 2) publish theirs: <unk>, <s>,
    </s>, the control tokens, the 256 byte-fallback tokens <0x00>..<0xFF>, then pieces, where "▁"
    marks a space and starts the text (Metaspace, prepend "first"); the post-processor adds <s>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = ["<unk>", "<s>", "</s>"] + controls
    vocab: dict[str, int] = {t: i for i, t in enumerate(specials)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    words = Counter("▁" + w for w in DEMO_TEXT.replace("\n", " ").split(" ") if w)
    for ch in sorted({c for w in words for c in w}):
        vocab[ch] = len(vocab)
    merges = _train_merges({tuple(w): c for w, c in sorted(words.items())}, vocab_size - len(vocab))
    for left, right in merges:
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", vocab["<s>"])]
    )
    return tok


# ---------------------------------------------------------------------------------------------
# Weights: exact, portable pseudo-random values
# ---------------------------------------------------------------------------------------------


class _Draw:
    """Uniform float32 values from a seeded CPU torch.Generator, computed with exact arithmetic."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator(device="cpu")
        self.g.manual_seed(seed)

    def uniform(self, shape: tuple[int, ...], scale: float) -> torch.Tensor:
        k = torch.randint(0, 1 << 24, shape, generator=self.g, dtype=torch.int64)
        u = (k.to(torch.float32) + 0.5) * (2.0 / (1 << 24)) - 1.0  # exact: (-1, 1)
        return u * torch.tensor(scale, dtype=torch.float32)

    def around_one(self, shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return self.uniform(shape, scale) + 1.0


WeightSpec = list[tuple[str, tuple[int, ...], str, float]]  # (name, shape, "w" or "one", scale)


def _weights(spec: WeightSpec, seed: int) -> dict[str, torch.Tensor]:
    """spec: (name, shape, kind in {'w', 'one'}, scale); drawn in sorted-name order."""
    d = _Draw(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape, kind, scale in sorted(spec, key=lambda s: s[0]):
        out[name] = d.around_one(shape, scale) if kind == "one" else d.uniform(shape, scale)
    return out


# Uniform(-a, a) has std a/sqrt(3): a = 0.035 is std ~0.02.
STD = 0.035


def _qwen3_tiny() -> dict:
    return _qwen3_demo(L=2, H=4, KV=2, D=16, HID=64, FF=128, seed=1001)


def _qwen3_tiny_hd64() -> dict:
    """Head dim 64 (a size the Qwen3 family uses, which attention kernels such as the CuTe DSL
    decode attention in kernels/ are written for), GQA 4, still small enough for CPU tests."""
    return _qwen3_demo(L=2, H=8, KV=2, D=64, HID=128, FF=256, seed=1004)


def _decoder_weight_spec(
    L: int, H: int, KV: int, D: int, HID: int, FF: int, vocab: int, qk_norm: bool, qkv_bias: bool = False, tied=False
) -> WeightSpec:
    """The tensors of a *ForCausalLM checkpoint (model.* and lm_head, unless tied) and their scales."""
    spec: WeightSpec = [("model.embed_tokens.weight", (vocab, HID), "w", 1.0)]
    if not tied:
        spec.append(("lm_head.weight", (vocab, HID), "w", 0.3))
    spec.append(("model.norm.weight", (HID,), "one", 0.1))
    for i in range(L):
        p = f"model.layers.{i}."
        spec += [
            (p + "input_layernorm.weight", (HID,), "one", 0.1),
            (p + "post_attention_layernorm.weight", (HID,), "one", 0.1),
            (p + "self_attn.q_proj.weight", (H * D, HID), "w", 0.25),
            (p + "self_attn.k_proj.weight", (KV * D, HID), "w", 0.25),
            (p + "self_attn.v_proj.weight", (KV * D, HID), "w", 0.25),
            (p + "self_attn.o_proj.weight", (HID, H * D), "w", 0.25),
            (p + "mlp.gate_proj.weight", (FF, HID), "w", 0.25),
            (p + "mlp.up_proj.weight", (FF, HID), "w", 0.25),
            (p + "mlp.down_proj.weight", (HID, FF), "w", 0.2),
        ]
        if qk_norm:
            spec += [
                (p + "self_attn.q_norm.weight", (D,), "one", 0.1),
                (p + "self_attn.k_norm.weight", (D,), "one", 0.1),
            ]
        if qkv_bias:
            spec += [(p + f"self_attn.{x}_proj.bias", (n * D,), "w", 0.1) for x, n in (("q", H), ("k", KV), ("v", KV))]
    return spec


def _qwen3_demo(L: int, H: int, KV: int, D: int, HID: int, FF: int, seed: int) -> dict:
    tok = build_tokenizer([], ["<|endoftext|>"], 512, encoder=False)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = tok.token_to_id("<|endoftext|>")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": HID,
        "intermediate_size": FF,
        "num_hidden_layers": L,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "head_dim": D,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": L,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": None,
        "dtype": "float32",
    }
    spec = _decoder_weight_spec(L, H, KV, D, HID, FF, vocab, qk_norm=True)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
    }
    gen = {"bos_token_id": eos, "eos_token_id": [eos], "do_sample": False}
    return {
        "config": config,
        "weights": _weights(spec, seed=seed),
        "tokenizer": tok,
        "tokenizer_config": tok_cfg,
        "generation_config": gen,
    }


# Special tokens and chat templates in the formats the published checkpoints use (the templates are
# written here, not copied): Llama 3.x's header turns with a dated system block, Mistral's [INST]
# turns, Qwen2.5's im_start/im_end with a default system turn.
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
MISTRAL_CONTROLS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>"]

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}\n"
    "{%- if date_string is not defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- system + '<|eot_id|>' }}\n"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"
)
MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)
QWEN2_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}\n"
    "{%- for message in messages %}{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)


def _llama_tiny() -> dict:
    """Shaped like Llama-3.2-1B-Instruct at a small width: head_dim 64 (the CuTe DSL decode attention
    in kernels/ takes it), GQA 4, tied embeddings, llama3 RoPE scaling, a tokenizer whose
    post-processor adds <|begin_of_text|>, Llama 3's chat format and its three end tokens."""
    L, H, KV, D, HID, FF = 2, 8, 2, 64, 128, 256
    tok = split_byte_level_tokenizer([], LLAMA3_SPECIALS, 512, LLAMA3_SPLIT, bos="<|begin_of_text|>")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    eos = [tok.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": D,
        "hidden_act": "silu",
        "hidden_size": HID,
        "initializer_range": 0.02,
        "intermediate_size": FF,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
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
        "use_cache": True,
        "vocab_size": vocab,
        "dtype": "float32",
    }
    tok_cfg = {
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return {
        "config": config,
        "weights": _weights(_decoder_weight_spec(L, H, KV, D, HID, FF, vocab, qk_norm=False, tied=True), seed=5005),
        "tokenizer": tok,
        "tokenizer_config": tok_cfg,
        "generation_config": {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False},
    }


def _mistral_tiny() -> dict:
    """Shaped like Mistral-7B-v0.3 at a small width: head_dim 64 from hidden/heads, GQA 4, no
    sliding window, a SentencePiece-style tokenizer that adds <s>, and the [INST] chat format."""
    L, H, KV, HID, FF = 2, 4, 1, 256, 512
    D = HID // H
    tok = sentencepiece_tokenizer(MISTRAL_CONTROLS, 512)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    config = {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": HID,
        "initializer_range": 0.02,
        "intermediate_size": FF,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": vocab,
        "dtype": "float32",
    }
    tok_cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "chat_template": MISTRAL_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "pad_token": None,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
    }
    return {
        "config": config,
        "weights": _weights(_decoder_weight_spec(L, H, KV, D, HID, FF, vocab, qk_norm=False), seed=6006),
        "tokenizer": tok,
        "tokenizer_config": tok_cfg,
        "generation_config": {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False},
    }


def _qwen2_tiny() -> dict:
    """Shaped like Qwen2.5-0.5B at a small width: 7 query heads a KV head (GQA 7), head_dim 64 from
    hidden/heads, q/k/v biases, tied embeddings, Qwen's byte-level tokenizer (no BOS) and chat format."""
    L, H, KV, HID, FF = 2, 7, 1, 448, 1024
    D = HID // H
    tok = split_byte_level_tokenizer([], QWEN2_SPECIALS, 512, QWEN2_SPLIT, nfc=True)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = tok.token_to_id("<|endoftext|>")
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": HID,
        "initializer_range": 0.02,
        "intermediate_size": FF,
        "max_position_embeddings": 32768,
        "max_window_layers": L,
        "model_type": "qwen2",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
        "dtype": "float32",
    }
    tok_cfg = {
        "bos_token": None,
        "chat_template": QWEN2_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "Qwen2Tokenizer",
    }
    spec = _decoder_weight_spec(L, H, KV, D, HID, FF, vocab, qk_norm=False, qkv_bias=True, tied=True)
    return {
        "config": config,
        "weights": _weights(spec, seed=7007),
        "tokenizer": tok,
        "tokenizer_config": tok_cfg,
        "generation_config": {"bos_token_id": eos, "eos_token_id": eos, "do_sample": False},
    }


_ENC_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _encoder_tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
    }


def _encoder_layer_spec(p: str, names: dict[str, str], HID: int, FF: int) -> list:
    spec = []
    for key in ("q", "k", "v", "o"):
        spec += [(p + names[key] + ".weight", (HID, HID), "w", 0.2), (p + names[key] + ".bias", (HID,), "w", 0.05)]
    spec += [
        (p + names["ln1"] + ".weight", (HID,), "one", 0.1),
        (p + names["ln1"] + ".bias", (HID,), "w", 0.05),
        (p + names["ff1"] + ".weight", (FF, HID), "w", 0.2),
        (p + names["ff1"] + ".bias", (FF,), "w", 0.05),
        (p + names["ff2"] + ".weight", (HID, FF), "w", 0.15),
        (p + names["ff2"] + ".bias", (HID,), "w", 0.05),
        (p + names["ln2"] + ".weight", (HID,), "one", 0.1),
        (p + names["ln2"] + ".bias", (HID,), "w", 0.05),
    ]
    return spec


def _distilbert_tiny() -> dict:
    tok = build_tokenizer(_ENC_SPECIALS, [], 512, encoder=True)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    L, H, HID, FF, POS = 2, 4, 64, 128, 512
    config = {
        "architectures": ["DistilBertModel"],
        "model_type": "distilbert",
        "vocab_size": vocab,
        "dim": HID,
        "n_layers": L,
        "n_heads": H,
        "hidden_dim": FF,
        "activation": "gelu",
        "max_position_embeddings": POS,
        "sinusoidal_pos_embds": False,
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "initializer_range": 0.02,
        "qa_dropout": 0.1,
        "seq_classif_dropout": 0.2,
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    spec = [
        ("embeddings.word_embeddings.weight", (vocab, HID), "w", 1.0),
        ("embeddings.position_embeddings.weight", (POS, HID), "w", 0.3),
        ("embeddings.LayerNorm.weight", (HID,), "one", 0.1),
        ("embeddings.LayerNorm.bias", (HID,), "w", 0.05),
    ]
    names = {
        "q": "attention.q_lin",
        "k": "attention.k_lin",
        "v": "attention.v_lin",
        "o": "attention.out_lin",
        "ln1": "sa_layer_norm",
        "ff1": "ffn.lin1",
        "ff2": "ffn.lin2",
        "ln2": "output_layer_norm",
    }
    for i in range(L):
        spec += _encoder_layer_spec(f"transformer.layer.{i}.", names, HID, FF)
    return {
        "config": config,
        "weights": _weights(spec, seed=2002),
        "tokenizer": tok,
        "tokenizer_config": _encoder_tokenizer_config(),
    }


def _bert_tiny() -> dict:
    tok = build_tokenizer(_ENC_SPECIALS, [], 512, encoder=True)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    L, H, HID, FF, POS = 2, 4, 64, 128, 512
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": vocab,
        "hidden_size": HID,
        "num_hidden_layers": L,
        "num_attention_heads": H,
        "intermediate_size": FF,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": POS,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "use_cache": True,
        "classifier_dropout": None,
        "dtype": "float32",
    }
    spec = [
        ("embeddings.word_embeddings.weight", (vocab, HID), "w", 1.0),
        ("embeddings.position_embeddings.weight", (POS, HID), "w", 0.3),
        ("embeddings.token_type_embeddings.weight", (2, HID), "w", 0.3),
        ("embeddings.LayerNorm.weight", (HID,), "one", 0.1),
        ("embeddings.LayerNorm.bias", (HID,), "w", 0.05),
        ("pooler.dense.weight", (HID, HID), "w", 0.2),
        ("pooler.dense.bias", (HID,), "w", 0.05),
    ]
    names = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "o": "attention.output.dense",
        "ln1": "attention.output.LayerNorm",
        "ff1": "intermediate.dense",
        "ff2": "output.dense",
        "ln2": "output.LayerNorm",
    }
    for i in range(L):
        spec += _encoder_layer_spec(f"encoder.layer.{i}.", names, HID, FF)
    return {
        "config": config,
        "weights": _weights(spec, seed=3003),
        "tokenizer": tok,
        "tokenizer_config": _encoder_tokenizer_config(),
    }


DEMOS: dict[str, Callable[[], dict]] = {
    "qwen3-tiny": _qwen3_tiny,
    "qwen3-tiny-hd64": _qwen3_tiny_hd64,
    "llama-tiny": _llama_tiny,
    "mistral-tiny": _mistral_tiny,
    "qwen2-tiny": _qwen2_tiny,
    "distilbert-tiny": _distilbert_tiny,
    "bert-tiny": _bert_tiny,
}


# Each demo's family (its config.json model_type), for asking a demo's kind without generating it.
DEMO_FAMILIES: dict[str, str] = {
    "qwen3-tiny": "qwen3",
    "qwen3-tiny-hd64": "qwen3",
    "llama-tiny": "llama",
    "mistral-tiny": "mistral",
    "qwen2-tiny": "qwen2",
    "distilbert-tiny": "distilbert",
    "bert-tiny": "bert",
}


def demo_names() -> list[str]:
    return list(DEMOS)


# ---------------------------------------------------------------------------------------------
# Materialization
# ---------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """$MCORE_CACHE_DIR or ~/.cache/mcore."""
    env = os.environ.get("MCORE_CACHE_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/mcore").expanduser()


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_demo(name: str, folder: str | Path) -> Path:
    """Write demo `name`'s files into the existing empty `folder` (no atomicity; see materialize)."""
    from safetensors.torch import save

    if name not in DEMOS:
        raise UserError(f"unknown demo model {name!r}; available: {', '.join('demo:' + n for n in DEMOS)}")
    folder = Path(folder)
    parts = DEMOS[name]()
    files: dict[str, bytes] = {
        "config.json": _json_bytes(parts["config"]),
        "tokenizer.json": parts["tokenizer"].to_str(pretty=True).encode("utf-8") + b"\n",
        "tokenizer_config.json": _json_bytes(parts["tokenizer_config"]),
        "model.safetensors": save(
            {k: parts["weights"][k].contiguous() for k in sorted(parts["weights"])}, metadata={"format": "pt"}
        ),
    }
    if "generation_config" in parts:
        files["generation_config.json"] = _json_bytes(parts["generation_config"])
    for fname in sorted(files):
        (folder / fname).write_bytes(files[fname])
    marker = {
        "name": name,
        "generator_version": GENERATOR_VERSION,
        "files": {f: hashlib.sha256(b).hexdigest() for f, b in sorted(files.items())},
    }
    (folder / MARKER).write_bytes(_json_bytes(marker))
    return folder


def _valid(folder: Path, name: str) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        if marker.get("name") != name or marker.get("generator_version") != GENERATOR_VERSION:
            return False
        files = marker["files"]
        return bool(files) and all(_sha256(folder / f) == h for f, h in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _install(tmp: Path, final: Path, name: str) -> None:
    """Rename the complete copy `tmp` into place as `final`. Processes materializing the same demo at
    once (a fresh machine's first runs, parallel test workers) race here: a valid copy another one
    put there first is used as it is, and only a stale or damaged one is moved aside and replaced."""
    for _ in range(8):
        if final.is_dir() and _valid(final, name):
            return
        if final.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=final.parent))
            try:
                os.replace(final, trash / name)
            except OSError:
                pass  # another process moved it first
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, final)
            return
        except OSError:
            continue  # another process's copy landed in between: look at it again
    raise OSError(f"it kept changing under {final.parent} while other processes wrote it")


def materialize(name: str, root: str | Path | None = None) -> Path:
    """The folder of demo `name`, generated on first use (or when found stale or damaged)."""
    if name not in DEMOS:
        raise UserError(f"unknown demo model {name!r}; available: {', '.join('demo:' + n for n in DEMOS)}")
    base = (Path(root).expanduser() if root is not None else cache_root()) / "demo"
    final = base / name
    if final.is_dir() and _valid(final, name):
        return final
    try:
        base.parent.mkdir(
            mode=0o700, parents=True, exist_ok=True
        )  # $MCORE_CACHE_DIR owner-only (mcore/common/cache.py)
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=base))
        os.chmod(tmp, 0o755)
    except OSError as e:
        raise UserError(
            f"{base}: cannot create the demo cache folder ({e}); set MCORE_CACHE_DIR to a writable folder"
        ) from None
    try:
        write_demo(name, tmp)
        _install(tmp, final, name)
    except OSError as e:
        raise UserError(
            f"{final}: cannot write the demo model ({e}); set MCORE_CACHE_DIR to a writable folder"
        ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
