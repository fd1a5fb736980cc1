"""Custom ops that appear as single nodes in captured graphs.

`mcore::decode_attention(q, k_cache, v_cache, kv_lengths) -> context`

- q: the already scaled query [1, H, s, D] (model dtype; the builder applied head_dim**-0.5
  and rounded to the model dtype), so the softmax scale here is 1.0.
- k_cache, v_cache: the fixed-capacity caches [1, KV, C, D] after this step's update
  (H is a multiple of KV: grouped-query attention).
- kv_lengths: INT32 [1], the number of valid cache positions including the s new tokens.

Query i (0..s-1) sits at absolute position kv_len - s + i and attends the keys at positions
0..kv_len - s + i (causal). The softmax is computed in fp32; the context [1, H, s, D] has q's dtype.

`mcore::prefill_attention(q, k, v, scale) -> context`

Causal self-attention over the s new tokens only (the prefill role): q [1, H, s, D], k and v
[1, KV, s, D], GQA, the given softmax scale. It is an op (not inline SDPA) so that torch.export
treats it as one opaque node: exporting inline GQA attention with a dynamic token count adds
stride guards on torch 2.11 that fail for short sequences.

`mcore::prefill_attention_rows(q, k, v, scale) -> [1, s, H*D]`: the same attention with its context
already as the output projection reads it. Captured graphs never hold it; the compiled engine puts
it in place of prefill_attention -> transpose -> reshape (mcore/engines/prefill_pass.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["decode_attention", "prefill_attention", "prefill_attention_rows", "decode_attention_reference"]


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor) -> None:
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("decode_attention: q, k_cache and v_cache must be rank 4 [B, heads, tokens, head_dim]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"decode_attention: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    if q.shape[0] != k_cache.shape[0] or q.shape[3] != k_cache.shape[3]:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} does not fit the cache {tuple(k_cache.shape)}")
    if q.shape[1] % k_cache.shape[1] != 0:
        raise ValueError(
            f"decode_attention: {q.shape[1]} query heads are not a multiple of {k_cache.shape[1]} KV heads"
        )
    if kv_lengths.dtype != torch.int32 or kv_lengths.numel() != 1:
        raise ValueError("decode_attention: kv_lengths must be an INT32 tensor with one element")


def _cpu_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor) -> torch.Tensor:
    # The CPU path may sync: read the active length and touch only that part of the cache.
    b, h, s, d = q.shape
    kvh, cap = k_cache.shape[1], k_cache.shape[2]
    kv_len = int(kv_lengths.reshape(-1)[0].item())
    if not (s <= kv_len <= cap):
        raise ValueError(f"decode_attention: kv_lengths {kv_len} must lie in [{s}, {cap}] for {s} new tokens")
    g = h // kvh
    qf = q.float().reshape(b, kvh, g * s, d)  # heads h = kvh * g; rows (g, s)
    k = k_cache[:, :, :kv_len].float()
    v = v_cache[:, :, :kv_len].float()
    scores = torch.matmul(qf, k.transpose(-1, -2)).reshape(b, kvh, g, s, kv_len)
    qpos = torch.arange(s, device=q.device) + (kv_len - s)
    kpos = torch.arange(kv_len, device=q.device)
    allowed = kpos[None, :] <= qpos[:, None]  # [s, kv_len]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).reshape(b, kvh, g * s, kv_len)
    out = torch.matmul(probs, v).reshape(b, h, s, d)
    return out.to(q.dtype)


def _flash_decode():
    try:
        from . import flash_decode
    except ImportError:  # no Triton: the masked SDPA fallback below
        return None
    return flash_decode


def _device_impl(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor
) -> torch.Tensor:
    fd = _flash_decode()
    if fd is not None and fd.supported(q, k_cache):
        return fd.decode_attention(q, k_cache, v_cache, kv_lengths)  # cost follows the active length
    return _masked_sdpa(q, k_cache, v_cache, kv_lengths)


def _masked_sdpa(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor
) -> torch.Tensor:
    # No host sync: attend over the full capacity with a mask built on the device from kv_lengths.
    # Cost follows the capacity, not the active length. Masked cache entries get zero weight, so
    # they must hold finite values (caches are allocated zeroed and only ever hold written keys).
    s = q.shape[2]
    cap = k_cache.shape[2]
    kv_len = kv_lengths.reshape(1).to(torch.int64)
    qpos = torch.arange(s, device=q.device, dtype=torch.int64) + (kv_len - s)  # [s]
    kpos = torch.arange(cap, device=q.device, dtype=torch.int64)  # [C]
    allowed = (kpos[None, :] <= qpos[:, None]).reshape(1, 1, s, cap)
    # SDPA's fused kernels accumulate the softmax in fp32 for half types; fp32 stays fp32.
    out = F.scaled_dot_product_attention(
        q, k_cache, v_cache, attn_mask=allowed, scale=1.0, enable_gqa=q.shape[1] != k_cache.shape[1]
    )
    return out.to(q.dtype)


@torch.library.custom_op("mcore::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor
) -> torch.Tensor:
    _check(q, k_cache, v_cache, kv_lengths)
    if q.device.type == "cpu":
        return _cpu_impl(q, k_cache, v_cache, kv_lengths)
    return _device_impl(q, k_cache, v_cache, kv_lengths)


@decode_attention.register_fake
def _decode_attention_fake(q, k_cache, v_cache, kv_lengths):
    return torch.empty_like(q)


@torch.library.custom_op("mcore::prefill_attention", mutates_args=())
def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # a fresh tensor (never an alias of an input), laid out as the fake says
    return _causal_sdpa("prefill_attention", q, k, v, scale).contiguous()


def _causal_sdpa(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit [1,H,s,D]/[1,KV,s,D]"
        )
    # PyTorch picks the kernel: with torch 2.11 on the H100, cuDNN's (the same bits as cuDNN asked for
    # alone); no other SDPA backend was faster at 8k or 32k, KV heads shared or repeated
    # (bench/prefill_attention_gpu.py, docs/gpu-results.md)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


@prefill_attention.register_fake
def _prefill_attention_fake(q, k, v, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("mcore::prefill_attention_rows", mutates_args=())
def prefill_attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """prefill_attention's context as the output projection reads it, [1, s, H*D]: what the compiled
    engine runs in place of prefill_attention -> transpose(1, 2) -> reshape (mcore/engines/prefill_pass.py).
    cuDNN and flash write the context tokens-major for a q laid out so, which makes this a view of
    their output; the contiguous [1, H, s, D] of prefill_attention cost two copies of the context a
    layer (its own and the one Inductor makes to transpose it back)."""
    out = _causal_sdpa("prefill_attention_rows", q, k, v, scale)
    b, h, s, d = q.shape
    return out.transpose(1, 2).reshape(b, s, h * d)  # a view where the kernel wrote tokens-major


@prefill_attention_rows.register_fake
def _prefill_attention_rows_fake(q, k, v, scale):
    b, h, s, d = q.shape
    return q.new_empty(b, s, h * d)


def decode_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor
) -> torch.Tensor:
    """A float64 brute-force reference (loops over heads and queries); for tests."""
    b, h, s, d = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    kv_len = int(kv_lengths.reshape(-1)[0].item())
    out = torch.zeros(b, h, s, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // g
            for i in range(s):
                p = kv_len - s + i
                k = k_cache[bi, kh, : p + 1].double()
                v = v_cache[bi, kh, : p + 1].double()
                w = torch.softmax(k @ q[bi, hi, i].double(), dim=0)
                out[bi, hi, i] = w @ v
    return out
