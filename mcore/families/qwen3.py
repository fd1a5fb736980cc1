"""Qwen3 (decoder): our own torch implementation, split layout (prefill + decode roles).

Module paths inside a role module (which holds the core as `decoder`):
  decoder.embed_tokens
  decoder.layers.N.input_layernorm
  decoder.layers.N.self_attn.{q_proj,k_proj,v_proj,o_proj,q_norm,k_norm}
  decoder.layers.N.self_attn.decode_attention     (decode role only: mcore::decode_attention)
  decoder.layers.N.post_attention_layernorm
  decoder.layers.N.mlp.{gate_proj,up_proj,down_proj}
  decoder.norm, decoder.lm_head, decoder.logits_zero_bias

The KV caches belong to the caller ([1, KV, C, D] each, model dtype) and are written in place
with index_copy_. Prefill attends over its new tokens through mcore::prefill_attention; decode
attends over the updated caches through mcore::decode_attention (see mcore/ops.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops as _ops  # noqa: F401  (registers mcore::decode_attention / prefill_attention)
from ..buildargs import BuildArgs
from ..errors import UserError
from . import weights as W
from .base import DTYPES, Family, ModelSource, RecipeSpec, RoleIO
from .config import cfg_bool, cfg_choice, cfg_float, cfg_int

DEFAULT_MAX_CACHE_LENGTH = 4096


_DIMS: dict[str, "Qwen3Dims"] = {}  # config JSON -> its parsed dims


@dataclass(frozen=True)
class Qwen3Dims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_config(cls, config: dict) -> "Qwen3Dims":
        """Every field the qwen3 graph uses, type- and range-checked; fields that would change the
        numerics in a way this family does not implement are errors naming the field. Parsed once
        per config content (a build asks for them from several places)."""
        key = json.dumps(config, sort_keys=True, default=str)
        dims = _DIMS.get(key)
        if dims is None:
            dims = _DIMS[key] = cls._parse(config)
        return dims

    @classmethod
    def _parse(cls, config: dict) -> "Qwen3Dims":
        what = "the qwen3 family"
        hidden = cfg_int(config, "hidden_size")
        heads = cfg_int(config, "num_attention_heads")
        kv = cfg_int(config, "num_key_value_heads", heads)
        if heads % kv != 0:
            raise UserError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        # transformers' Qwen3Config defaults head_dim to 128 when absent; null means hidden/heads.
        head_dim = cfg_int(config, "head_dim", 128) if config.get("head_dim", 0) is not None else hidden // heads
        if head_dim % 2:
            raise UserError(f"config.json: field 'head_dim' must be even for RoPE (got {head_dim})")
        cfg_choice(config, "hidden_act", "silu", ("silu",), what)
        num_layers = cfg_int(config, "num_hidden_layers")
        _check_full_attention(config, num_layers)
        return cls(
            vocab_size=cfg_int(config, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=cfg_int(config, "intermediate_size"),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            rms_norm_eps=cfg_float(config, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta(config),
            attention_bias=cfg_bool(config, "attention_bias", False),
            tie_word_embeddings=cfg_bool(config, "tie_word_embeddings", False),
            max_position_embeddings=cfg_int(config, "max_position_embeddings", 32768),
        )


def _check_full_attention(config: dict, num_layers: int) -> None:
    """Every layer must use full causal attention: sliding-window layers are not implemented.
    The layer types are derived as transformers' Qwen3Config derives them."""
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
                "supported by the qwen3 family (only full attention)"
            )


def rope_theta(config: dict) -> float:
    """rope_theta of a default-type RoPE; UserError naming the field for any other RoPE.

    Accepts the transformers v5 form (`rope_parameters: {rope_type, rope_theta}`) and the
    older form (`rope_theta` plus `rope_scaling`, null for the default type).
    """
    theta_src: dict = config
    for key in ("rope_parameters", "rope_scaling"):
        d = config.get(key)
        if d is None:
            continue
        if not isinstance(d, dict):
            raise UserError(f"config.json: field {key!r} must be an object (got {d!r}); fix config.json")
        kind = d.get("rope_type", d.get("type", "default"))
        if kind != "default":
            raise UserError(
                f"config.json: {key} type {kind!r} is not supported by the qwen3 family; "
                "only the default RoPE is implemented"
            )
        if d.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(
                f"config.json: {key} partial_rotary_factor {d['partial_rotary_factor']!r} is not "
                "supported by the qwen3 family; only full rotary embeddings are implemented"
            )
        if d.get("rope_theta") is not None:
            theta_src = d
    return cfg_float(theta_src, "rope_theta", 10000.0)


