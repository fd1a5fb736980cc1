"""Build arguments: the tutorial's BUILD_ARGS, shared by graph inspect, build and the TUI."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..common.errors import UserError
from ..common.fileio import check_path_text

PRECISIONS = ("fp32", "fp16", "bf16")
LAYOUTS = ("split",)
WEIGHTS = ("checkpoint", "random")


@dataclass(frozen=True)
class BuildArgs:
    model: str
    model_revision: str | None = None
    precision: str = "fp32"
    max_cache_length: int | None = None  # decoder families; None = family default
    decoder_engine_layout: str | None = None  # decoder families; None = "split"
    max_seq_length: int | None = None  # encoder families; None = family default (256)
    weights: str = "checkpoint"
    seed: int = 0

    def validate(self) -> BuildArgs:
        self._check_types()
        if not self.model:
            raise UserError("no model given; name a demo (demo:qwen3-tiny), a checkpoint folder or a hub ID")
        check_path_text(self.model, "model")
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision {self.precision!r} is not supported; use one of {', '.join(PRECISIONS)}")
        if self.decoder_engine_layout is not None and self.decoder_engine_layout not in LAYOUTS:
            raise UserError(
                f"--decoder-engine-layout {self.decoder_engine_layout!r} is not supported; use one of {', '.join(LAYOUTS)}"
            )
        if not 0 <= self.seed < 1 << 63:
            raise UserError(f"--seed {self.seed} is out of range; use 0..{(1 << 63) - 1}")
        for name in ("max_cache_length", "max_seq_length"):
            v = getattr(self, name)
            if v is not None and not (1 <= v <= 1 << 20):
                raise UserError(f"--{name.replace('_', '-')} {v} is out of range; use 1..{1 << 20}")
        if self.weights not in WEIGHTS:
            raise UserError(f"--weights {self.weights!r} is not supported; use one of {', '.join(WEIGHTS)}")
        return self

    def _check_types(self) -> None:
        """Every field its type (build args read back from a bundle or a session are someone's JSON)."""
        want = {
            "model": (str,),
            "model_revision": (str, type(None)),
            "precision": (str,),
            "max_cache_length": (int, type(None)),
            "decoder_engine_layout": (str, type(None)),
            "max_seq_length": (int, type(None)),
            "weights": (str,),
            "seed": (int,),
        }
        for name, types in want.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, types):
                kind = "an integer" if int in types else "a string"
                raise UserError(
                    f"build args: {name} must be {kind}{' or null' if type(None) in types else ''}, got {v!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildArgs:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"build args: unknown field(s) {', '.join(unknown)}")
        return cls(**d).validate()

    def with_(self, **kw: Any) -> BuildArgs:
        return replace(self, **kw)


def add_build_args(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    """The BUILD_ARGS flags, identical for `graph inspect` and `build`."""
    if model_required:
        p.add_argument("model", help="demo:NAME, a local checkpoint folder, or a Hugging Face hub ID")
    p.add_argument("--model-revision", default=None, help="pinned revision (recorded; hub IDs resolve it)")
    p.add_argument("--precision", default="fp32", help="fp32 | fp16 | bf16 (default fp32)")
    p.add_argument("--max-cache-length", type=int, default=None, help="decoder KV cache capacity in tokens")
    p.add_argument("--decoder-engine-layout", default=None, help="decoder engine layout (split)")
    p.add_argument("--max-seq-length", type=int, default=None, help="encoder padded sequence length (default 256)")
    p.add_argument(
        "--weights", default="checkpoint", help="checkpoint | random (seeded random weights from the config)"
    )
    p.add_argument("--seed", type=int, default=None, help="seed for --weights random (default 0)")


def build_args_from_namespace(ns: argparse.Namespace) -> BuildArgs:
    # a seed typed beside checkpoint weights would change nothing (build args read back from bundles
    # and sessions keep whatever seed they recorded, so the check is on the flags only)
    if ns.seed is not None and ns.weights != "random":
        raise UserError(f"--seed {ns.seed} applies to --weights random only; add --weights random or drop --seed")
    return BuildArgs(
        model=ns.model,
        model_revision=ns.model_revision,
        precision=ns.precision,
        max_cache_length=ns.max_cache_length,
        decoder_engine_layout=ns.decoder_engine_layout,
        max_seq_length=ns.max_seq_length,
        weights=ns.weights,
        seed=0 if ns.seed is None else ns.seed,
    ).validate()
