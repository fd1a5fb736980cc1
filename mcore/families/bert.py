"""BERT (encoder) and the encoder core shared with DistilBERT.

One role, `encoder`: inputs input_ids INT32 [S] and attention_mask INT32 [S] (S fixed =
max_seq_length, padded, batch dimension squeezed), output hidden_states [S, hidden] in the
model dtype (transformers' last_hidden_state[0]).

Module paths inside the role module (which holds the core as `encoder`):
  encoder.embeddings.{word_embeddings,position_embeddings,token_type_embeddings,LayerNorm}
  encoder.layers.N.attention.{q_lin,k_lin,v_lin,out_lin}
  encoder.layers.N.attention_residual      (hidden + attention projection: one add node)
  encoder.layers.N.sa_layer_norm
  encoder.layers.N.ffn.{lin1,lin2}
  encoder.layers.N.output_layer_norm
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.errors import UserError
from ..model.buildargs import BuildArgs
from . import weights as W
from .base import DTYPES, Family, ModelSource, RecipeSpec, RoleIO
from .config import cfg_bool, cfg_choice, cfg_float, cfg_int
from .graph_args import GraphArgs

DEFAULT_MAX_SEQ_LENGTH = 256

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True)
class EncoderDims:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float
    activation: str
    type_vocab_size: int  # 0: no token type embeddings (DistilBERT)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _check_activation(config: dict, key: str, what: str) -> str:
    return cfg_choice(config, key, "gelu", sorted(_ACTIVATIONS), what)


def bert_dims(config: dict) -> EncoderDims:
    what = "the bert family"
    cfg_choice(config, "position_embedding_type", "absolute", ("absolute", None), what)
    for key in ("is_decoder", "add_cross_attention"):
        if cfg_bool(config, key, False):
            raise UserError(f"config.json: {key} true is not supported by {what}; only BERT encoders run here")
    d = EncoderDims(
        vocab_size=cfg_int(config, "vocab_size"),
        hidden_size=cfg_int(config, "hidden_size"),
        num_layers=cfg_int(config, "num_hidden_layers"),
        num_heads=cfg_int(config, "num_attention_heads"),
        intermediate_size=cfg_int(config, "intermediate_size"),
        max_position_embeddings=cfg_int(config, "max_position_embeddings", 512),
        layer_norm_eps=cfg_float(config, "layer_norm_eps", 1e-12),
        activation=_check_activation(config, "hidden_act", what),
        type_vocab_size=cfg_int(config, "type_vocab_size", 2),
    )
    _check_heads(d)
    return d


def _check_heads(d: EncoderDims) -> None:
    if d.hidden_size % d.num_heads:
        raise UserError(f"config.json: hidden size {d.hidden_size} is not a multiple of {d.num_heads} attention heads")


class AttentionResidual(nn.Module):
    """hidden + attention projection (hidden first): the attention residual add region."""

    def forward(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        return hidden + attn_out


class Embeddings(nn.Module):
    def __init__(self, d: EncoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.word_embeddings = W.embedding(d.vocab_size, d.hidden_size, **kw)
        self.position_embeddings = W.embedding(d.max_position_embeddings, d.hidden_size, **kw)
        self.token_type_embeddings: nn.Embedding | None
        if d.type_vocab_size:
            self.token_type_embeddings = W.embedding(d.type_vocab_size, d.hidden_size, **kw)
        else:
            self.token_type_embeddings = None
        self.LayerNorm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps, **kw)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[0]
        h = self.word_embeddings(input_ids)  # [S, hidden]
        if self.token_type_embeddings is not None:
            h = h + self.token_type_embeddings.weight[0]  # token_type_ids are all zero
        h = h + self.position_embeddings.weight[:s]  # position ids 0..S-1
        return self.LayerNorm(h)


class SelfAttention(nn.Module):
    def __init__(self, d: EncoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.num_heads, self.head_dim = d.num_heads, d.head_dim
        self.q_lin = W.linear(d.hidden_size, d.hidden_size, **kw)
        self.k_lin = W.linear(d.hidden_size, d.hidden_size, **kw)
        self.v_lin = W.linear(d.hidden_size, d.hidden_size, **kw)
        self.out_lin = W.linear(d.hidden_size, d.hidden_size, **kw)

    def forward(self, h: torch.Tensor, mask_add: torch.Tensor) -> torch.Tensor:
        s = h.shape[0]
        q = self.q_lin(h).view(s, self.num_heads, self.head_dim).transpose(0, 1)  # [H, S, D]
        k = self.k_lin(h).view(s, self.num_heads, self.head_dim).transpose(0, 1)
        v = self.v_lin(h).view(s, self.num_heads, self.head_dim).transpose(0, 1)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_add, scale=self.head_dim**-0.5)
        return self.out_lin(ctx.transpose(0, 1).reshape(s, self.num_heads * self.head_dim))


class FFN(nn.Module):
    def __init__(self, d: EncoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.lin1 = W.linear(d.hidden_size, d.intermediate_size, **kw)
        self.lin2 = W.linear(d.intermediate_size, d.hidden_size, **kw)
        self.act = _ACTIVATIONS[d.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.act(self.lin1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d: EncoderDims, dtype: torch.dtype, device) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.attention = SelfAttention(d, dtype, device)
        self.attention_residual = AttentionResidual()
        self.sa_layer_norm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps, **kw)
        self.ffn = FFN(d, dtype, device)
        self.output_layer_norm = nn.LayerNorm(d.hidden_size, eps=d.layer_norm_eps, **kw)

    def forward(self, h: torch.Tensor, mask_add: torch.Tensor) -> torch.Tensor:
        a = self.sa_layer_norm(self.attention_residual(h, self.attention(h, mask_add)))
        return self.output_layer_norm(self.ffn(a) + a)


class EncoderCore(nn.Module):
    """forward(input_ids INT32 [S], attention_mask INT32 [S]) -> hidden_states [S, hidden]."""

    def __init__(self, d: EncoderDims, dtype: torch.dtype, max_seq_length: int, device) -> None:
        super().__init__()
        self.dims = d
        self.dtype = dtype
        self.max_seq_length = max_seq_length
        self.embeddings = Embeddings(d, dtype, device)
        self.layers = nn.ModuleList([EncoderLayer(d, dtype, device) for _ in range(d.num_layers)])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(input_ids)
        # Padding keys get the dtype's most negative value (as transformers masks them).
        zero = torch.zeros((), dtype=self.dtype, device=h.device)
        neg = torch.full((), torch.finfo(self.dtype).min, dtype=self.dtype, device=h.device)
        mask_add = torch.where(attention_mask != 0, zero, neg).view(1, 1, -1)  # [1, 1, S] over keys
        for layer in self.layers:
            h = layer(h, mask_add)
        return h


class EncoderRole(nn.Module):
    """The `encoder` role: forward(input_ids, attention_mask) -> hidden_states."""

    encoder: nn.Module  # the EncoderCore, set by role_module

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids, attention_mask)


# The core parameter names of one layer, keyed by a short role used in the name maps.
LAYER_PARAMS = (
    "attention.q_lin",
    "attention.k_lin",
    "attention.v_lin",
    "attention.out_lin",
    "sa_layer_norm",
    "ffn.lin1",
    "ffn.lin2",
    "output_layer_norm",
)


def _leaf(name: str) -> str:
    # Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
    if name.endswith(".gamma"):
        return name[: -len(".gamma")] + ".weight"
    if name.endswith(".beta"):
        return name[: -len(".beta")] + ".bias"
    return name


class EncoderFamily(Family):
    """What BERT and DistilBERT share; subclasses give dims, prefixes and the layer name map."""

    kind = "encoder"
    roles = ("encoder",)
    prefix = ""  # the task-model prefix: bert. / distilbert.
    ignored: tuple[str, ...] = ()  # regexes of checkpoint names (after the prefix) this family ignores
    layer_map: dict[str, str] = {}  # checkpoint sub-name within a layer -> core sub-name
    layer_re = re.compile(r"^$")  # captures (index, rest) of a layer's checkpoint names

    @abstractmethod
    def dims(self, config: dict) -> EncoderDims:
        """The encoder's sizes read from its config.json."""

    def graph_args(self, config: dict, args: BuildArgs) -> GraphArgs:
        if args.max_cache_length is not None:
            raise UserError(f"--max-cache-length does not apply to an encoder ({self.name}); use --max-seq-length")
        if args.decoder_engine_layout is not None:
            raise UserError(f"--decoder-engine-layout does not apply to an encoder ({self.name}); remove it")
        if args.precision not in DTYPES:
            raise UserError(f"--precision {args.precision!r} is not supported; use one of {', '.join(DTYPES)}")
        d = self.dims(config)
        s = (
            args.max_seq_length
            if args.max_seq_length is not None
            else min(DEFAULT_MAX_SEQ_LENGTH, d.max_position_embeddings)
        )
        if s > d.max_position_embeddings:
            raise UserError(
                f"--max-seq-length {s} exceeds the model's max_position_embeddings {d.max_position_embeddings}; "
                f"use at most {d.max_position_embeddings}"
            )
        return GraphArgs(args.precision, max_seq_length=int(s))

    def build_core(self, config: dict, gargs: GraphArgs, device: torch.device | str) -> nn.Module:
        return EncoderCore(self.dims(config), DTYPES[gargs.precision], gargs.seq_length, torch.device(device))

    def role_module(self, core: nn.Module, role: str) -> nn.Module:
        self._check_role(role)
        m = EncoderRole()
        m.encoder = core
        return m

    def role_io(self, config: dict, gargs: GraphArgs, role: str) -> RoleIO:
        self._check_role(role)
        return RoleIO(inputs=("input_ids", "attention_mask"), outputs=("hidden_states",))

    def example_inputs(self, config: dict, gargs: GraphArgs, role: str, device: torch.device | str):
        self._check_role(role)
        s = gargs.seq_length
        ids = torch.zeros(s, dtype=torch.int32, device=device)
        mask = torch.ones(s, dtype=torch.int32, device=device)
        return (ids, mask), (None, None)

    def map_name(self, name: str) -> str | None:
        """Checkpoint tensor name -> core parameter name; None = ignored; unknown names pass through."""
        n = _leaf(name)
        if self.prefix and n.startswith(self.prefix):
            n = n[len(self.prefix) :]
        for pat in self.ignored:
            if re.match(pat, n):
                return None
        if n.startswith("embeddings."):
            return n
        m = self.layer_re.match(n)
        if m:
            idx, rest = m.group(1), m.group(2)
            for ck, core in self.layer_map.items():
                if rest.startswith(ck + "."):
                    return f"layers.{idx}.{core}{rest[len(ck) :]}"
        return n

    def load_checkpoint(self, core: nn.Module, source: ModelSource) -> None:
        if source.path is None:
            raise UserError(f"{source.spec}: no checkpoint folder; use --weights random")
        W.load_into(core, source.path, self.map_name, f"{self.name} ({source.spec})")

    def random_init(self, core: nn.Module, seed: int) -> None:
        W.random_init(core, seed)

    def recipes(self, config: dict, gargs: GraphArgs) -> list[RecipeSpec]:
        d = self.dims(config)
        return [
            RecipeSpec(
                id=f"{self.name}.attention_residual_add@1",
                engine_role="encoder",
                description="Attention residual add of one layer: hidden [S,hidden] + attention projection [S,hidden]",
                instances=tuple(
                    (f"encoder.layers.{i}.attention_residual", f"encoder.layers.{i}.attention_residual")
                    for i in range(d.num_layers)
                ),
                output_shape_input=None,
            )
        ]

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise UserError(f"engine role {role!r} does not exist for {self.name}; use encoder")


class BertFamily(EncoderFamily):
    name = "bert"
    prefix = "bert."
    ignored = (
        r"^pooler\.",
        r"^cls\.",
        r"^classifier\.",
        r"^qa_outputs\.",
        r"^embeddings\.position_ids$",
        r"^embeddings\.token_type_ids$",
    )
    layer_re = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
    layer_map = {
        "attention.self.query": "attention.q_lin",
        "attention.self.key": "attention.k_lin",
        "attention.self.value": "attention.v_lin",
        "attention.output.dense": "attention.out_lin",
        "attention.output.LayerNorm": "sa_layer_norm",
        "intermediate.dense": "ffn.lin1",
        "output.dense": "ffn.lin2",
        "output.LayerNorm": "output_layer_norm",
    }

    def dims(self, config: dict) -> EncoderDims:
        return bert_dims(config)
