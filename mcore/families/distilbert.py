"""DistilBERT (encoder): the shared encoder core (see bert.py) without token type embeddings."""

from __future__ import annotations

import re

from .bert import EncoderDims, EncoderFamily, _check_activation, _check_heads
from .config import cfg_bool, cfg_int


def distilbert_dims(config: dict) -> EncoderDims:
    what = "the distilbert family"
    # Sinusoidal position embeddings are stored in the checkpoint like learned ones: same graph.
    cfg_bool(config, "sinusoidal_pos_embds", False)
    d = EncoderDims(
        vocab_size=cfg_int(config, "vocab_size"),
        hidden_size=cfg_int(config, "dim"),
        num_layers=cfg_int(config, "n_layers"),
        num_heads=cfg_int(config, "n_heads"),
        intermediate_size=cfg_int(config, "hidden_dim"),
        max_position_embeddings=cfg_int(config, "max_position_embeddings", 512),
        layer_norm_eps=1e-12,  # fixed in DistilBERT
        activation=_check_activation(config, "activation", what),
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
