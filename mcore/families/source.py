"""Resolving what the user typed (demo:NAME, a folder, a hub ID) into a ModelSource; tokenizers."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..model.tokenization import token_text
from .base import ModelSource

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# What a hub download fetches: enough to build, tokenize and run.
_HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "*.safetensors",
    "model.safetensors.index.json",
]


def _read_json_file(path: Path, what: str) -> Any:
    from ..common.fileio import parse_json, read_input_text

    return parse_json(read_input_text(path, what), str(path), what, constants=True)


def read_config(folder: str | Path) -> dict:
    folder = Path(folder)
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise UserError(
            f"{folder}: no config.json in this folder; pass a Hugging Face checkpoint folder (config.json + safetensors)"
        )
    data = _read_json_file(cfg, "config.json")
    if not isinstance(data, dict):
        raise UserError(f"{cfg}: expected a JSON object")
    return data


def _from_folder(spec: str, folder: Path, revision: str | None) -> ModelSource:
    from . import family_for_config

    config = read_config(folder)
    family = family_for_config(config)
    return ModelSource(spec=spec, family=family.name, config=config, path=folder.resolve(), revision=revision)


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a declared dependency
        snapshot_download = None  # type: ignore[assignment]  # an optional import, checked below
    rev = f" at revision {revision}" if revision else ""
    how = (
        f"{repo_id}{rev} is not in the local Hugging Face cache; download it where the hub is reachable "
        f"(hf download {repo_id}{' --revision ' + revision if revision else ''}) "
        "or pass the checkpoint folder's path instead"
    )
    if snapshot_download is None:
        raise UserError(how)
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UserError(how + " (HF_HUB_OFFLINE=1, no download tried)")
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_PATTERNS))
    except Exception as e:
        reason = type(e).__name__
        raise UserError(f"{how} (download failed: {reason})") from None


def cached_hub_folder(repo_id: str) -> Path | None:
    """The local Hugging Face cache's snapshot of hub ID `repo_id`, or None; never downloads."""
    if not _HUB_ID.match(repo_id) or repo_id.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached, or no huggingface_hub: unknown here
        return None


def resolve_model(spec: str, revision: str | None = None) -> ModelSource:
    """demo:NAME, an existing local folder (holding config.json), or a hub ID org/name."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("no model given; name a demo (demo:qwen3-tiny), a checkpoint folder or a hub ID")
    spec = spec.strip()
    if spec.startswith("demo:"):
        from .demo import materialize

        folder = materialize(spec[len("demo:") :])
        return _from_folder(spec, folder, revision)
    p = Path(spec).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UserError(f"{spec}: is a file; pass the checkpoint folder that holds config.json")
        return _from_folder(spec, p, revision)
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        folder = _hub_snapshot(spec, revision)
        # Record what was resolved: the snapshot folder is named by its commit hash.
        return _from_folder(spec, folder, revision or folder.name)
    raise UserError(f"{spec}: no such folder, and not a demo (demo:NAME) or a hub ID (org/name); check the path")


def load_tokenizer(source: ModelSource):
    """The model's tokenizers.Tokenizer from tokenizer.json."""
    from tokenizers import Tokenizer

    if source.path is None:
        raise UserError(f"{source.spec}: no model folder, so no tokenizer.json")
    path = Path(source.path) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{path}: tokenizer.json not found; the model folder needs a fast tokenizer file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: cannot load tokenizer.json ({msg})") from None


def _ids(v: Any) -> list[int]:
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [x for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def _token_files(source: ModelSource) -> tuple[dict, dict, Any]:
    """generation_config.json and tokenizer_config.json (empty when absent or not objects) and the
    tokenizer (None when tokenizer.json is absent or unreadable), from the model's folder."""
    folder = Path(source.path) if source.path is not None else None
    gen: dict = {}
    tok_cfg: dict = {}
    if folder is not None:
        if (folder / "generation_config.json").is_file():
            g = _read_json_file(folder / "generation_config.json", "generation_config.json")
            gen = g if isinstance(g, dict) else {}
        if (folder / "tokenizer_config.json").is_file():
            t = _read_json_file(folder / "tokenizer_config.json", "tokenizer_config.json")
            tok_cfg = t if isinstance(t, dict) else {}
    tokenizer = None
    if folder is not None and (folder / "tokenizer.json").is_file():
        try:
            tokenizer = load_tokenizer(source)
        except UserError:
            tokenizer = None
    return gen, tok_cfg, tokenizer


def special_tokens(source: ModelSource) -> dict:
    """Special token ids: eos_token_ids (list; first is eos_token_id), pad/bos, and cls/sep for encoders.

    Sources, in order of precedence: generation_config.json, config.json, then the token
    strings of tokenizer_config.json looked up in tokenizer.json. Absent ids are None.
    """
    config = source.config or {}
    gen, tok_cfg, tokenizer = _token_files(source)

    def lookup(key: str, default_text: str | None = None) -> int | None:
        text = token_text(tok_cfg.get(key)) or default_text
        if text is None or tokenizer is None:
            return None
        return tokenizer.token_to_id(text)

    def first_id(key: str) -> int | None:
        for d in (gen, config):
            ids = _ids(d.get(key))
            if ids:
                return ids[0]
        return lookup(key.replace("_id", ""))

    eos: list[int] = []
    for d in (gen, config):
        for i in _ids(d.get("eos_token_id")):
            if i not in eos:
                eos.append(i)
    if not eos:
        t = lookup("eos_token")
        if t is not None:
            eos.append(t)
    out: dict[str, Any] = {
        "eos_token_ids": eos,
        "eos_token_id": eos[0] if eos else None,
        "bos_token_id": first_id("bos_token_id"),
        "pad_token_id": first_id("pad_token_id"),
    }
    from . import family_kind

    if family_kind(source.family) == "encoder":
        out["cls_token_id"] = lookup("cls_token", "[CLS]")
        out["sep_token_id"] = lookup("sep_token", "[SEP]")
    return out
