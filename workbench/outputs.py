"""The overwrite rule as the workbench applies it. The rule itself is mcore's `check_overwrite`: an
output never replaces anything but a regular file, and a regular file only when told to. Every
action that writes a file takes `overwrite` (false by default) and names its outputs in the
registry (`ActionSpec.output_params`); the TUI asks before it passes `overwrite: true`, and a
session is never saved over one of its own artifacts. Names the screens choose themselves are
fresh (`fresh_name`), so re-running a gate or a kernel build asks nothing and replaces nothing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .screens.guide import GuideState
    from .session import Session
    from .state import WorkbenchState


def is_regular_file(p: Path) -> bool:
    """A regular file, not through a symlink (a link or a device is refused by the action itself)."""
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def taken_outputs(action: str, params: dict[str, Any], state: WorkbenchState) -> list[str]:
    """The outputs of a step that would replace an existing regular file (empty with overwrite)."""
    from .registry import REGISTRY

    spec = REGISTRY.get(action)
    if spec is None or params.get("overwrite"):
        return []
    names = [params.get(k) for k in spec.output_params]
    return [str(v) for v in names if isinstance(v, str) and v.strip() and is_regular_file(state.path(v))]


def fresh_name(state: WorkbenchState, name: str) -> str:
    """`name` when nothing is there yet, else name-2.ext, name-3.ext, ... (relative to the work folder)."""
    p = Path(name)
    stem, suffix = (p.name.split(".", 1) + [""])[:2]
    n, out = 1, name
    while os.path.lexists(state.path(out)):
        n += 1
        out = str(p.with_name(f"{stem}-{n}" + (f".{suffix}" if suffix else "")))
    return out


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def artifact_owner(
    target: Path, state: WorkbenchState, session: Session | None, guide: GuideState | None
) -> str | None:
    """Which recorded step wrote or read `target` ("step 3 (generate)"), or None: a session file is
    never saved over the artifacts its own steps name."""
    sources = [s for s in (session, guide.session if guide else None) if s is not None]
    want = target.resolve()
    for sess in sources:
        for i, step in enumerate(sess.steps, 1):
            for v in _strings([step.params, step.results]):
                if "/" in v or "." in v:
                    try:
                        if state.path(v).resolve() == want:
                            return f"step {i} ({step.action})"
                    except (OSError, ValueError):
                        continue
    return None
