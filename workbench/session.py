"""Sessions: an ordered list of recorded workbench steps with a header (DESIGN.md §9).

File format (docs/workbench-actions.md)::

    {"schema_version": 1, "kind": "mcore.workbench_session",
     "header": {"title", "created", "tool_versions", "machine", "guided"[, "name", "description"]},
     "steps": [{"action", "params", "results", "status", "error"[, "guide"][, "requires"]}]}

A step with `"requires": "cuda"` runs only where CUDA is; made on a machine without it, it is
recorded with status "not_run" (no results to compare: a replay with CUDA checks that it runs and
that its gate passes); replayed without CUDA, it is skipped with a note.

Loading is strict: a missing or unknown field, a wrong schema, an unknown action or a
parameter the action does not take fails with one line naming the file, the step and the
field. Saving is atomic (temp file, then rename).
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcore import UserError, check_fields, read_json, write_json

SESSION_SCHEMA_VERSION = 1
SESSION_KIND = "mcore.workbench_session"

_TOP_FIELDS = {"schema_version", "kind", "header", "steps"}
_HEADER_REQUIRED = {"title", "created", "tool_versions", "machine", "guided"}
_HEADER_OPTIONAL = {"name", "description"}
_STEP_REQUIRED = {"action", "params", "results", "status", "error"}
_STEP_OPTIONAL = {"guide", "requires"}
_GUIDE_REQUIRED = {"title", "text"}
STATUSES = ("ok", "error", "not_run")
REQUIREMENTS = ("cuda",)
NOT_RUN = "made on a machine without CUDA"


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def tool_versions() -> dict[str, str]:
    """Versions of the tools a session's results depend on (read without importing them)."""
    import mcore

    out = {"mcore": mcore.__version__}
    for key, dist in (("torch", "torch"), ("textual", "textual"), ("tvm_ffi", "apache-tvm-ffi")):
        v = _dist_version(dist)
        if v is not None:
            out[key] = v.split("+")[0]
    out["python"] = platform.python_version()
    return out


