"""The 8B-sized configs the GPU benchmarks build with random weights (no checkpoint), by name.

    qwen3-8b      Qwen3-8B: 36 layers, hidden 4096, 32/8 heads, head_dim 128, q/k norms (qwen3_8b_config.py)
    llama3.1-8b   Llama-3.1-8B: 32 layers, hidden 4096, 32/8 heads, head_dim 128, llama3 RoPE, untied
    qwen3-tiny-hd64   the demo the shipped qwen-attention session binds (2 layers, 8/2 heads, head_dim 64;
                      its config.json as the demo writes it): what that session's schedule is chosen on

Both read about 15 GB of bf16 weights a token (Llama's MLP is wider, Qwen3 has four more layers and a
larger vocabulary); Llama's KV cache is 8/9 of Qwen3's a position.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qwen3_8b_config import QWEN3_8B

LLAMA31_8B = {  # config.json of meta-llama/Llama-3.1-8B, as published
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

# name -> (config, the demo whose tokenizer files the bundle carries: any tokenizer whose IDs fit the
# vocabulary); a config of None is that demo's own (config_of reads it)
MODELS = {
    "qwen3-8b": (QWEN3_8B, "qwen3-tiny"),
    "llama3.1-8b": (LLAMA31_8B, "llama-tiny"),
    "qwen3-tiny-hd64": (None, "qwen3-tiny-hd64"),
}


def config_of(name: str) -> dict:
    """The config.json of model `name` (a demo's as the demo writes it)."""
    config, demo = MODELS[name]
    if config is not None:
        return config
    from mcore.families.demo import materialize

    return json.loads((materialize(demo) / "config.json").read_text())


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def attention_recipe(config: dict) -> str:
    """The family's decode-attention recipe id (mcore/families/decoder_family.py)."""
    from mcore.families import family_for_config

    return family_for_config(config).attention_recipe


def write_model_folder(folder: Path, name: str) -> Path:
    """config.json of model `name` plus its demo's tokenizer files: what `mcore build --weights random` needs."""
    from mcore.families.demo import materialize

    demo = MODELS[name][1]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_of(name), indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(materialize(demo) / f, folder)
    return folder
