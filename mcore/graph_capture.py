"""Capture an engine role's graph with torch.export on the meta device (no weights needed)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

import torch

from . import __version__
from .buildargs import BuildArgs
from .errors import UserError
from .families import family_for_config
from .families.base import Family, ModelSource, RoleIO
from .families.source import resolve_model
from .progress import NO_PROGRESS, Progress
from .recipes import annotate_recipes
from .graph.from_export import snapshot_from_exported
from .graph.snapshot import Snapshot


def tool_versions() -> dict[str, str]:
    """The versions that captured a graph: recorded in snapshots, bundles and sessions, never hashed
    into a fingerprint (a graph that really differs on another torch changes the hash by itself)."""
    return {"mcore": __version__, "torch": torch.__version__.split("+")[0]}


@dataclass
class Captured:
    source: ModelSource
    family: Family
    gargs: dict[str, Any]
    role: str
    io: RoleIO
    exported: torch.export.ExportedProgram
    snapshot: Snapshot


def check_role(family: Family, role: str) -> None:
    if role not in family.roles:
        raise UserError(
            f"engine role {role!r} does not exist for family {family.name}; use one of: {', '.join(family.roles)}"
        )


def config_sha256(config: dict) -> str:
    """The model's config.json, canonically hashed: part of the model identity a fingerprint covers."""
    # allow_nan: a config's unused fields may hold NaN; the family rejects those it uses.
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def graph_metadata(source: ModelSource, family: Family, gargs: dict[str, Any], role: str) -> dict[str, Any]:
    return {
        "family": family.name,
        "model": source.spec,
        "revision": source.revision,
        "engine_role": role,
        "build_args": gargs,
        "config_sha256": config_sha256(source.config),
        "tool_versions": tool_versions(),
    }


def resolve(args: BuildArgs) -> tuple[ModelSource, Family, dict[str, Any]]:
    source = resolve_model(args.model, args.model_revision)
    family = family_for_config(source.config)
    gargs = family.graph_args(source.config, args)
    return source, family, gargs


def capture(
    args: BuildArgs,
    role: str,
    progress: Progress = NO_PROGRESS,
    resolved: Optional[tuple[ModelSource, Family, dict[str, Any]]] = None,
) -> Captured:
    """Export the role's module on the meta device and turn it into a snapshot."""
    source, family, gargs = resolved or resolve(args)
    check_role(family, role)
    progress.report(f"building {family.name} {role} graph module", 0.05)
    core = family.build_core(source.config, gargs, "meta")
    module = family.role_module(core, role)
    example, dynamic = family.example_inputs(source.config, gargs, role, "meta")
    progress.report(f"exporting {role} with torch.export", 0.2)
    with torch.no_grad():
        ep = torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)
    progress.report("writing snapshot", 0.8)
    cap = captured_from(ep, source, family, gargs, role)
    progress.report("captured", 1.0)
    return cap


def captured_from(
    ep: torch.export.ExportedProgram, source: ModelSource, family: Family, gargs: dict[str, Any], role: str
) -> Captured:
    """The snapshot of an exported role graph (fresh from torch.export, or loaded back from a cache)."""
    io = family.role_io(source.config, gargs, role)
    snap = snapshot_from_exported(ep, graph_metadata(source, family, gargs, role), list(io.inputs), list(io.outputs))
    annotate_recipes(snap, [r for r in family.recipes(source.config, gargs) if r.engine_role == role])
    return Captured(source, family, gargs, role, io, ep, Snapshot.from_dict(snap, f"captured {role} graph"))


def capture_cached(
    args: BuildArgs,
    role: str,
    fingerprint: str,
    resolved: tuple[ModelSource, Family, dict[str, Any]],
    save: bool = True,
) -> Captured:
    """capture(), reusing an ExportedProgram saved by an earlier load of the same graph on this machine.

    A loaded program counts only if its snapshot has exactly the expected fingerprint (which covers the
    model, the role, the build args and every node and tensor), so a stale or foreign file is never used.
    `save=False` where the engine keeps what it compiled without the graph (a precompiled role): saving
    the program costs half as much again as capturing it, for a file such an engine never reads."""
    from .families.demo import cache_root
    from .fileio import atomic_write

    tag = "-".join(f"{k}{v}" for k, v in sorted(tool_versions().items()))
    path = cache_root() / "exported" / f"{fingerprint}-{tag}.pt2"
    source, family, gargs = resolved
    if path.is_file():
        try:
            cap = captured_from(torch.export.load(str(path)), source, family, gargs, role)
            if cap.snapshot.fingerprint == fingerprint:
                return cap
        except Exception:  # unreadable or from another layout: capture again and replace it
            pass
    cap = capture(args, role, resolved=resolved)
    if save and cap.snapshot.fingerprint == fingerprint:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda f: torch.export.save(cap.exported, f), binary=True)
        except Exception:  # the cache is a convenience; loading works without it
            pass
    return cap
