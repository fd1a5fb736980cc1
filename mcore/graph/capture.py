"""Capture an engine role's graph with torch.export on the meta device (no weights needed)."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .. import __version__
from ..common.errors import UserError
from ..common.progress import NO_PROGRESS, Progress
from ..families import family_for_config
from ..families.base import Family, ModelSource, RoleIO
from ..families.graph_args import GraphArgs
from ..families.source import resolve_model
from ..model.buildargs import BuildArgs
from ..selection.recipes import annotate_recipes
from .from_export import snapshot_from_exported
from .snapshot import Snapshot


def tool_versions() -> dict[str, str]:
    """The versions that captured a graph: recorded in snapshots, bundles and sessions, never hashed
    into a fingerprint (a graph that really differs on another torch changes the hash by itself)."""
    return {"mcore": __version__, "torch": torch.__version__.split("+")[0]}


@dataclass
class Captured:
    source: ModelSource
    family: Family
    gargs: GraphArgs
    role: str
    io: RoleIO
    exported: torch.export.ExportedProgram
    snapshot: Snapshot


def resolve_role(family: Family, role: str) -> str:
    """The family's role for `role`. The tutorial captures DistilBERT with `--engine-role decode`: a
    family with one engine role takes `decode` as that role, so the tutorial's command works as
    printed and the snapshot records the real name. Any other unknown role is refused."""
    if role == "decode" and role not in family.roles and len(family.roles) == 1:
        return family.roles[0]
    check_role(family, role)
    return role


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


def graph_metadata(source: ModelSource, family: Family, gargs: GraphArgs, role: str) -> dict[str, Any]:
    return {
        "family": family.name,
        "model": source.spec,
        "revision": source.revision,
        "engine_role": role,
        "build_args": gargs.to_dict(),
        "config_sha256": config_sha256(source.config),
        "tool_versions": tool_versions(),
    }


def build_core(family: Family, config: dict, gargs: GraphArgs, device: Any) -> torch.nn.Module:
    """family.build_core, with a config.json that describes a model too large to build (a hidden size
    of 10**12) as a one-line error: built first on the meta device, which allocates nothing, then
    on `device` only when its weights fit that device's memory."""
    from ..bundle.contents import device_memory, state_bytes

    dims = "check its dimensions (hidden_size, intermediate_size, num_hidden_layers, vocab_size)"
    try:
        meta = family.build_core(config, gargs, "meta")
    except (RuntimeError, OverflowError, ValueError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"config.json: the model it describes cannot be built ({first}); {dims}") from None
    dev = torch.device(device)
    if dev.type == "meta":
        return meta
    need, have = state_bytes(meta), device_memory(dev)
    if need > have:
        raise UserError(
            f"config.json: the model's weights need {need / 2**30:.1f} GiB but {dev} has {have / 2**30:.1f} GiB; {dims}"
        )
    try:
        return family.build_core(config, gargs, dev)
    except (RuntimeError, MemoryError) as e:
        if isinstance(e, RuntimeError) and "memory" not in str(e) and "allocate" not in str(e):
            raise
        raise UserError(f"config.json: the model's weights ({need / 2**30:.1f} GiB) do not fit on {dev}") from None


def resolve(args: BuildArgs) -> tuple[ModelSource, Family, GraphArgs]:
    source = resolve_model(args.model, args.model_revision)
    family = family_for_config(source.config)
    gargs = family.graph_args(source.config, args)
    return source, family, gargs


def capture(
    args: BuildArgs,
    role: str,
    progress: Progress = NO_PROGRESS,
    resolved: tuple[ModelSource, Family, GraphArgs] | None = None,
) -> Captured:
    """Export the role's module on the meta device and turn it into a snapshot."""
    source, family, gargs = resolved or resolve(args)
    role = resolve_role(family, role)
    # what the graph is made from: the same in a process, the same graph (the family's code is this
    # process's); a second capture (a bundle built after the graph was browsed) copies the first
    key = ("capture", json.dumps(graph_metadata(source, family, gargs, role), sort_keys=True, default=str))
    ep = _kept_copy(key)
    if ep is None:
        progress.report(f"building {family.name} {role} graph module", 0.05)
        core = build_core(family, source.config, gargs, "meta")
        module = family.role_module(core, role)
        example, dynamic = family.example_inputs(source.config, gargs, role, "meta")
        progress.report(f"exporting {role} with torch.export", 0.2)
        with torch.no_grad():
            ep = torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)
        _keep(key, ep)
    progress.report("writing snapshot", 0.8)
    cap = captured_from(ep, source, family, gargs, role)
    progress.report("captured", 1.0)
    return cap


def captured_from(
    ep: torch.export.ExportedProgram, source: ModelSource, family: Family, gargs: GraphArgs, role: str
) -> Captured:
    """The snapshot of an exported role graph (fresh from torch.export, or loaded back from a cache)."""
    io = family.role_io(source.config, gargs, role)
    snap = snapshot_from_exported(ep, graph_metadata(source, family, gargs, role), list(io.inputs), list(io.outputs))
    annotate_recipes(snap, [r for r in family.recipes(source.config, gargs) if r.engine_role == role])
    return Captured(source, family, gargs, role, io, ep, Snapshot.from_dict(snap, f"captured {role} graph"))


