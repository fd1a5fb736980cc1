"""Mistral (decoder): Mistral 7B v0.1-v0.3 and its fine-tunes (MistralForCausalLM) on the shared decoder
(decoder.py): Llama's layers without biases, default RoPE, and a `sliding_window` that transformers
applies to every layer (4096 when config.json omits it). A window no smaller than the KV cache is full
attention, so that is what runs; a build whose cache outgrows the window is refused, naming the field
(sliding-window attention is not implemented)."""

from __future__ import annotations

from .config import cfg_int
from .decoder_config import DecoderDims, decoder_dims, head_dim
from .decoder_family import DecoderFamily


class MistralFamily(DecoderFamily):
    name = "mistral"
    recipe_prefix = "mistral"

    def parse(self, config: dict) -> DecoderDims:
        window: int | None = None
        if config.get("sliding_window", 4096) is not None:
            window = cfg_int(config, "sliding_window", 4096)
        return decoder_dims(
            config,
            self.name,
            head_dim=head_dim(config),  # absent or null: hidden_size / num_attention_heads
            qk_norm=False,
            qkv_bias=False,
            o_bias=False,
            max_position_default=4096 * 32,
            sliding_window=window,
        )
