"""What a decoder family reads from config.json: the shared fields, type- and range-checked once, and the
few rules where families differ (head_dim's default, biases, q/k norms, sliding windows).

Every decoder family (qwen3, llama, mistral, qwen2) builds one `DecoderDims` through `decoder_dims`;
the graph (decoder.py) is a function of it alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F

from ..common.errors import UserError
from .config import cfg_bool, cfg_choice, cfg_float, cfg_int
from .rope import Rope, parse_rope

# hidden_act -> the function transformers' ACT2FN gives for it (the gated MLP applies it to gate_proj)
ACTIVATIONS: dict[str, Callable[..., Any]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True)
class DecoderDims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: Rope
    hidden_act: str
    qkv_bias: bool  # q/k/v projections have a bias
    o_bias: bool  # the output projection has one
    mlp_bias: bool  # gate/up/down have one
    qk_norm: bool  # RMSNorm over each head of q and k before RoPE (Qwen3)
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None = None  # every layer sees this many keys at most; None: all of them


_DIMS: dict[tuple[str, str], DecoderDims] = {}  # (family, config JSON) -> its parsed dims


def cached_dims(family: str, config: dict, parse: Callable[[dict], DecoderDims]) -> DecoderDims:
    """`parse(config)`, once per family and config content (a build asks from several places)."""
    key = (family, json.dumps(config, sort_keys=True, default=str))
    dims = _DIMS.get(key)
    if dims is None:
        dims = _DIMS[key] = parse(config)
    return dims


def heads(config: dict) -> tuple[int, int, int]:
    """(hidden_size, num_attention_heads, num_key_value_heads), KV heads dividing the query heads."""
    hidden = cfg_int(config, "hidden_size")
    n = cfg_int(config, "num_attention_heads")
    kv = cfg_int(config, "num_key_value_heads", n) if config.get("num_key_value_heads") is not None else n
    if n % kv != 0:
        raise UserError(f"config.json: num_attention_heads {n} is not a multiple of num_key_value_heads {kv}")
    return hidden, n, kv


def head_dim(config: dict, absent: int | None = None) -> int:
    """config.json's head_dim; when absent `absent` (Qwen3: 128), when null or absent with no default
    hidden_size / num_attention_heads (as transformers derives it)."""
    hidden, n, _ = heads(config)
    v = config.get("head_dim", absent)
    if v is None:
        return hidden // n
    return cfg_int({"head_dim": v}, "head_dim")


def decoder_dims(
    config: dict,
    family: str,
    *,
    head_dim: int,
    qk_norm: bool,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool = False,
    rope_types: tuple[str, ...] = ("default",),
    max_position_default: int = 32768,
    sliding_window: int | None = None,
    activations: tuple[str, ...] = ("silu",),
) -> DecoderDims:
    """The shared fields of a decoder config; the family passes what it decides itself."""
    what = f"the {family} family"
    hidden, n, kv = heads(config)
    if head_dim % 2:
        raise UserError(f"config.json: field 'head_dim' must be even for RoPE (got {head_dim})")
    return DecoderDims(
        vocab_size=cfg_int(config, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=cfg_int(config, "intermediate_size"),
        num_layers=cfg_int(config, "num_hidden_layers"),
        num_heads=n,
        num_kv_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=cfg_float(config, "rms_norm_eps", 1e-6),
        rope=parse_rope(config, family, rope_types),
        hidden_act=cfg_choice(config, "hidden_act", "silu", activations, what),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=qk_norm,
        tie_word_embeddings=cfg_bool(config, "tie_word_embeddings", False),
        max_position_embeddings=cfg_int(config, "max_position_embeddings", max_position_default),
        sliding_window=sliding_window,
    )


def check_full_attention(config: dict, family: str) -> None:
    """Qwen2 and Qwen3: every layer must use full causal attention (sliding-window layers are not
    implemented). The layer types are derived as transformers' Qwen2Config/Qwen3Config derive them."""
    num_layers = cfg_int(config, "num_hidden_layers")
    use_sw = cfg_bool(config, "use_sliding_window", False)
    layer_types = config.get("layer_types")
    if layer_types is None:
        window = config.get("sliding_window", 4096) if use_sw else None
        first = cfg_int(config, "max_window_layers", 28, lo=0) if window is not None else num_layers
        layer_types = [
            "sliding_attention" if window is not None and i >= first else "full_attention" for i in range(num_layers)
        ]
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise UserError(
            f"config.json: field 'layer_types' must list one type per layer ({num_layers}); fix config.json"
        )
    for i, t in enumerate(layer_types):
        if t != "full_attention":
            field = "layer_types" if config.get("layer_types") is not None else "use_sliding_window"
            raise UserError(
                f"config.json: {field} makes layer {i} {t!r}; sliding-window attention is not "
                f"supported by the {family} family (only full attention)"
            )
