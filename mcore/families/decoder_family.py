"""The contract every decoder family implements once, here: build arguments, the two roles (prefill and
decode) and their inputs, checkpoint loading, and the recipes (decode attention per layer, the logits
copy). A family (qwen3.py, llama.py, ...) subclasses DecoderFamily and says only what is its own: its
name and recipe ids, and `parse(config)`, which reads its config.json into a DecoderDims.
docs/adding-a-model-family.md walks through adding one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch
from torch import nn

from ..common.errors import UserError
from ..model.buildargs import BuildArgs
from . import weights as W
from .base import DTYPES, Family, ModelSource, RecipeSpec, RoleIO
from .decoder import DecoderCore, role_class
from .decoder_config import DecoderDims, cached_dims
from .graph_args import GraphArgs

DEFAULT_MAX_CACHE_LENGTH = 4096

ATTENTION_DESCRIPTION = (
    "Decode attention of one layer: scaled query [1,H,-1,D], updated key and value caches "
    "[1,KV,C,D], kv_lengths INT32[1] -> context [1,H,-1,D]; softmax scale 1.0, causal, GQA"
)
LOGITS_DESCRIPTION = "Logits + zero bias (constant, cast, add): an identity copy of the [1, vocab] logits"


class DecoderFamily(Family):
    kind = "decoder"
    roles = ("prefill", "decode")
    # Recipe ids: "<recipe_prefix>.decode_attention_region@<attention_recipe_version>" and
    # "<recipe_prefix>.decode_logits_copy@1". A new family uses its name and version 1.
    recipe_prefix: str
    attention_recipe_version = 1

    def parse(self, config: dict) -> DecoderDims:
        """Read config.json into DecoderDims: every field the graph uses, type- and range-checked;
        a field that would change the numerics in a way this family does not implement is a
        UserError naming it. Each family implements it (through decoder_config.decoder_dims)."""
        raise NotImplementedError

    def dims(self, config: dict) -> DecoderDims:
        return cached_dims(self.name, config, self.parse)

    def structure(self, config: dict) -> Any:
        # the graphs are a function of the parsed dims alone (decoder.py): a fine-tune whose config
        # differs in fields no family reads (torch_dtype, use_cache, names) shares their compiled code
        return dataclasses.asdict(self.dims(config))

    @property
    def attention_recipe(self) -> str:
        return f"{self.recipe_prefix}.decode_attention_region@{self.attention_recipe_version}"

    @property
    def logits_recipe(self) -> str:
        return f"{self.recipe_prefix}.decode_logits_copy@1"

    # ------------------------------------------------------------ build arguments
    def graph_args(self, config: dict, args: BuildArgs) -> GraphArgs:
        if args.max_seq_length is not None:
            raise UserError(f"--max-seq-length does not apply to {self.name} (a decoder); use --max-cache-length")
        if args.precision not in DTYPES:
            raise UserError(f"--precision {args.precision!r} is not supported; use one of {', '.join(DTYPES)}")
        d = self.dims(config)
        layout = args.decoder_engine_layout or "split"
        if layout != "split":
            raise UserError(f"--decoder-engine-layout {layout!r} is not supported; use split")
        cap = self._capacity(d, args.max_cache_length)
        return GraphArgs(args.precision, max_cache_length=int(cap), decoder_engine_layout=layout)

    def _capacity(self, d: DecoderDims, asked: int | None) -> int:
        """The KV cache capacity: as asked, else min(max_position_embeddings, 4096, the sliding window).
        A window smaller than the capacity would need sliding-window attention: refused, naming it."""
        if asked is None:
            return min(
                d.max_position_embeddings, DEFAULT_MAX_CACHE_LENGTH, d.sliding_window or DEFAULT_MAX_CACHE_LENGTH
            )
        if asked > d.max_position_embeddings:
            raise UserError(
                f"--max-cache-length {asked} exceeds the model's max_position_embeddings {d.max_position_embeddings}; "
                f"use at most {d.max_position_embeddings}"
            )
        if d.sliding_window is not None and asked > d.sliding_window:
            raise UserError(
                f"config.json: sliding_window {d.sliding_window} is smaller than --max-cache-length {asked}; "
                f"sliding-window attention is not supported by the {self.name} family (only full attention), "
                f"so use --max-cache-length at most {d.sliding_window}"
            )
        return asked

    # ------------------------------------------------------------ the graph
    def build_core(self, config: dict, gargs: GraphArgs, device: torch.device | str) -> nn.Module:
        return DecoderCore(self.dims(config), DTYPES[gargs.precision], gargs.cache_length, torch.device(device))

    def role_module(self, core: nn.Module, role: str) -> nn.Module:
        self._check_role(role)
        m = role_class(self.name, role, cast(DecoderCore, core).dims.num_layers)()
        m.decoder = core
        return m

    def role_io(self, config: dict, gargs: GraphArgs, role: str) -> RoleIO:
        self._check_role(role)
        d = self.dims(config)
        caches: list[str] = []
        for i in range(d.num_layers):
            caches += [f"key_cache.{i}", f"value_cache.{i}"]
        head = ("input_ids", "cache_length") if role == "decode" else ("input_ids",)
        return RoleIO(inputs=head + tuple(caches), outputs=("logits",))

    def example_inputs(self, config: dict, gargs: GraphArgs, role: str, device: torch.device | str):
        self._check_role(role)
        d = self.dims(config)
        cap = gargs.cache_length
        dtype = DTYPES[gargs.precision]
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

    def cache_shape(self, config: dict, gargs: GraphArgs) -> tuple[int, int, int, int]:
        """The shape of each key/value cache input: [1, KV heads, max_cache_length, head_dim]."""
        d = self.dims(config)
        return (1, d.num_kv_heads, gargs.cache_length, d.head_dim)

    # ------------------------------------------------------------ weights
    def load_checkpoint(self, core: nn.Module, source: ModelSource) -> None:
        """`model.X` -> X, `lm_head.weight` -> lm_head.weight (the layout of every *ForCausalLM here)."""
        if source.path is None:
            raise UserError(f"{source.spec}: no checkpoint folder; use --weights random")
        tied = cast(DecoderCore, core).dims.tie_word_embeddings

        def map_name(n: str) -> str | None:
            if n == "lm_head.weight":
                # Tied: transformers ties lm_head to the input embedding, so a stored copy is unused.
                return None if tied else "lm_head.weight"
            if n.startswith("model."):
                return n[len("model.") :]
            return n  # reported as unexpected unless it names a core parameter

        if tied:
            check_tied_head(source.path)
        W.load_into(core, source.path, map_name, f"{self.name} ({source.spec})")

    def random_init(self, core: nn.Module, seed: int) -> None:
        W.random_init(core, seed)

    # ------------------------------------------------------------ recipes
    def recipes(self, config: dict, gargs: GraphArgs) -> list[RecipeSpec]:
        d = self.dims(config)
        return [
            RecipeSpec(
                id=self.attention_recipe,
                engine_role="decode",
                description=ATTENTION_DESCRIPTION,
                instances=tuple(
                    (f"decoder.layers.{i}.decode_attention", f"decoder.layers.{i}.self_attn.decode_attention")
                    for i in range(d.num_layers)
                ),
                output_shape_input=0,
            ),
            RecipeSpec(
                id=self.logits_recipe,
                engine_role="decode",
                description=LOGITS_DESCRIPTION,
                instances=(("decoder.logits_zero_bias", "decoder.logits_zero_bias"),),
                output_shape_input=None,
            ),
        ]

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise UserError(f"engine role {role!r} does not exist for {self.name}; use one of {', '.join(self.roles)}")


def check_tied_head(folder) -> None:
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
