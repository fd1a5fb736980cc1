"""Rotary position embeddings of the decoder families: the config's RoPE fields, read and checked once,
and the cos/sin tables computed as transformers computes them (same float32 operations, same order).

A config names its RoPE in one of two spellings: transformers 5 writes `rope_parameters: {rope_type,
rope_theta, ...}`; older checkpoints (Llama 3.x, Qwen2.5, Mistral as published) write `rope_theta` at
the top level and `rope_scaling` (null for the default type, `{"rope_type": "llama3", ...}` or Llama 2's
`{"type": "linear", "factor": 2.0}`). transformers takes `rope_scaling` when it is set, else
`rope_parameters`, and the base from that object, else the top-level `rope_theta`, else 10000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..common.errors import UserError
from .config import cfg_float, cfg_int

ROPE_TYPES = ("default", "linear", "llama3")  # what rope_tables computes


@dataclass(frozen=True)
class Rope:
    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0  # linear and llama3: how much longer the context is than in pretraining
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 0  # llama3: the pretraining context


def _rope_object(config: dict) -> tuple[str | None, dict]:
    """(the field that holds the RoPE object or None, the object): rope_scaling when set, else
    rope_parameters, as transformers reads them; a non-object is an error naming its field."""
    for key in ("rope_scaling", "rope_parameters"):
        d = config.get(key)
        if d is None:
            continue
        if not isinstance(d, dict):
            raise UserError(f"config.json: field {key!r} must be an object (got {d!r}); fix config.json")
        if d:
            return key, d
    return None, {}


def parse_rope(config: dict, family: str, kinds: tuple[str, ...] = ("default",)) -> Rope:
    """The RoPE a config asks for; UserError naming the field for a type `family` does not implement
    (its `kinds`), partial rotary embeddings, or a value of the wrong type or range."""
    key, d = _rope_object(config)
    kind = d.get("rope_type", d.get("type", "default"))
    if kind not in kinds:
        raise UserError(
            f"config.json: {key or 'rope_scaling'} type {kind!r} is not supported by the {family} family; "
            f"it implements {', '.join(repr(k) for k in kinds)}"
        )
    for src, where in ((d, key), (config, "partial_rotary_factor")):
        prf = src.get("partial_rotary_factor", 1.0)
        if prf is not None and prf != 1.0:
            raise UserError(
                f"config.json: {where} partial_rotary_factor {prf!r} is not supported by the {family} family; "
                "only full rotary embeddings are implemented"
            )
    theta_src = d if d.get("rope_theta") is not None else config
    rope = Rope(theta=cfg_float(theta_src, "rope_theta", 10000.0), kind=kind)
    if kind == "linear":
        return Rope(theta=rope.theta, kind=kind, factor=_factor(d, "factor"))
    if kind == "llama3":
        return _llama3(config, d, rope.theta)
    return rope


def _factor(d: dict, name: str) -> float:
    try:
        return cfg_float(d, name)
    except UserError:
        raise UserError(
            f"config.json: rope_scaling field {name!r} must be a finite positive number (got {d.get(name)!r}); "
            "fix config.json"
        ) from None


def _llama3(config: dict, d: dict, theta: float) -> Rope:
    low, high = _factor(d, "low_freq_factor"), _factor(d, "high_freq_factor")
    if high <= low:
        raise UserError(
            f"config.json: rope_scaling high_freq_factor {high} must be larger than low_freq_factor {low}; "
            "fix config.json"
        )
    # transformers fills original_max_position_embeddings from max_position_embeddings when absent
    orig: Any = d.get("original_max_position_embeddings")
    if orig is None:
        orig = cfg_int(config, "max_position_embeddings")
    elif isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
        raise UserError(
            f"config.json: rope_scaling field 'original_max_position_embeddings' must be a positive integer "
            f"(got {orig!r}); fix config.json"
        )
    return Rope(theta, "llama3", _factor(d, "factor"), low, high, orig)


def inverse_frequencies(rope: Rope, head_dim: int, device) -> torch.Tensor:
    """FP32 [head_dim / 2]: the frequency of each rotated pair."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exps)
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        return _llama3_frequencies(inv_freq, rope)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, r: Rope) -> torch.Tensor:
    """Llama 3.1's scaling: long wavelengths (past the pretraining context / low_freq_factor) divided by
    `factor`, short ones (under context / high_freq_factor) kept, the band between interpolated."""
    low_wavelen = r.original_max_position_embeddings / r.low_freq_factor
    high_wavelen = r.original_max_position_embeddings / r.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq)
    smooth = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) / (
        r.high_freq_factor - r.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(rope: Rope, head_dim: int, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 cos/sin [length, head_dim] for positions 0..length-1."""
    inv_freq = inverse_frequencies(rope, head_dim, device)
    pos = torch.arange(length, dtype=torch.int64, device=device).float()
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
