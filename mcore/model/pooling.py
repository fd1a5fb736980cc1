"""Embedding pooling, and the default a sentence-embedding checkpoint declares.

A sentence-transformers checkpoint lists its modules in modules.json: the Transformer, then a
Pooling module (its folder's config.json names the mode) and optionally Normalize. That pipeline
is the embedding its users expect, so `mcore embed` uses it unless `--pooling` says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..common.errors import UserError

POOLINGS = ("none", "mean", "cls", "max")
MODULES_FILE = "modules.json"
_ST = "sentence_transformers.models."
# sentence-transformers Pooling config keys -> our mode names
_MODE_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
_UNSUPPORTED_KEYS = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


def _read(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UserError(f"{path}: cannot read {what} ({type(e).__name__}: {e}); fix or remove it") from None


def _pooling_mode(path: Path) -> str:
    cfg = _read(path, "the pooling config")
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("pooling_mode"), str):  # newer sentence-transformers spell the mode out
        mode = {"mean": "mean", "cls": "cls", "max": "max"}.get(cfg["pooling_mode"])
        if mode is None:
            raise UserError(
                f"{path}: pooling_mode {cfg['pooling_mode']!r} is not supported; mcore pools with "
                "mean, cls or max (choose one with --pooling)"
            )
        return mode
    on = [k for k in (*_MODE_KEYS, *_UNSUPPORTED_KEYS) if cfg.get(k) is True]
    if len(on) != 1 or on[0] not in _MODE_KEYS:
        raise UserError(
            f"{path}: pooling {', '.join(on) or 'none'} is not supported; mcore pools with exactly one "
            "of pooling_mode_mean_tokens, pooling_mode_cls_token, pooling_mode_max_tokens "
            "(choose one with --pooling)"
        )
    return _MODE_KEYS[on[0]]


def sentence_embedding(folder: Path | None) -> dict[str, Any] | None:
    """{"pooling", "normalize", "source"} declared by a checkpoint's modules.json, or None when it has
    none. Modules other than Transformer, Pooling and Normalize (a Dense projection...) are an
    error: mcore would compute a different embedding than the checkpoint's users get."""
    if folder is None or not (Path(folder) / MODULES_FILE).is_file():
        return None
    path = Path(folder) / MODULES_FILE
    modules = _read(path, MODULES_FILE)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UserError(f"{path}: expected a list of module objects")
    pooling, normalize = None, False
    for m in modules:
        kind = str(m.get("type", "")).removeprefix(_ST)
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            sub = str(m.get("path", ""))
            if Path(sub).is_absolute() or ".." in Path(sub).parts:
                raise UserError(f"{path}: module path {sub!r} leaves the checkpoint folder")
            pooling = _pooling_mode(Path(folder) / sub / "config.json")
        elif kind == "Normalize":
            normalize = True
        else:
            raise UserError(
                f"{path}: module {m.get('type')!r} is not supported (mcore runs Transformer, Pooling "
                "and Normalize); the embedding would differ from the checkpoint's"
            )
    if pooling is None:
        return None
    return {"pooling": pooling, "normalize": normalize, "source": MODULES_FILE}


def choose(pooling: str | None, normalize: bool | None, default: dict | None) -> tuple[str, bool, str]:
    """(pooling, normalize, why): an explicit --pooling wins (normalized only with --normalize);
    otherwise the checkpoint's declared default; otherwise the raw hidden states."""
    if pooling is not None:
        if pooling not in POOLINGS:
            raise UserError(f"--pooling {pooling!r} is not supported; use one of {', '.join(POOLINGS)}")
        return pooling, bool(normalize), "--pooling"
    if default:
        return (
            default["pooling"],
            default["normalize"] if normalize is None else normalize,
            f"the checkpoint's {default.get('source', MODULES_FILE)}",
        )
    return "none", bool(normalize), "no pooling declared by the checkpoint"


def pool(hidden: torch.Tensor, n: int, pooling: str, normalize: bool) -> torch.Tensor:
    """Pool hidden states [S, H] over the first `n` (real, unpadded) positions, in float32."""
    h = hidden.float()
    if pooling == "none":
        v = h.reshape(-1)  # every position, padding included: the raw graph output
    elif pooling == "mean":
        v = h[:n].mean(0)
    elif pooling == "cls":
        v = h[0]
    elif pooling == "max":
        v = h[:n].max(0).values
    else:
        raise UserError(f"--pooling {pooling!r} is not supported; use one of {', '.join(POOLINGS)}")
    if normalize:
        v = torch.nn.functional.normalize(v, p=2, dim=0, eps=1e-12)
    return v