def machine_info(device: str | None = None) -> dict[str, str]:
    if device is None:
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:  # noqa: BLE001 - the header is informative only
            device = "cpu"
    return {"platform": platform.platform(), "machine": platform.machine(), "device": device}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _check_json_value(value: Any, where: str) -> None:
    """Params and results must be plain JSON (no NaN/inf, string keys)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{where}: non-finite number {value!r} is not valid JSON")
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_json_value(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise UserError(f"{where}: key {k!r} is not a string")
            _check_json_value(v, f"{where}.{k}")
        return
    raise UserError(f"{where}: {type(value).__name__} is not a JSON value")


@dataclass
class Step:
    action: str
    params: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"
    error: str | None = None
    guide: dict[str, str] | None = None
    requires: str | None = None  # "cuda": runs only where CUDA is

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "action": self.action,
            "params": copy.deepcopy(self.params),
            "results": copy.deepcopy(self.results),
            "status": self.status,
            "error": self.error,
        }
        if self.guide is not None:
            d["guide"] = dict(self.guide)
        if self.requires is not None:
            d["requires"] = self.requires
        return d

    @property
    def title(self) -> str:
        return (self.guide or {}).get("title") or self.action


def check_guide(guide: Any, where: str) -> dict[str, str] | None:
    if guide is None:
        return None
    check_fields(guide, f"{where}: guide", _GUIDE_REQUIRED)
    for k in sorted(_GUIDE_REQUIRED):
        if not isinstance(guide[k], str):
            raise UserError(f"{where}: guide.{k} must be a string")
    return {"title": guide["title"], "text": guide["text"]}


def check_step(d: Any, where: str) -> Step:
    """Validate one step dict (where = 'FILE: step N') and return it as a Step."""
    from .dispatch import check_param_values, check_params
    from .registry import REGISTRY, VERDICTS

    check_fields(d, where, _STEP_REQUIRED, _STEP_OPTIONAL)
    action = d["action"]
    if not isinstance(action, str) or action not in REGISTRY:
        raise UserError(f"{where}: unknown action {action!r}; known actions: {', '.join(REGISTRY)}")
    where = f"{where} ({action})"
    if not isinstance(d["params"], dict):
        raise UserError(f"{where}: params must be a JSON object")
    check_params(action, d["params"], f"{where}: params")
    _check_json_value(d["params"], f"{where}: params")
    if not isinstance(d["results"], dict):
        raise UserError(f"{where}: results must be a JSON object")
    _check_json_value(d["results"], f"{where}: results")
    verdict = d["results"].get("verdict")
    if REGISTRY[action].gate and verdict is not None and verdict not in VERDICTS:
        raise UserError(f"{where}: results.verdict {verdict!r} must be one of {', '.join(VERDICTS)}")
    status = d["status"]
    if status not in STATUSES:
        raise UserError(f"{where}: status {status!r} must be one of {', '.join(STATUSES)}")
    err = d["error"]
    if status == "ok" and err is not None:
        raise UserError(f"{where}: error must be null when status is ok")
    if status == "error" and (not isinstance(err, str) or not err):
        raise UserError(f"{where}: error must be the recorded error text when status is error")
    requires = d.get("requires")
    if requires is not None and requires not in REQUIREMENTS:
        raise UserError(f"{where}: requires {requires!r} must be one of {', '.join(REQUIREMENTS)}")
    if status == "not_run" and (requires is None or d["results"] or not isinstance(err, str)):
        raise UserError(
            f"{where}: status not_run is for a step that requires what the recording machine lacked; "
            "it has empty results and says why in error"
        )
    if status != "error":  # a step that failed may hold what a user typed wrong; it replays as that error
        check_param_values(action, d["params"], f"{where}: params")
    guide = check_guide(d.get("guide"), where)
    return Step(action, dict(d["params"]), dict(d["results"]), status, err, guide, requires)


def check_header(h: Any, where: str) -> dict[str, Any]:
    w = f"{where}: header"
    check_fields(h, w, _HEADER_REQUIRED, _HEADER_OPTIONAL)
    for k in ("title", "created") + tuple(k for k in _HEADER_OPTIONAL if k in h):
        if not isinstance(h[k], str):
            raise UserError(f"{w}.{k} must be a string")
    if not isinstance(h["guided"], bool):
        raise UserError(f"{w}.guided must be true or false")
    for k in ("tool_versions", "machine"):
        if not isinstance(h[k], dict) or not all(isinstance(v, str) for v in h[k].values()):
            raise UserError(f"{w}.{k} must be an object of strings")
    return dict(h)


class Session:
    """An ordered list of steps plus a header. `record()` appends; `save()` writes atomically."""

    def __init__(self, header: dict[str, Any], steps: list[Step] | None = None, path: Path | None = None):
        self.header = header
        self.steps: list[Step] = list(steps or [])
        self.path = path

    # ------------------------------------------------------------ create / load / save
    @classmethod
    def new(
        cls,
        title: str,
        guided: bool = False,
        device: str | None = None,
        name: str | None = None,
        description: str | None = None,
    ) -> Session:
        header: dict[str, Any] = {
            "title": title,
            "created": _now(),
            "tool_versions": tool_versions(),
            "machine": machine_info(device),
            "guided": bool(guided),
        }
        if name is not None:
            header["name"] = name
        if description is not None:
            header["description"] = description
        return cls(header)

    @classmethod
    def from_dict(cls, data: Any, where: str = "session") -> Session:
        check_fields(data, where, _TOP_FIELDS)
        if data["kind"] != SESSION_KIND:
            raise UserError(f"{where}: kind is {data['kind']!r}, not a workbench session ({SESSION_KIND})")
        sv = data["schema_version"]
        if isinstance(sv, bool) or sv != SESSION_SCHEMA_VERSION:
            raise UserError(f"{where}: schema_version {sv!r} is not supported (expected {SESSION_SCHEMA_VERSION})")
        header = check_header(data["header"], where)
        if not isinstance(data["steps"], list):
            raise UserError(f"{where}: steps must be a list of steps")
        steps = [check_step(s, f"{where}: step {i + 1}") for i, s in enumerate(data["steps"])]
        return cls(header, steps)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Session:
        path = Path(path)
        s = cls.from_dict(read_json(path, "workbench session"), str(path))
        s.path = path
        return s

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SESSION_SCHEMA_VERSION,
            "kind": SESSION_KIND,
            "header": copy.deepcopy(self.header),
            "steps": [s.to_dict() for s in self.steps],
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise UserError("no session file given; choose where to save the session")
        data = self.to_dict()
        Session.from_dict(json.loads(json.dumps(data)), str(target))  # never write what we could not load
        out = write_json(target, data)
        self.path = out
        return out

    # ------------------------------------------------------------ recording
    def record(
        self,
        action: str,
        params: dict[str, Any],
        results: dict[str, Any] | None = None,
        error: str | BaseException | None = None,
        guide: dict[str, str] | None = None,
        requires: str | None = None,
        not_run: bool = False,
    ) -> Step:
        """Append a step: `results` for a success, or `error` (text or the UserError) for a failure;
        `not_run` for a step that `requires` what this machine lacks."""
        d: dict[str, Any]
        if not_run:
            d = {"action": action, "params": params, "results": {}, "status": "not_run", "error": NOT_RUN}
        elif error is not None:
            text = str(error)
            d = {
                "action": action,
                "params": params,
                "results": dict(results or {}),
                "status": "error",
                "error": text or type(error).__name__,
            }
        else:
            d = {"action": action, "params": params, "results": dict(results or {}), "status": "ok", "error": None}
        if guide is not None:
            d["guide"] = guide
        if requires is not None:
            d["requires"] = requires
        step = check_step(json.loads(json.dumps(d)), f"session step {len(self.steps) + 1}")
        self.steps.append(step)
        return step

    # ------------------------------------------------------------ convenience
    @property
    def title(self) -> str:
        return self.header.get("title", "")

    @property
    def guided(self) -> bool:
        return bool(self.header.get("guided"))

    def __len__(self) -> int:
        return len(self.steps)


# ---------------------------------------------------------------- shipped tutorials

TUTORIAL_ORDER = ("qwen-recipe", "qwen-attention", "qwen-manual", "distilbert-residual")


def tutorials_dir() -> Path:
    """$WORKBENCH_SESSIONS_DIR, else sessions/ beside the workbench package (the repository's)."""
    env = os.environ.get("WORKBENCH_SESSIONS_DIR")
    return Path(env).expanduser() if env else Path(__file__).resolve().parent.parent / "sessions"


def list_tutorials() -> list[tuple[str, str, Path]]:
    """(name, title, path) of every shipped session, the guided tutorials first in teaching order."""
    d = tutorials_dir()
    if not d.is_dir():
        raise UserError(
            f"tutorial sessions folder {d} not found; run from a checkout of the repository "
            "or set WORKBENCH_SESSIONS_DIR"
        )
    paths = sorted(d.glob("*.json"))
    rank = {n: i for i, n in enumerate(TUTORIAL_ORDER)}
    paths.sort(key=lambda p: (rank.get(p.stem, len(rank)), p.stem))
    out = []
    for p in paths:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            title = data["header"]["title"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            title = "(unreadable session)"
        out.append((p.stem, str(title), p))
    return out


def find_tutorial(name: str) -> Path:
    """The shipped session file for tutorial `name` (e.g. qwen-recipe)."""
    known = list_tutorials()
    for n, _, p in known:
        if n == name:
            return p
    names = ", ".join(n for n, _, _ in known) or "none"
    raise UserError(f"no tutorial named {name!r}; available: {names} (see `workbench tutorial --list`)")
