"""Qwen2 (decoder): Qwen2 and Qwen2.5 (Qwen2ForCausalLM) on the shared decoder (decoder.py): a bias on the
q, k and v projections (none on o or the MLP), no q/k norms, default RoPE, tied embeddings on the small
sizes (0.5B-3B), and full attention in every layer (`use_sliding_window` layers are refused, as for
Qwen3)."""

from __future__ import annotations

from .decoder_config import DecoderDims, check_full_attention, decoder_dims, head_dim
from .decoder_family import DecoderFamily


class Qwen2Family(DecoderFamily):
    name = "qwen2"
    recipe_prefix = "qwen2"

    def parse(self, config: dict) -> DecoderDims:
        check_full_attention(config, self.name)
        return decoder_dims(
            config,
            self.name,
            head_dim=head_dim(config),  # Qwen2Config has none: hidden_size / num_attention_heads
            qk_norm=False,
            qkv_bias=True,
            o_bias=False,
        )
