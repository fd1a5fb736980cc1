"""The profile file (DESIGN.md contract 10): `mcore profile -o FILE` writes it; `mcore profile diff` and
the workbench read it back through `load_profile`, which checks every field they use (types, finite
non-negative numbers, the known keys and no others) into one-line errors naming the file and the field,
and returns the typed report (report.py).

schema_version 2 (this mcore): the engine profiled (`engine.name`: compiled or torch), the kernels of
a compiled step and the time between them. Version 1 files (op by op only, no engine record) are
refused with a message to profile again: their numbers describe another engine and would mislead a diff.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..common.contract import field_error, is_int
from ..common.errors import UserError
from ..common.fileio import read_input_text
from .report import KIND, SCHEMA_VERSION, ProfileReport

AGAIN = "make it again with `mcore profile BUNDLE -o FILE`"

Check = Callable[[Any], str | None]  # a problem with a value, or None


class _Bad(Exception):
    def __init__(self, path: str, problem: str):
        super().__init__(problem)
        self.path, self.problem = path, problem


def _num(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "must be a number"
    try:
        ok = math.isfinite(float(v)) and v >= 0
    except OverflowError:
        ok = False
    return None if ok else f"must be a finite number >= 0 (got {str(v)[:24]})"


def _int(v: Any) -> str | None:
    if not is_int(v) or v < 0 or v > 2**53:
        return "must be an integer >= 0"
    return None


def _text(v: str) -> bool:
    try:
        v.encode("utf-8")  # an unpaired surrogate would fail where the text is printed
    except UnicodeEncodeError:
        return False
    return True


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) and _text(v) else "must be a string"


def _opt(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def _one_of(*values: str) -> Check:
    return lambda v: None if v in values else f"must be one of {', '.join(values)}"


def _strs(v: Any) -> str | None:
    if not isinstance(v, list) or not all(isinstance(x, str) and _text(x) for x in v):
        return "must be a list of strings"
    return None


def _any_obj(v: Any) -> str | None:
    return None if isinstance(v, dict) else "must be an object"


RATES: dict[str, Check] = {
    k: _num
    for k in (
        "seconds",
        "bytes",
        "flops",
        "share",
        "bytes_per_s",
        "flops_per_s",
        "limit_seconds",
        "ratio_to_limit",
        "headroom_seconds",
    )
}
NODE: dict[str, Check] = {"id": _str, "name": _str, "op": _str, "module_path": _str, "binding_id": _opt(_str), **RATES}
MODULE: dict[str, Check] = {"path": _str, "calls": _int, **RATES}
RECIPE: dict[str, Check] = {
    "recipe": _str,
    "instance": _str,
    "node_ids": _strs,
    "output_shape_input": _opt(_int),
    "calls": _int,
    **RATES,
}
SLOT: dict[str, Check] = {"binding_id": _str, "calls": _int, **RATES}
KERNEL: dict[str, Check] = {"kernel": _str, "order": _int, "node_ids": _strs, **RATES}
KERNEL_OPT: dict[str, Check] = {"device_kernels": _strs}
SPLIT: dict[str, Check] = {
    "kernel": _str,
    "order": _opt(_int),
    "inside": _int,
    "outside": _int,
    "seconds": _opt(_num),
    "cost_seconds": _num,
}
CANDIDATE: dict[str, Check] = {
    "kind": _one_of("recipe", "region"),
    "node_ids": _strs,
    "output_shape_input": _opt(_int),
    "seconds": _num,
    "share": _num,
    "headroom_seconds": _num,
    "split_cost_seconds": _num,
    "net_headroom_seconds": _num,
    "command": _str,
}
CANDIDATE_KIND: dict[str, dict[str, Check]] = {
    "recipe": {"recipe": _str, "instance": _str},
    "region": {"module_path": _str},
}
DEVICE: dict[str, Check] = {"type": _one_of("cpu", "cuda"), "name": _str, "copy_bytes_per_s": _num}
DEVICE_OPT: dict[str, Check] = {
    "sm_count": _int,
    "memory_bytes": _int,
    "capability": _str,
    "source": _str,
    "uuid": _str,
    "memory_clock_khz": _int,
    "memory_bus_bits": _int,
    "theoretical_bytes_per_s": _num,
    "sm_clock_khz": _int,
    "peak_bf16_flops_per_s": _num,
}
BETWEEN: dict[str, Check] = {"seconds": _num, "share": _num, "gaps": _int, "what": _str}
TOP: dict[str, Check] = {
    "schema_version": _int,
    "kind": _str,
    "role": _str,
    "engine": _any_obj,
    "bundle": _any_obj,
    "device": _any_obj,
    "versions": _any_obj,
    "timing": _str,
    "context": _opt(_int),
    "steps": _int,
    "step_seconds": _num,
    "attributed_seconds": _num,
    "unattributed_seconds": _num,
    "kernel_seconds": _opt(_num),
    "between_kernels": _opt(_any_obj),
    "nodes": lambda v: None if isinstance(v, list) else "must be a list",
    "modules": lambda v: None if isinstance(v, list) else "must be a list",
    "recipes": lambda v: None if isinstance(v, list) else "must be a list",
    "slots": lambda v: None if isinstance(v, list) else "must be a list",
    "kernels": lambda v: None if v is None or isinstance(v, list) else "must be a list or null",
    "candidates": lambda v: None if isinstance(v, list) else "must be a list",
}
TOP_OPT: dict[str, Check] = {"fusion": _any_obj}


def _fields(obj: Any, spec: Mapping[str, Check], path: str, optional: Mapping[str, Check] | None = None) -> None:
    """`obj` is an object with exactly the keys of `spec` (and any of `optional`), each valid."""
    optional = optional or {}
    if not isinstance(obj, dict):
        raise _Bad(path.rstrip("."), "must be an object")
    for key, check in spec.items():
        if key not in obj:
            raise _Bad(path + key, "is missing")
        problem = check(obj[key])
        if problem:
            raise _Bad(path + key, problem)
    for key in obj.keys() - spec.keys():
        if key not in optional:
            raise _Bad(path + ascii(key)[:40], "is not a profile field (remove it)")
        problem = optional[key](obj[key])
        if problem:
            raise _Bad(path + key, problem)


def _rows(obj: dict, key: str, spec: Mapping[str, Check], optional: Mapping[str, Check] | None = None) -> None:
    for i, row in enumerate(obj[key] or []):
        _fields(row, spec, f"{key}[{i}].", optional)


def check_profile(data: Any) -> None:
    """Raises _Bad at the first field that is not what this mcore writes."""
    if not isinstance(data, dict):
        raise _Bad("(top level)", "must be an object")
    if data.get("kind") != KIND:
        raise _Bad("kind", f"is {ascii(data.get('kind'))[:40]}, not {KIND!r}: not an mcore profile")
    if data.get("schema_version") != SCHEMA_VERSION:
        v = ascii(data.get("schema_version"))[:12]
        raise _Bad("schema_version", f"is {v}, not {SCHEMA_VERSION} (profiles before {SCHEMA_VERSION} lack the engine)")
    _fields(data, TOP, "", TOP_OPT)
    _fields(data["engine"], {"name": _one_of("compiled", "torch"), "how": _str}, "engine.")
    _fields(data["bundle"], {"model": _str, "fingerprint": _str, "build_args": _any_obj}, "bundle.")
    _fields(data["device"], DEVICE, "device.", DEVICE_OPT)
    _fields(data["versions"], {"mcore": _str, "torch": _str, "cuda": _opt(_str)}, "versions.")
    compiled = data["engine"]["name"] == "compiled"
    for key in ("between_kernels", "kernels", "kernel_seconds"):  # a compiled step's timeline, all or none
        if (data[key] is None) == compiled:
            raise _Bad(key, "must be given for engine compiled" if compiled else "must be null for engine torch")
    if data["between_kernels"] is not None:
        _fields(data["between_kernels"], BETWEEN, "between_kernels.")
    _rows(data, "nodes", NODE)
    _rows(data, "modules", MODULE)
    _rows(data, "recipes", RECIPE)
    _rows(data, "slots", SLOT)
    _rows(data, "kernels", KERNEL, KERNEL_OPT)
    for i, c in enumerate(data["candidates"]):
        path = f"candidates[{i}]."
        extra = CANDIDATE_KIND.get(str(c.get("kind")), {}) if isinstance(c, dict) else {}
        _fields(
            c, {**CANDIDATE, **extra}, path, {"splits": lambda v: None if isinstance(v, list) else "must be a list"}
        )
        for j, s in enumerate(c.get("splits", [])):
            _fields(s, SPLIT, f"{path}splits[{j}].")
    if "fusion" in data:
        _fields(
            data["fusion"],
            {"engine": _str, "kernels": lambda v: None if isinstance(v, list) else "must be a list"},
            "fusion.",
        )
        _rows(data["fusion"], "kernels", {"kernel": _str, "nodes": _strs})


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k[:40]!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def parse_profile(text: str, where: str) -> ProfileReport:
    """A profile from its JSON text, checked (one-line UserError naming `where` and the field)."""
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        raise UserError(f"{where}: malformed JSON in profile: {str(e)[:200]}; {AGAIN}") from None
    except RecursionError:
        raise UserError(f"{where}: malformed JSON in profile: nested too deeply; {AGAIN}") from None
    try:
        check_profile(data)
    except _Bad as e:
        raise field_error(where, e.path, e.problem, AGAIN) from None
    except RecursionError:
        raise UserError(f"{where}: profile nested too deeply; {AGAIN}") from None
    return ProfileReport.from_dict(data)


def load_profile(path: Any) -> ProfileReport:
    """The profile at `path`, checked; a one-line UserError where it is not one this mcore writes."""
    return parse_profile(read_input_text(path, "profile"), str(path))
