"""Qwen3 (decoder): the shared decoder (decoder.py) with RMSNorm over each query and key head, no
projection biases unless `attention_bias` (then on q/k/v and o), head_dim 128 when config.json omits it,
and full attention in every layer. Its recipes keep the ids they were published with: the `qwen.`
prefix and version 2 of the attention region."""

from __future__ import annotations

from .config import cfg_bool
from .decoder_config import DecoderDims, check_full_attention, decoder_dims, head_dim
from .decoder_family import DecoderFamily


class Qwen3Family(DecoderFamily):
    name = "qwen3"
    recipe_prefix = "qwen"
    attention_recipe_version = 2  # the tutorial's id, qwen.decode_attention_region@2

    def parse(self, config: dict) -> DecoderDims:
        check_full_attention(config, self.name)
        bias = cfg_bool(config, "attention_bias", False)
        # transformers' Qwen3Config defaults head_dim to 128 when absent; null means hidden/heads.
        return decoder_dims(
            config,
            self.name,
            head_dim=head_dim(config, absent=128),
            qk_norm=True,
            qkv_bias=bias,
            o_bias=bias,
        )
