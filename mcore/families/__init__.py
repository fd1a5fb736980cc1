"""Model families: registry by name and by config.json's model_type.

Importing this package registers the custom op mcore::decode_attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.errors import UserError
from ..ops import attention as _ops  # noqa: F401  (registers mcore::decode_attention)
from .base import DTYPES, Family, ModelSource, RecipeSpec, RoleIO
from .bert import BertFamily
from .distilbert import DistilBertFamily
from .llama import LlamaFamily
from .mistral import MistralFamily
from .qwen2 import Qwen2Family
from .qwen3 import Qwen3Family

if TYPE_CHECKING:
    from ..bundle.manifest import BundleManifest

_FAMILIES: dict[str, Family] = {
    f.name: f for f in (Qwen3Family(), LlamaFamily(), MistralFamily(), Qwen2Family(), DistilBertFamily(), BertFamily())
}
# config.json model_type -> family name (each family is named after the model_type it reads)
_MODEL_TYPES = {name: name for name in _FAMILIES}


def family_names() -> list[str]:
    return list(_FAMILIES)


def get_family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise UserError(f"unknown model family {name!r}; supported: {', '.join(_FAMILIES)}") from None


def bundle_kind(manifest: BundleManifest) -> str:
    """decoder or encoder: the manifest's family_kind, else (older bundles) its family's kind."""
    return manifest.family_kind or get_family(manifest.family).kind


def family_kind(name: str) -> str:
    """decoder or encoder: the kind of the family `name` (a snapshot's or bundle's `family`)."""
    return get_family(name).kind


def model_kind(spec: str) -> str | None:
    """decoder or encoder for what a user typed as the model, from its config.json's model_type (a demo's
    from the table of demos, without materializing it); None when no config.json is readable here
    (a hub ID not in the local cache, a mistyped path). Never guessed from the name."""
    from pathlib import Path

    from .demo import DEMO_FAMILIES
    from .source import cached_hub_folder, read_config

    if not isinstance(spec, str) or not spec.strip():
        return None
    spec = spec.strip()
    if spec.startswith("demo:"):
        name = DEMO_FAMILIES.get(spec[len("demo:") :])
        return family_kind(name) if name else None
    folder = Path(spec).expanduser()
    if not folder.exists():
        folder = cached_hub_folder(spec) or folder
    try:
        return family_for_config(read_config(folder)).kind
    except (UserError, OSError):
        return None


def family_for_config(config: dict) -> Family:
    mt = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(mt, str) or mt not in _MODEL_TYPES:
        shown = "missing" if mt is None else repr(mt)
        raise UserError(
            f"config.json: model_type {shown} is not supported; supported model types: {', '.join(_MODEL_TYPES)}"
        )
    return _FAMILIES[_MODEL_TYPES[mt]]


__all__ = [
    "DTYPES",
    "Family",
    "ModelSource",
    "RecipeSpec",
    "RoleIO",
    "family_names",
    "get_family",
    "family_for_config",
    "family_kind",
    "model_kind",
    "bundle_kind",
]
