"""The decode step from the q/k/v product to the attention's context as one op (issue 32's launch cuts).

`mcore::rope_decode_attention(qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache,
v_cache, cache_length, scale) -> context` computes what the decoder's attention does between its fused
q/k/v product and its output projection in the decode step:

- qkv [1, s, (H + 2 KV) D]: the q, k and v rows of the s new tokens, side by side, which sit at
  positions cache_length .. cache_length + s - 1 (cache_length: the INT32 [1] count already cached);
- each q and k head RMS-normalised over its D values (`rms_norm`, where the family has q/k norms:
  the weights are not None), then rotated (`rotate`) by the rows of the FP32 tables [C, D] at those
  positions, rounded to the model dtype (the decoder's rope_cos and rope_sin buffers, as it reads them);
- the new keys and values written into the caches [1, KV, C, D] at those positions (k_cache and
  v_cache are written in place, as the decoder's index_copy_ writes them);
- q scaled and rounded to the model dtype, then mcore::decode_attention over the updated caches.

Everything it reads is the product's row, weights and the step's inputs: no small kernel of the step
has to run for it first (one that computed the length or the cos rows would be a launch a layer).

The compiled engine puts it in place of those nodes in a fixed-shape decode step (mcore/engines/
rope_pass.py; on by default, MCORE_ATTN_ROPE=0 turns it off). On CUDA the split kernel of mcore/ops/flash_decode.py does the
norms and the rotation in its prologue, and the split whose share of the cache holds a new position
writes that key and value before it reads its share: the 1-2 kernels a layer between the product and
the attention are gone. The numerics are those of the compiled step (fp32 between the explicit
roundings: the norm's result, the stored key, the scaled query), not bit for bit its kernels'.
Elsewhere the op runs the decoder's own modules' computation (the functions below).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .attention import decode_attention
from .gemv import rms_norm

__all__ = ["rotate", "enabled", "rope_decode_attention", "rope_decode_inputs", "split_heads"]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding as the decoders compute it (transformers' rotate_half convention): pairs
    (i, i + D/2) rotated by the angle whose cos and sin are given, broadcast over x's leading dims."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rot * sin)


def enabled() -> bool:
    """The compiled decode step computes its q/k norms, rotary embedding and cache writes inside the
    attention's kernel (on any device where mcore::gemv rewrites the step; on CPU the op runs the
    unfused computation, so tests can check the rewrite). On by default: on the H200 the 8B-sized
    step takes 4.30 / 5.41 ms at 1k / 32k against 4.35 / 5.43 without it, 255 kernels instead of 332
    (twenty-seventh session, docs/gpu-results.md). MCORE_ATTN_ROPE=0 keeps them kernels of their own."""
    return os.environ.get("MCORE_ATTN_ROPE", "1") != "0"


def split_heads(qkv: torch.Tensor, kv_heads: int, head_dim: int) -> tuple[int, int]:
    """(query heads H, new tokens s) of a [1, s, (H + 2 KV) D] q/k/v row; ValueError if it is not one."""
    if qkv.dim() != 3 or qkv.shape[0] != 1:
        raise ValueError(f"rope_decode_attention: qkv {tuple(qkv.shape)} is not [1, tokens, (H + 2 KV) * D]")
    width = qkv.shape[2]
    if width % head_dim or width // head_dim <= 2 * kv_heads or (width // head_dim - 2 * kv_heads) % kv_heads:
        raise ValueError(
            f"rope_decode_attention: qkv width {width} is not (H + 2 * {kv_heads}) * {head_dim} with H a multiple of "
            f"{kv_heads}"
        )
    return width // head_dim - 2 * kv_heads, qkv.shape[1]


def _unfused(qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale):
    """The decoder's computation, op by op (CPU, or where the kernel does not apply)."""
    q, kv_lengths = _unfused_inputs(
        qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale
    )
    return decode_attention(q, k_cache, v_cache, kv_lengths)


def _unfused_inputs(
    qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale
):
    """The decoder's computation up to the attention, op by op: the caches written; (the scaled query,
    the INT32 [1] length the attention reads)."""
    kvh, d = k_cache.shape[1], k_cache.shape[3]
    h, s = split_heads(qkv, kvh, d)
    q, k, v = qkv.split([h * d, kvh * d, kvh * d], -1)
    q, k, v = q.reshape(1, s, h, d), k.reshape(1, s, kvh, d), v.reshape(1, s, kvh, d)
    if q_norm_weight is not None and k_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    positions = cache_length.reshape(1).to(torch.int64) + torch.arange(s, device=qkv.device)
    cos, sin = cos_table.index_select(0, positions).to(qkv.dtype), sin_table.index_select(0, positions).to(qkv.dtype)
    q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
    k_cache.index_copy_(2, positions, k)
    v_cache.index_copy_(2, positions, v.transpose(1, 2))
    return (q * scale).contiguous(), (cache_length.reshape(1) + s).to(torch.int32)


def _kernels(qkv: torch.Tensor, k_cache: torch.Tensor) -> Any:
    """mcore/ops/flash_decode.py where its Triton kernels take these tensors (16-bit, CUDA), else None."""
    if qkv.is_cuda and qkv.dtype in (torch.bfloat16, torch.float16):
        from . import flash_decode

        if flash_decode.supported(qkv, k_cache):
            return flash_decode
    return None


@torch.library.custom_op("mcore::rope_decode_attention", mutates_args=("k_cache", "v_cache"))
def rope_decode_attention(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_length: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """See the module's docstring: the q/k norms, rotary embedding, cache writes and decode attention
    of one decode step, from the fused q/k/v product's row."""
    args = (qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale)
    kernels = _kernels(qkv, k_cache)
    if kernels is not None:
        return kernels.decode_attention_from_qkv(*args)
    return _unfused(*args)


@rope_decode_attention.register_fake
def _rope_decode_attention_fake(
    qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale
):
    return _query_like(qkv, k_cache)


@torch.library.custom_op("mcore::rope_decode_inputs", mutates_args=("k_cache", "v_cache"))
def rope_decode_inputs(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_length: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same steps up to the attention, for an attention this engine does not run (a bound slot):
    the caches written; returns the scaled query [1, H, s, D] and the INT32 [1] length the attention
    reads (cache_length + s). On CUDA one kernel (the split kernel's prologue alone), where the
    compiled step otherwise runs two or three small ones and another for the length."""
    args = (qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale)
    kernels = _kernels(qkv, k_cache)
    if kernels is not None:
        return kernels.decode_inputs_from_qkv(*args)
    return _unfused_inputs(*args)


@rope_decode_inputs.register_fake
def _rope_decode_inputs_fake(
    qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, cache_length, scale
):
    return _query_like(qkv, k_cache), cache_length.new_empty((1,), dtype=torch.int32)


def _query_like(qkv: torch.Tensor, k_cache: torch.Tensor) -> torch.Tensor:
    """An empty [1, H, s, D] query (or context) for a q/k/v row and its cache: the ops' fake result."""
    kvh, d = k_cache.shape[1], k_cache.shape[3]
    h, s = split_heads(qkv, kvh, d)
    return qkv.new_empty((1, h, s, d))
