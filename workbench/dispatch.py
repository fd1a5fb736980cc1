"""Running an action by name: its params and the paths it names checked against its registry entry
(workbench/registry.py), then its function (workbench/actions.py) run. The TUI, replay, sessions
and the tests all run steps through here; it sits above both the registry and the actions, so
neither imports the other back.
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from pathlib import Path
from typing import Any

from mcore import UserError

from .actions import ActionContext, confine, parse_build_args
from .registry import REGISTRY
from .results import Record, result_json


def model_spec_where(spec: Any) -> str | None:
    """Why a model spec in a session names a folder outside the workdir, or None when it does not
    (demo: specs and hub IDs name no folder; a local folder must not be absolute or climb out)."""
    if not isinstance(spec, str) or spec.startswith("demo:"):
        return None
    if os.path.isabs(spec) or spec.startswith("~"):
        return f"{spec!r} is an absolute path"
    if ".." in Path(spec).parts:
        return f"{spec!r} leaves the workdir"
    return None


def check_step_paths(action: str, params: dict[str, Any], workdir: Path, where: str) -> None:
    """Every path a step names stays inside `workdir` (before anything runs); model specs too."""
    from mcore import check_path_text

    for name in REGISTRY[action].path_params:
        if params.get(name) is not None:
            if not isinstance(params[name], str) or not params[name].strip():
                raise UserError(f"{where}: field {name} must be a non-empty path string, got {params[name]!r}")
            check_path_text(params[name], f"{where}: field {name}")
            confine(workdir, params[name], f"{where}: field {name}")
    specs = {
        "build_args.model": (params.get("build_args") or {}).get("model")
        if isinstance(params.get("build_args"), dict)
        else None,
        "checkpoint": params.get("checkpoint") if action == "verify_reference" else None,
    }
    for name, spec in specs.items():
        if isinstance(spec, str):
            check_path_text(spec, f"{where}: field {name}")
        why = model_spec_where(spec)
        if why is not None:
            raise UserError(f"{where}: field {name}: {why}; a session names model folders inside its workdir")


def action_params(action: str) -> tuple[list[str], list[str]]:
    """(required, optional) param names of an action."""
    sig = inspect.signature(REGISTRY[action].fn)
    req: list[str] = []
    opt: list[str] = []
    for i, (name, p) in enumerate(sig.parameters.items()):
        if i == 0:
            continue  # ctx
        (req if p.default is inspect.Parameter.empty else opt).append(name)
    return req, opt


def check_params(action: str, params: Any, where: str) -> None:
    """Missing or unknown params fail with one line naming them."""
    from mcore import check_fields

    req, opt = action_params(action)
    check_fields(params, where, set(req), set(opt))


# what a param's annotation asks of its JSON value, in a message: (one, several)
_JSON_TYPES = {
    str: ("a string", "strings"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    bool: ("true or false", "true or false values"),
    dict: ("a JSON object", "JSON objects"),
    list: ("a JSON list", "JSON lists"),
    type(None): ("null", "nulls"),
}


def _choices(t: Any) -> tuple[Any, ...]:
    """X | Y -> (X, Y); any other annotation, list[X] included, stands alone."""
    return typing.get_args(t) if typing.get_origin(t) in (typing.Union, types.UnionType) else (t,)


def _fits(t: Any, v: Any) -> bool:
    """A JSON value against one choice: bool is not an integer here, an integer is a number, list[X] a list of X."""
    if typing.get_origin(t) is list:
        return isinstance(v, list) and all(_fits(typing.get_args(t)[0], x) for x in v)
    if t in (int, float) and isinstance(v, bool):
        return False
    return isinstance(v, (int, float)) if t is float else isinstance(v, t)


def _describe(t: Any) -> str:
    if typing.get_origin(t) is list:
        item = typing.get_args(t)[0]
        return f"a JSON list of {_JSON_TYPES.get(item, (None, getattr(item, '__name__', str(item))))[1]}"
    return _JSON_TYPES.get(t, (getattr(t, "__name__", str(t)),))[0]


def check_param_values(action: str, params: dict[str, Any], where: str) -> None:
    """Each param's JSON type against the action's own annotation, and build_args as `mcore build`
    parses them: a session edited into something the tool never recorded fails when it is read,
    before any step runs (what exists, such as a recipe or a kernel name, is the step's to say)."""
    hints = typing.get_type_hints(REGISTRY[action].fn)
    for name, v in params.items():
        t = hints.get(name)
        if t is not None and not any(_fits(c, v) for c in _choices(t)):
            kinds = " or ".join(_describe(c) for c in _choices(t))
            raise UserError(f"{where}: field {name} must be {kinds}, got {v!r}")
    if "build_args" in params:
        try:
            parse_build_args(params["build_args"])
        except UserError as e:
            raise UserError(f"{where}: {e}") from None


def perform_action(ctx: ActionContext, action: str, params: dict[str, Any]) -> tuple[Record | None, str | None]:
    """Run one action: (its typed result, None) on success, (None, error text) on a UserError.

    Cancellation (mcore.Cancelled) and programming errors propagate.
    """
    if action not in REGISTRY:
        raise UserError(f"unknown action {action!r}; known actions: {', '.join(REGISTRY)}")
    check_params(action, params, f"{action}: params")
    try:
        result = REGISTRY[action].fn(ctx, **params)
    except UserError as e:
        return None, ctx.error_text(e)
    return result, None


def run_action(ctx: ActionContext, action: str, params: dict[str, Any]) -> tuple[dict | None, str | None]:
    """`perform_action` with the result as a session records it (plain JSON)."""
    result, error = perform_action(ctx, action, params)
    return (None if result is None else result_json(result)), error
