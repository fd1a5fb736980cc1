"""The decoder every decoder family shares: rotary attention with GQA over a fixed-capacity KV cache, a
gated MLP, RMSNorms, and the prefill and decode roles. What differs between families lives in
`DecoderDims` (decoder_config.py): q/k norms, biases, RoPE scaling, the activation, a tied head.

Module paths inside a role module (which holds the core as `decoder`):
  decoder.embed_tokens
  decoder.layers.N.input_layernorm
  decoder.layers.N.self_attn.{q_proj,k_proj,v_proj,o_proj}   (+ q_norm, k_norm where the family has them)
  decoder.layers.N.self_attn.decode_attention     (decode role only: mcore::decode_attention)
  decoder.layers.N.post_attention_layernorm
  decoder.layers.N.mlp.{gate_proj,up_proj,down_proj}
  decoder.norm, decoder.lm_head, decoder.logits_zero_bias

The KV caches belong to the caller ([1, KV, C, D] each, model dtype) and are written in place
with index_copy_. Prefill attends over its new tokens through mcore::prefill_attention; decode
attends over the updated caches through mcore::decode_attention (see mcore/ops/attention.py). The numerics
are transformers' (LlamaRMSNorm, apply_rotary_pos_emb, eager attention's fp32 softmax).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..ops import attention as _ops  # noqa: F401  (registers mcore::decode_attention / prefill_attention)
from ..ops.gemv import rms_norm
from ..ops.rope_attention import rotate
from . import weights as W
from .decoder_config import ACTIVATIONS, DecoderDims
from .rope import rope_tables


class RMSNorm(nn.Module):
    """transformers' RMSNorm numerics: normalize in fp32, cast back, then scale."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class DecodeAttention(nn.Module):
    """The decode attention region: one mcore::decode_attention node."""

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor):
        return torch.ops.mcore.decode_attention(q, k_cache, v_cache, kv_lengths)


