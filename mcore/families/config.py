"""Reading config.json fields: one type and range check per kind of field, shared by every family.

A family reads each field it uses through these helpers, so a NaN epsilon, an infinite RoPE base,
`"tie_word_embeddings": "false"` (a string) or an unsupported value is a one-line error naming
the field, never a silently different model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..common.errors import UserError

_ABSENT = object()


def _bad(key: str, want: str, v: Any) -> UserError:
    return UserError(f"config.json: field {key!r} must be {want} (got {v!r}); fix config.json")


def cfg_int(config: dict, key: str, default: Any = _ABSENT, lo: int = 1) -> int:
    """An integer >= lo (booleans are not integers here)."""
    v = config.get(key, default)
    if v is _ABSENT or v is None or isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _bad(key, "a positive integer" if lo == 1 else f"an integer >= {lo}", None if v is _ABSENT else v)
    return v


def cfg_float(config: dict, key: str, default: Any = _ABSENT) -> float:
    """A finite number > 0 (epsilons, RoPE bases)."""
    v = config.get(key, default)
    if v is _ABSENT or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise _bad(key, "a finite positive number", None if v is _ABSENT else v)
    return float(v)


def cfg_bool(config: dict, key: str, default: bool) -> bool:
    """true or false as JSON booleans; a string such as "false" is an error, not a truthy value."""
    v = config.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(key, "true or false (a JSON boolean)", v)
    return v


def cfg_choice(config: dict, key: str, default: Any, supported: Iterable[Any], what: str) -> Any:
    """A field whose other values this family does not implement (an activation, an embedding type)."""
    v = config.get(key, default)
    allowed = list(supported)
    if v not in allowed:
        raise UserError(
            f"config.json: {key} {v!r} is not supported by {what}; it implements {', '.join(repr(a) for a in allowed)}"
        )
    return v
