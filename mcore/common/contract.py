"""What every typed contract (snapshot, receipt, slot record, manifests) shares: field checks that
fail with one line naming the file and the field.

Each contract is a frozen dataclass parsed and checked once by ``from_dict(data, where)`` and
written by one ``to_dict()``; code reads its attributes, never the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import UserError

RECAPTURE = "recreate the file with mcore"


def field_error(where: str, name: str, problem: str, todo: str = RECAPTURE) -> UserError:
    """The one error shape: "FILE: field NAME PROBLEM; WHAT TO DO"."""
    return UserError(f"{where}: field {name} {problem}; {todo}")


def check_kind(data: Mapping[str, Any], where: str, kind: str, version: int, what: str, source: str, todo: str) -> None:
    """The file says what it is (kind) and which schema it follows, before any field is read. Called
    before the fields are checked too: a file of another kind (a receipt given for a snapshot) is named
    as such, not as a list of the fields it lacks; a missing kind or version is left to check_fields."""
    if not isinstance(data, Mapping) or "kind" not in data:
        return
    if data["kind"] != kind:
        raise UserError(f"{where}: kind is {data['kind']!r}, not {what}; pass {source}")
    if "schema_version" not in data:
        return
    if not is_int(data["schema_version"]) or data["schema_version"] != version:  # true == 1 in Python
        raise UserError(
            f"{where}: schema_version {data['schema_version']!r} is not supported (expected {version})"
            + (f"; {todo}" if todo else "")
        )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def need_str(d: Mapping[str, Any], key: str, where: str, todo: str = RECAPTURE, *, path: str = "") -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise field_error(where, path + key, "must be a string", todo)
    return v


def need_opt_str(d: Mapping[str, Any], key: str, where: str, todo: str = RECAPTURE, *, path: str = "") -> str | None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise field_error(where, path + key, "must be a string or null", todo)
    return v


def need_bool(d: Mapping[str, Any], key: str, where: str, todo: str = RECAPTURE, *, path: str = "") -> bool:
    v = d.get(key)
    if not isinstance(v, bool):
        raise field_error(where, path + key, "must be true or false", todo)
    return v


def need_int(
    d: Mapping[str, Any],
    key: str,
    where: str,
    todo: str = RECAPTURE,
    *,
    path: str = "",
    lo: int | None = None,
    hi: int | None = None,
) -> int:
    v: Any = d.get(key)
    if not is_int(v):
        raise field_error(where, path + key, "must be an integer", todo)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f"{lo if lo is not None else '...'}..{hi if hi is not None else '...'}"
        raise field_error(where, path + key, f"is {v}, out of range {span}", todo)
    return v


def need_strs(d: Mapping[str, Any], key: str, where: str, todo: str = RECAPTURE, *, path: str = "") -> tuple[str, ...]:
    v = d.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise field_error(where, path + key, "must be a list of strings", todo)
    return tuple(v)


def need_dict(d: Mapping[str, Any], key: str, where: str, todo: str = RECAPTURE, *, path: str = "") -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise field_error(where, path + key, "must be an object", todo)
    return v


def json_form(value: Any) -> Any:
    """Tuples (how contracts hold sequences) back to the lists JSON has."""
    if isinstance(value, tuple):
        return [json_form(v) for v in value]
    return value