class LogitsZeroBias(nn.Module):
    """Adds a zero FP32 bias (cast to the model dtype) to the logits: the logits-copy region."""

    def __init__(self, vocab: int, device) -> None:
        super().__init__()
        self.register_buffer("bias", torch.zeros(vocab, dtype=torch.float32, device=device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.ops.aten._to_copy.default(self.bias, dtype=x.dtype)


class Attention(nn.Module):
    def __init__(self, d: DecoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.num_heads, self.num_kv_heads, self.head_dim = d.num_heads, d.num_kv_heads, d.head_dim
        self.q_proj = W.linear(d.hidden_size, d.num_heads * d.head_dim, bias=d.qkv_bias, **kw)
        self.k_proj = W.linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=d.qkv_bias, **kw)
        self.v_proj = W.linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=d.qkv_bias, **kw)
        self.o_proj = W.linear(d.num_heads * d.head_dim, d.hidden_size, bias=d.o_bias, **kw)
        self.q_norm: RMSNorm | None = RMSNorm(d.head_dim, d.rms_norm_eps, dtype, device) if d.qk_norm else None
        self.k_norm: RMSNorm | None = RMSNorm(d.head_dim, d.rms_norm_eps, dtype, device) if d.qk_norm else None
        self.decode_attention = DecodeAttention()
        self.scale = d.head_dim**-0.5

    def _heads(self, proj: nn.Module, norm: nn.Module | None, x: torch.Tensor, b: int, s: int, n: int):
        """[b, s, hidden] -> [b, n, s, D]: the projection split into heads, each normalized first
        where the family has q/k norms."""
        h = proj(x).view(b, s, n, self.head_dim)
        if norm is not None:
            h = norm(h)
        return h.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,  # [1, s, hidden]
        cos: torch.Tensor,  # [s, D] model dtype
        sin: torch.Tensor,
        positions: torch.Tensor,  # int64 [s]
        k_cache: torch.Tensor,  # [1, KV, C, D]
        v_cache: torch.Tensor,
        kv_lengths: torch.Tensor | None,  # INT32 [1] (decode) or None (prefill)
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self._heads(self.q_proj, self.q_norm, x, b, s, self.num_heads)
        k = self._heads(self.k_proj, self.k_norm, x, b, s, self.num_kv_heads)
        v = self._heads(self.v_proj, None, x, b, s, self.num_kv_heads)
        q = rotate(q, cos, sin)
        k = rotate(k, cos, sin)
        # In-place cache update at the new positions; later reads see the updated tensor.
        k_cache = k_cache.index_copy_(2, positions, k)
        v_cache = v_cache.index_copy_(2, positions, v)
        if kv_lengths is None:
            ctx = torch.ops.mcore.prefill_attention(q, k, v, self.scale)  # causal over the new tokens
        else:
            # Scaled, rounded to the model dtype and made linear before the region (the kernel's input).
            q = (q * self.scale).contiguous()
            ctx = self.decode_attention(q, k_cache, v_cache, kv_lengths)
        ctx = ctx.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.o_proj(ctx)


class MLP(nn.Module):
    def __init__(self, d: DecoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(bias=d.mlp_bias, dtype=dtype, device=device)
        self.gate_proj = W.linear(d.hidden_size, d.intermediate_size, **kw)
        self.up_proj = W.linear(d.hidden_size, d.intermediate_size, **kw)
        self.down_proj = W.linear(d.intermediate_size, d.hidden_size, **kw)
        self.act = ACTIVATIONS[d.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d: DecoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps, dtype, device)
        self.self_attn = Attention(d, dtype, device)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps, dtype, device)
        self.mlp = MLP(d, dtype, device)

    def forward(self, h, cos, sin, positions, k_cache, v_cache, kv_lengths):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, positions, k_cache, v_cache, kv_lengths)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderCore(nn.Module):
    """The model. forward(input_ids, cache_length or None, caches) -> FP32 logits [1, vocab]."""

    rope_cos: torch.Tensor  # buffers registered in __init__
    rope_sin: torch.Tensor

    def __init__(self, d: DecoderDims, dtype: torch.dtype, max_cache_length: int, device) -> None:
        super().__init__()
        self.dims = d
        self.dtype = dtype
        self.max_cache_length = max_cache_length
        self.embed_tokens = W.embedding(d.vocab_size, d.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList([DecoderLayer(d, dtype, device) for _ in range(d.num_layers)])
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps, dtype, device)
        self.lm_head = W.linear(d.hidden_size, d.vocab_size, bias=False, dtype=dtype, device=device)
        if d.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(d.rope, d.head_dim, max_cache_length, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.logits_zero_bias = LogitsZeroBias(d.vocab_size, device)

    def forward(
        self, input_ids: torch.Tensor, cache_length: torch.Tensor | None, caches: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        s = input_ids.shape[1]
        steps = torch.arange(s, device=input_ids.device, dtype=torch.int64)
        if cache_length is None:  # prefill: the cache starts empty
            positions = steps
            kv_lengths = None
        else:
            positions = cache_length.to(torch.int64) + steps
            kv_lengths = (cache_length + s).to(torch.int32)
        cos = self.rope_cos.index_select(0, positions).to(self.dtype)
        sin = self.rope_sin.index_select(0, positions).to(self.dtype)
        h = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, positions, caches[2 * i], caches[2 * i + 1], kv_lengths)
        # The final norm is per position: normalizing only the last one matches transformers.
        last = self.norm(h[:, -1, :])
        logits = self.logits_zero_bias(self.lm_head(last))
        return torch.ops.aten._to_copy.default(logits, dtype=torch.float32)


def _make_role_class(family: str, role: str, num_layers: int) -> type:
    """A role module class with an explicit positional signature (stable graph input names)."""
    cache_args = []
    for i in range(num_layers):
        cache_args += [f"key_cache_{i}", f"value_cache_{i}"]
    head = ["input_ids"] + (["cache_length"] if role == "decode" else [])
    params = ", ".join(["self"] + head + cache_args)
    cl = "cache_length" if role == "decode" else "None"
    caches = "(" + "".join(f"{a}, " for a in cache_args) + ")"
    src = f"def forward({params}):\n    return self.decoder(input_ids, {cl}, {caches})\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<mcore {family} {role} role>", "exec"), ns)  # generated from integers only
    title = family[:1].upper() + family[1:]
    return type(
        f"{title}{role.capitalize()}Role",
        (nn.Module,),
        {"forward": ns["forward"], "__doc__": f"{family} {role} role: forward{tuple(head + cache_args)} -> logits"},
    )


_ROLE_CLASSES: dict[tuple[str, str, int], type] = {}


def role_class(family: str, role: str, num_layers: int) -> type:
    key = (family, role, num_layers)
    if key not in _ROLE_CLASSES:
        _ROLE_CLASSES[key] = _make_role_class(family, role, num_layers)
    return _ROLE_CLASSES[key]
