"""What a model family provides: graph builders per engine role, weight loading, recipes.

A family owns torch modules whose forward *is* the engine-role graph. Capture exports
them on the meta device (no weights needed); engines run the captured graph with the
real tensors of the same modules, so capture and execution can never disagree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..model.buildargs import BuildArgs
from .graph_args import GraphArgs

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: where its files are and what its config says."""

    spec: str  # what the user typed: demo:qwen3-tiny, a folder, a hub ID
    family: str  # its config.json model_type: qwen3 | llama | mistral | qwen2 | distilbert | bert
    config: dict  # config.json
    path: Path | None  # folder holding config.json, *.safetensors, tokenizer.json
    revision: str | None  # pinned revision (recorded in metadata)


@dataclass(frozen=True)
class RecipeSpec:
    """A family-owned shortcut for a known manual selection.

    `instances` maps each explicit instance name to the module path whose graph nodes
    form the region (nodes whose module_path equals it or lies below it).
    """

    id: str  # versioned, e.g. qwen.decode_logits_copy@1
    engine_role: str
    description: str
    instances: tuple[tuple[str, str], ...]  # (instance name, module path)
    workspace_bytes: int = 0
    extra_args: tuple[dict, ...] = ()
    output_shape_input: int | None = None


@dataclass(frozen=True)
class RoleIO:
    """Names of a role's graph inputs and outputs, in call order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


# config.json fields that say where a checkpoint came from, never how its graph is built
IDENTITY_FIELDS = ("_name_or_path", "_commit_hash", "transformers_version")


class Family(ABC):
    name: str
    kind: str  # "decoder" or "encoder"
    roles: tuple[str, ...]

    @abstractmethod
    def graph_args(self, config: dict, args: BuildArgs) -> GraphArgs:
        """The resolved graph-producing arguments (defaults filled in), or UserError
        when an argument does not apply to this family or is out of range."""

    @abstractmethod
    def build_core(self, config: dict, gargs: GraphArgs, device: torch.device | str) -> nn.Module:
        """The model with parameters of the requested precision on `device` (meta for
        capture; values unset). Non-persistent buffers (RoPE tables, zero bias) are
        computed here on `device` (meta included)."""

    @abstractmethod
    def role_module(self, core: nn.Module, role: str) -> nn.Module:
        """A module whose forward(*inputs) is the role's graph; holds `core` as a child so
        parameter FQNs are stable."""

    @abstractmethod
    def role_io(self, config: dict, gargs: GraphArgs, role: str) -> RoleIO: ...

    @abstractmethod
    def example_inputs(
        self, config: dict, gargs: GraphArgs, role: str, device: torch.device | str
    ) -> tuple[tuple[torch.Tensor, ...], Any]:
        """Example inputs for torch.export and its dynamic_shapes spec."""

    @abstractmethod
    def load_checkpoint(self, core: nn.Module, source: ModelSource) -> None:
        """Fill `core` from the checkpoint's safetensors (sharded too), cast to the core's
        precision. Missing or unexpected tensors are a UserError naming them."""

    @abstractmethod
    def random_init(self, core: nn.Module, seed: int) -> None:
        """Deterministic seeded random weights (for benchmarking configs with no checkpoint)."""

    @abstractmethod
    def recipes(self, config: dict, gargs: GraphArgs) -> list[RecipeSpec]: ...

    def structure(self, config: dict) -> Any:
        """What the role graphs are built from in `config`, apart from the model's identity: equal
        values give the same graphs, so compiled code is shared (mcore/engines/structure.py). By
        default the whole config but the fields that name where it came from."""
        return {k: v for k, v in config.items() if k not in IDENTITY_FIELDS}