class RMSNorm(nn.Module):
    """transformers' Qwen3RMSNorm numerics: normalize in fp32, cast back, then scale."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


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
    def __init__(self, d: Qwen3Dims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.num_heads, self.num_kv_heads, self.head_dim = d.num_heads, d.num_kv_heads, d.head_dim
        self.q_proj = W.linear(d.hidden_size, d.num_heads * d.head_dim, bias=d.attention_bias, **kw)
        self.k_proj = W.linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=d.attention_bias, **kw)
        self.v_proj = W.linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=d.attention_bias, **kw)
        self.o_proj = W.linear(d.num_heads * d.head_dim, d.hidden_size, bias=d.attention_bias, **kw)
        self.q_norm = RMSNorm(d.head_dim, d.rms_norm_eps, dtype, device)
        self.k_norm = RMSNorm(d.head_dim, d.rms_norm_eps, dtype, device)
        self.decode_attention = DecodeAttention()
        self.scale = d.head_dim**-0.5

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * cos) + (rot * sin)

    def forward(
        self,
        x: torch.Tensor,  # [1, s, hidden]
        cos: torch.Tensor,  # [s, D] model dtype
        sin: torch.Tensor,
        positions: torch.Tensor,  # int64 [s]
        k_cache: torch.Tensor,  # [1, KV, C, D]
        v_cache: torch.Tensor,
        kv_lengths: Optional[torch.Tensor],  # INT32 [1] (decode) or None (prefill)
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = self._rope(q, cos, sin)
        k = self._rope(k, cos, sin)
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
    def __init__(self, d: Qwen3Dims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.gate_proj = W.linear(d.hidden_size, d.intermediate_size, **kw)
        self.up_proj = W.linear(d.hidden_size, d.intermediate_size, **kw)
        self.down_proj = W.linear(d.intermediate_size, d.hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d: Qwen3Dims, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps, dtype, device)
        self.self_attn = Attention(d, dtype, device)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps, dtype, device)
        self.mlp = MLP(d, dtype, device)

    def forward(self, h, cos, sin, positions, k_cache, v_cache, kv_lengths):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, positions, k_cache, v_cache, kv_lengths)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3Core(nn.Module):
    """The Qwen3 model. forward(input_ids, cache_length or None, caches) -> FP32 logits [1, vocab]."""

    rope_cos: torch.Tensor  # buffers registered in __init__
    rope_sin: torch.Tensor

    def __init__(self, d: Qwen3Dims, dtype: torch.dtype, max_cache_length: int, device) -> None:
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
        cos, sin = rope_tables(d.head_dim, d.rope_theta, max_cache_length, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.logits_zero_bias = LogitsZeroBias(d.vocab_size, device)

    def forward(
        self, input_ids: torch.Tensor, cache_length: Optional[torch.Tensor], caches: Sequence[torch.Tensor]
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


def rope_tables(head_dim: int, theta: float, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 cos/sin [length, head_dim] exactly as transformers computes them (default RoPE)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    pos = torch.arange(length, dtype=torch.int64, device=device).float()
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _make_role_class(role: str, num_layers: int) -> type:
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
    exec(compile(src, f"<mcore qwen3 {role} role>", "exec"), ns)  # generated from integers only
    cls = type(
        f"Qwen3{role.capitalize()}Role",
        (nn.Module,),
        {"forward": ns["forward"], "__doc__": f"Qwen3 {role} role: forward{tuple(head + cache_args)} -> logits"},
    )
    return cls


_ROLE_CLASSES: dict[tuple[str, int], type] = {}


def _role_class(role: str, num_layers: int) -> type:
    key = (role, num_layers)
    if key not in _ROLE_CLASSES:
        _ROLE_CLASSES[key] = _make_role_class(role, num_layers)
    return _ROLE_CLASSES[key]


def _check_tied_head(folder) -> None:
    """A tied checkpoint may store lm_head.weight too. transformers ties only when the stored copy
    equals the embedding; otherwise it keeps both untied, despite the config. Follow it by refusing
    the contradiction rather than computing logits with the other matrix."""
    names = {"lm_head.weight", "model.embed_tokens.weight"}
    if "lm_head.weight" not in W.checkpoint_files(folder):
        return
    got = dict(W.iter_checkpoint(folder, names))
    if len(got) == 2 and not torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"]):
        raise UserError(
            f"{folder}: config.json sets tie_word_embeddings true but the checkpoint stores an lm_head.weight "
            "that differs from the embedding (transformers would not tie them); set "
            "tie_word_embeddings to false in config.json"
        )


class Qwen3Family(Family):
    name = "qwen3"
    kind = "decoder"
    roles = ("prefill", "decode")

    def structure(self, config: dict) -> Any:
        # the graphs are built from these alone (build_core): a fine-tune whose config differs in
        # fields the family never reads (torch_dtype, use_cache, ...) shares their compiled code
        return dataclasses.asdict(Qwen3Dims.from_config(config))

    def graph_args(self, config: dict, args: BuildArgs) -> dict[str, Any]:
        if args.max_seq_length is not None:
            raise UserError("--max-seq-length does not apply to qwen3 (a decoder); use --max-cache-length")
        if args.precision not in DTYPES:
            raise UserError(f"--precision {args.precision!r} is not supported; use one of {', '.join(DTYPES)}")
        d = Qwen3Dims.from_config(config)
        cap = args.max_cache_length
        if cap is None:
            cap = min(d.max_position_embeddings, DEFAULT_MAX_CACHE_LENGTH)
        elif cap > d.max_position_embeddings:
            raise UserError(
                f"--max-cache-length {cap} exceeds the model's max_position_embeddings {d.max_position_embeddings}; "
                f"use at most {d.max_position_embeddings}"
            )
        layout = args.decoder_engine_layout or "split"
        if layout != "split":
            raise UserError(f"--decoder-engine-layout {layout!r} is not supported; use split")
        return {"precision": args.precision, "max_cache_length": int(cap), "decoder_engine_layout": layout}

    def build_core(self, config: dict, gargs: dict[str, Any], device: torch.device | str) -> nn.Module:
        d = Qwen3Dims.from_config(config)
        return Qwen3Core(d, DTYPES[gargs["precision"]], int(gargs["max_cache_length"]), torch.device(device))

    def role_module(self, core: nn.Module, role: str) -> nn.Module:
        self._check_role(role)
        m = _role_class(role, cast(Qwen3Core, core).dims.num_layers)()
        m.decoder = core
        return m

    def role_io(self, config: dict, gargs: dict[str, Any], role: str) -> RoleIO:
        self._check_role(role)
        d = Qwen3Dims.from_config(config)
        caches: list[str] = []
        for i in range(d.num_layers):
            caches += [f"key_cache.{i}", f"value_cache.{i}"]
        head = ("input_ids", "cache_length") if role == "decode" else ("input_ids",)
        return RoleIO(inputs=head + tuple(caches), outputs=("logits",))

    def example_inputs(self, config: dict, gargs: dict[str, Any], role: str, device: torch.device | str):
        self._check_role(role)
        d = Qwen3Dims.from_config(config)
        cap = int(gargs["max_cache_length"])
        dtype = DTYPES[gargs["precision"]]
        s = min(2, cap)
        ids = torch.zeros(1, s, dtype=torch.int32, device=device)
        head: list[torch.Tensor] = [ids]
        if role == "decode":
            head.append(torch.zeros(1, dtype=torch.int32, device=device))
        caches = [
            torch.zeros(1, d.num_kv_heads, cap, d.head_dim, dtype=dtype, device=device) for _ in range(2 * d.num_layers)
        ]
        tokens = torch.export.Dim("tokens", min=1, max=cap)
        dyn = ({1: tokens},) + (None,) * (len(head) - 1 + len(caches))
        return tuple(head + caches), dyn

    def cache_shape(self, config: dict, gargs: dict[str, Any]) -> tuple[int, int, int, int]:
        """The shape of each key/value cache input: [1, KV heads, max_cache_length, head_dim]."""
        d = Qwen3Dims.from_config(config)
        return (1, d.num_kv_heads, int(gargs["max_cache_length"]), d.head_dim)

    def load_checkpoint(self, core: nn.Module, source: ModelSource) -> None:
        if source.path is None:
            raise UserError(f"{source.spec}: no checkpoint folder; use --weights random")
        tied = cast(Qwen3Core, core).dims.tie_word_embeddings

        def map_name(n: str) -> Optional[str]:
            if n == "lm_head.weight":
                # Tied: transformers ties lm_head to the input embedding, so a stored copy is unused.
                return None if tied else "lm_head.weight"
            if n.startswith("model."):
                return n[len("model.") :]
            return n  # reported as unexpected unless it names a core parameter

        if tied:
            _check_tied_head(source.path)
        W.load_into(core, source.path, map_name, f"qwen3 ({source.spec})")

    def random_init(self, core: nn.Module, seed: int) -> None:
        W.random_init(core, seed)

    def recipes(self, config: dict, gargs: dict[str, Any]) -> list[RecipeSpec]:
        d = Qwen3Dims.from_config(config)
        return [
            RecipeSpec(
                id="qwen.decode_attention_region@2",
                engine_role="decode",
                description=(
                    "Decode attention of one layer: scaled query [1,H,-1,D], updated key and value caches "
                    "[1,KV,C,D], kv_lengths INT32[1] -> context [1,H,-1,D]; softmax scale 1.0, causal, GQA"
                ),
                instances=tuple(
                    (f"decoder.layers.{i}.decode_attention", f"decoder.layers.{i}.self_attn.decode_attention")
                    for i in range(d.num_layers)
                ),
                output_shape_input=0,
            ),
            RecipeSpec(
                id="qwen.decode_logits_copy@1",
                engine_role="decode",
                description="Logits + zero bias (constant, cast, add): an identity copy of the [1, vocab] logits",
                instances=(("decoder.logits_zero_bias", "decoder.logits_zero_bias"),),
                output_shape_input=None,
            ),
        ]

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise UserError(f"engine role {role!r} does not exist for qwen3; use one of {', '.join(self.roles)}")
