"""Llama (decoder): Llama 2, 3, 3.1, 3.2 and 3.3 checkpoints (LlamaForCausalLM) on the shared decoder
(decoder.py): grouped-query attention without q/k norms, RoPE of the default, `linear` (Llama 2 long
context) or `llama3` (3.1 and later) type, `attention_bias` on q/k/v and o, `mlp_bias` on the MLP,
and tied or untied embeddings (Llama 3.2 1B and 3B tie them)."""

from __future__ import annotations

from .config import cfg_bool
from .decoder_config import DecoderDims, decoder_dims, head_dim
from .decoder_family import DecoderFamily


class LlamaFamily(DecoderFamily):
    name = "llama"
    recipe_prefix = "llama"

    def parse(self, config: dict) -> DecoderDims:
        bias = cfg_bool(config, "attention_bias", False)
        return decoder_dims(
            config,
            self.name,
            head_dim=head_dim(config),  # absent or null: hidden_size / num_attention_heads
            qk_norm=False,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=cfg_bool(config, "mlp_bias", False),
            rope_types=("default", "linear", "llama3"),
            max_position_default=2048,
            activations=("silu", "gelu", "gelu_pytorch_tanh"),
        )
