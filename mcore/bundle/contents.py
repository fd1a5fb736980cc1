"""What a bundle holds, checked against its manifest when a pipeline loads it (DESIGN.md §6).

The integrity record proves the bytes are the ones the writer wrote, not that a writer wrote
sense: a hand-made bundle can hold a config.json that is not an object, a tokenizer that does not
parse, build args of the wrong type, another model's weights or slots naming nodes the graph lacks.
Each is read once here into what the pipeline uses, or refused with one line naming the member
and the field (exit 2), before anything is allocated or bound.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..common.errors import UserError
from ..common.fileio import parse_json
from ..families.graph_args import GraphArgs
from ..model.buildargs import BuildArgs
from .manifest import REBUILD, BundleManifest

# safetensors header dtype -> torch dtype
_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on its JSON header


def read_json_member(bundle: Any, name: str) -> dict[str, Any]:
    """A JSON-object member (config.json, tokenizer_config.json), strictly parsed."""
    where = f"{bundle.path}: member {name}"
    try:
        text = bundle.read(name).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where} is not UTF-8 text; {REBUILD}") from None
    data = parse_json(text, where, name)
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a JSON object, got {type(data).__name__}; {REBUILD}")
    return data


def read_text_member(bundle: Any, name: str) -> str:
    try:
        return bundle.read(name).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{bundle.path}: member {name} is not UTF-8 text; {REBUILD}") from None


def check_family(m: BundleManifest, where: str) -> Any:
    """The bundle's family, known to this mcore, of the kind the manifest says."""
    from ..families import get_family

    try:
        family = get_family(m.family)
    except UserError as e:
        raise UserError(f"{where}: {e}; this mcore cannot run or describe it") from None
    if m.family_kind is not None and m.family_kind != family.kind:
        raise UserError(
            f"{where}: bundle manifest field family_kind {m.family_kind!r} is not the {m.family} family's "
            f"kind ({family.kind}); {REBUILD}"
        )
    return family


def check_graph_args(family: Any, config: dict, m: BundleManifest, where: str) -> tuple[BuildArgs, GraphArgs]:
    """The manifest's build args, typed, and its graph args (typed) exactly what this mcore derives
    from them and the bundle's config (a hand-edited `max_cache_length: "x"` or precision is refused)."""
    try:
        args = BuildArgs.from_dict(m.build_args)
    except TypeError as e:
        raise UserError(f"{where}: bundle manifest field build_args is invalid ({e}); {REBUILD}") from None
    except UserError as e:
        raise UserError(f"{where}: bundle manifest field build_args: {e}; {REBUILD}") from None
    try:
        typed = family.graph_args(config, args)
    except UserError as e:
        raise UserError(f"{where}: the bundle's build_args and config.json do not fit ({e}); {REBUILD}") from None
    derived = typed.to_dict()
    if derived != m.graph_args:
        differ = sorted(k for k in set(derived) | set(m.graph_args) if derived.get(k) != m.graph_args.get(k))
        raise UserError(
            f"{where}: bundle manifest field graph_args ({', '.join(differ)}) is not what its build_args give "
            f"({json.dumps({k: derived.get(k) for k in differ})}); {REBUILD}"
        )
    return args, typed


def weights_header(blob: bytes, where: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """name -> (dtype, shape) from a safetensors blob's header, read without loading any tensor."""
    bad = f"{where} is not a safetensors file ({{}}); {REBUILD}"
    if len(blob) < 8:
        raise UserError(bad.format("too short"))
    (n,) = struct.unpack("<Q", blob[:8])
    if n > min(MAX_HEADER_BYTES, len(blob) - 8):
        raise UserError(bad.format("header length out of range"))
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UserError(bad.format("header is not JSON")) from None
    if not isinstance(header, dict):
        raise UserError(bad.format("header is not an object"))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(str(info.get("dtype"))) if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        if dtype is None or not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape):
            raise UserError(bad.format(f"tensor {name!r} has no valid dtype and shape"))
        out[name] = (dtype, tuple(shape))
    return out


def check_weights(
    stored: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    aliases: Mapping[str, Any],
    expected: Mapping[str, torch.Tensor],
    where: str,
) -> None:
    """The stored tensors (with their aliases) are exactly the model's state: every name, shape and
    dtype (another model's weights, or a truncated set, is refused before anything loads)."""
    for dup, kept in aliases.items():
        if not isinstance(dup, str) or not isinstance(kept, str) or kept not in stored:
            raise UserError(f"{where}: weights alias {dup!r} -> {kept!r} names no stored tensor; {REBUILD}")
    have = {**stored, **{dup: stored[kept] for dup, kept in aliases.items()}}
    missing = sorted(set(expected) - set(have))
    extra = sorted(set(have) - set(expected))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which this model does not"
        n = len(missing) + len(extra)
        raise UserError(f"{where}: the weights are not this model's: it {what} ({n} name(s) differ); {REBUILD}")
    for name, t in expected.items():
        dtype, shape = have[name]
        if dtype != t.dtype or shape != tuple(t.shape):
            raise UserError(
                f"{where}: the weights are not this model's: {name} is {str(dtype).replace('torch.', '')} "
                f"{list(shape)}, the model's is {str(t.dtype).replace('torch.', '')} {list(t.shape)}; {REBUILD}"
            )


def load_weights(blob: bytes, aliases: Mapping[str, str], where: str) -> dict[str, torch.Tensor]:
    """The tensors of a checked safetensors blob, with its aliases."""
    from safetensors.torch import load

    try:
        state = load(blob)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise UserError(f"{where}: cannot read the weights ({str(e).splitlines()[0][:200]}); {REBUILD}") from None
    for dup, kept in aliases.items():
        state[dup] = state[kept]
    return state


def check_slots(slots: Sequence[Any], snapshot: Any, where: str) -> None:
    """Every slot names nodes and tensors its role's graph has (else patching would fail deep inside)."""
    nodes = {n.id for n in snapshot.nodes}
    tensors = {t.id for t in snapshot.tensors}
    for s in slots:
        for nid in s.node_ids:
            if nid not in nodes:
                raise UserError(
                    f"{where}: slot {s.label} names {nid}, which the {s.engine_role} graph lacks; {REBUILD}"
                )
        for tid in (*s.input_tensor_ids, *s.output_tensor_ids):
            if tid not in tensors:
                raise UserError(
                    f"{where}: slot {s.label} names {tid}, which the {s.engine_role} graph lacks; {REBUILD}"
                )


def state_bytes(core: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in core.state_dict().values())


def device_memory(device: torch.device) -> int:
    """Total memory of `device` in bytes (host RAM for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62
