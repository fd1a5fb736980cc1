"""DistilBERT (encoder): the shared encoder core (see bert.py) without token type embeddings."""

from __future__ import annotations

import re

from .bert import EncoderDims, EncoderFamily, _check_activation, _check_heads, _pos_int


def distilbert_dims(config: dict) -> EncoderDims:
    d = EncoderDims(
        vocab_size=_pos_int(config, "vocab_size"),
        hidden_size=_pos_int(config, "dim"),
        num_layers=_pos_int(config, "n_layers"),
        num_heads=_pos_int(config, "n_heads"),
        intermediate_size=_pos_int(config, "hidden_dim"),
        max_position_embeddings=_pos_int(config, "max_position_embeddings", 512),
        layer_norm_eps=1e-12,  # fixed in DistilBERT
        activation=_check_activation(config.get("activation", "gelu"), "activation"),
        type_vocab_size=0,
    )
    _check_heads(d)
    return d


class DistilBertFamily(EncoderFamily):
    name = "distilbert"
    prefix = "distilbert."
    ignored = (
        r"^vocab_transform\.",
        r"^vocab_layer_norm\.",
        r"^vocab_projector\.",
        r"^pre_classifier\.",
        r"^classifier\.",
        r"^qa_outputs\.",
        r"^embeddings\.position_ids$",
    )
    layer_re = re.compile(r"^transformer\.layer\.(\d+)\.(.+)$")
    layer_map = {
        "attention.q_lin": "attention.q_lin",
        "attention.k_lin": "attention.k_lin",
        "attention.v_lin": "attention.v_lin",
        "attention.out_lin": "attention.out_lin",
        "sa_layer_norm": "sa_layer_norm",
        "ffn.lin1": "ffn.lin1",
        "ffn.lin2": "ffn.lin2",
        "output_layer_norm": "output_layer_norm",
    }

    def dims(self, config: dict) -> EncoderDims:
        return distilbert_dims(config)


__all__ = ["DistilBertFamily", "distilbert_dims"]
