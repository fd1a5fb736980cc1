"""A Qwen3-8B-sized config (no weights): 36 layers, hidden 4096, 32/8 heads, head_dim 128."""

import json
from pathlib import Path

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


def write_config_folder(folder: Path, config: dict = QWEN3_8B) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