def program_sha256(ep: torch.export.ExportedProgram) -> str:
    """The whole exported graph, scalar arguments included (an RMSNorm eps, a rope theta), with its
    signature (which name feeds which input) and its state's names, shapes and dtypes. A snapshot's
    fingerprint covers nodes and tensors, not scalar arguments: this is what a cached program is
    checked against after it loads."""
    state = [(k, tuple(v.shape), str(v.dtype)) for k, v in sorted(ep.state_dict.items())]
    text = "\n".join([str(ep.graph), str(ep.graph_signature), repr(state), repr(sorted(map(str, ep.constants)))])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def capture_cached(
    args: BuildArgs,
    role: str,
    fingerprint: str,
    resolved: tuple[ModelSource, Family, GraphArgs],
    save: bool = True,
) -> Captured:
    """capture(), reusing an ExportedProgram saved by an earlier load of the same graph on this machine.

    The cache folder must be safe (mcore/common/cache.py), and an entry counts only when its record says it
    was made from this fingerprint, role and tool versions, its file has the recorded sha256 (checked
    before torch.export.load unpickles anything), and the loaded program has the recorded whole-graph
    hash and a snapshot with exactly the expected fingerprint; else it is captured afresh and replaced.
    `save=False` where the engine keeps what it compiled without the graph (a precompiled role): saving
    the program costs half as much again as capturing it, for a file such an engine never reads."""
    from ..common import cache

    tag = "-".join(f"{k}{v}" for k, v in sorted(tool_versions().items()))
    folder = cache.cache_dir("exported")
    path = folder / f"{fingerprint}-{tag}.pt2"
    record = path.with_suffix(".json")
    made_from = {"fingerprint": fingerprint, "engine_role": role, "tool_versions": tool_versions()}
    cap = _load_cached(path, record, made_from, resolved, role, fingerprint)
    if cap is not None:
        return cap
    cap = capture(args, role, resolved=resolved)
    if save and cap.snapshot.fingerprint == fingerprint:
        try:
            cache.write_private(path, lambda p: torch.export.save(cap.exported, str(p)))
            cache.write_entry(record, made_from, {"program": path}, program_sha256=program_sha256(cap.exported))
        except Exception:  # the cache is a convenience; loading works without it
            pass
    return cap


def _load_cached(
    path: Any, record_path: Any, made_from: dict, resolved: tuple, role: str, fingerprint: str
) -> Captured | None:
    """The cached capture when its entry holds (see capture_cached), else None (with a note when one
    was there but did not hold)."""
    from ..common import cache

    record, why = cache.read_entry(record_path, made_from, {"program": path})
    if record is None:  # none, or one without a record (an older mcore's): captured afresh, unread
        if why is not None:
            cache.stale(f"{role} graph", path, why, "capturing")
        return None
    source, family, gargs = resolved
    try:
        ep = _load_program(path, record)
        if program_sha256(ep) != record.get("program_sha256"):
            why = "its graph differs from its record"
        else:
            cap = captured_from(ep, source, family, gargs, role)
            if cap.snapshot.fingerprint == fingerprint:
                return cap
            why = "its graph has another fingerprint"
    except Exception as e:  # noqa: BLE001 - unreadable or from another layout: capture again and replace it
        why = f"it does not load: {type(e).__name__}"
    cache.stale(f"{role} graph", path, why, "capturing")
    return None


# Programs this process has captured or loaded (the last few), by what they were made from: a process
# that needs the same role graph again (the workbench's capture, build, native, kernel-bound and
# reference pipelines; a gate's pair) exports or deserializes it once (about 1 and 2 s for the demo's
# decode graph on a CPU) and takes a copy each time, since the engines rewrite graphs in place.
# Captured on the meta device, a program holds no weights: a copy takes milliseconds.
_KEPT: OrderedDict[tuple[str, ...], torch.export.ExportedProgram] = OrderedDict()
_KEPT_MAX = 16
_KEPT_LOCK = threading.Lock()


def _copy(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    with warnings.catch_warnings():  # torch 2.13's pytree warns while an ExportedProgram is copied
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(ep)


def _kept_copy(key: tuple[str, ...]) -> torch.export.ExportedProgram | None:
    """A copy of the program kept under `key`, or None."""
    with _KEPT_LOCK:
        ep = _KEPT.get(key)
        if ep is not None:
            _KEPT.move_to_end(key)
    if ep is None:
        return None
    try:
        return _copy(ep)
    except Exception:  # noqa: BLE001 - a program this torch cannot copy is made afresh each time
        with _KEPT_LOCK:
            _KEPT.pop(key, None)
        return None


def _keep(key: tuple[str, ...], ep: torch.export.ExportedProgram) -> None:
    """Keep a pristine copy of `ep` (its caller goes on with `ep`). Not a program with weights in
    it, nor one this torch cannot copy."""
    if any(t.device.type != "meta" for t in ep.state_dict.values()):
        return
    try:
        kept = _copy(ep)
    except Exception:  # noqa: BLE001
        return
    with _KEPT_LOCK:
        _KEPT[key] = kept
        while len(_KEPT) > _KEPT_MAX:
            _KEPT.popitem(last=False)


def _load_program(path: Any, record: dict) -> torch.export.ExportedProgram:
    """torch.export.load of a cache entry that read_entry accepted, deserialized once a process."""
    key = ("file", str(path), str(record["files"]["program"]["sha256"]))
    ep = _kept_copy(key)
    if ep is None:
        ep = torch.export.load(str(path))
        _keep(key, ep)
    return ep
