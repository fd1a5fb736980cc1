"""`build`: capture every role, resolve the selection (recipe or --graph-patch receipt), and write
a self-contained bundle (plus the receipt beside it). One implementation for the CLI and the TUI."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..common.devices import parse_device
from ..common.errors import UserError
from ..common.fileio import check_overwrite, read_json, write_json
from ..common.progress import NO_PROGRESS, Progress
from ..families.base import Family, ModelSource
from ..families.graph_args import GraphArgs
from ..graph.capture import Captured, build_core, capture, resolve, tool_versions
from ..model.buildargs import BuildArgs
from ..selection.patch import check_receipt_against
from ..selection.receipt import Receipt, check_workspace
from ..selection.recipes import ALL_INSTANCES, select_recipe_instances
from .container import write_bundle
from .manifest import BUNDLE_KIND, BUNDLE_SCHEMA_VERSION, BundleManifest


@dataclass
class BuildResult:
    bundle_path: Path
    receipt_path: Path | None  # the first receipt written (the only one for one slot)
    receipt: Receipt | None  # the first slot's receipt
    manifest: BundleManifest
    receipts: list[Receipt] = field(default_factory=list)  # one per slot, in slot order
    receipt_paths: list[Path] = field(default_factory=list)  # written beside the bundle (recipe builds)


# What resolve() gives: the model source, its family and the family's graph args.
Resolved = tuple[ModelSource, Family, GraphArgs]


def receipt_path_for(bundle_path: Path, instance: str | None = None) -> Path:
    """qwen3-slot-ready.bundle -> qwen3-slot-ready.selection.json (as the tutorial names it).

    A build of several recipe instances writes one receipt per slot instead, named for its
    instance: X.selection.decoder.layers.0.decode_attention.json. Each is a complete receipt
    (usable with --graph-patch and `mcore kernel stub`); they share binding ID and abi_sha256."""
    name = bundle_path.name
    stem = name[: -len(".bundle")] if name.endswith(".bundle") else bundle_path.stem
    return bundle_path.with_name(f"{stem}.selection.{instance}.json" if instance else f"{stem}.selection.json")


def _weights_member(core: torch.nn.Module) -> tuple[bytes, dict[str, str], dict[str, str]]:
    """Serialize the core's state; tied tensors are stored once and recorded as aliases. Also the
    sha256 of each stored tensor (tensor_sha256), which `verify reference` compares with the
    checkpoint's."""
    from safetensors.torch import save

    kept, aliases = stored_state(core)
    return save(dict(sorted(kept.items()))), aliases, {n: tensor_sha256(t) for n, t in sorted(kept.items())}


def tensor_sha256(t: torch.Tensor) -> str:
    """A tensor's identity: dtype, shape and bytes (on the CPU, contiguous)."""
    import hashlib

    from ..families.weights import dtype_name

    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{dtype_name(t.dtype)}{list(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # the bytes, not a copy
    return h.hexdigest()


def stored_state(core: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(the tensors a bundle stores, aliases): tied tensors once, the others named as aliases."""
    seen: dict[tuple, str] = {}
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in core.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), t.dtype, t.device)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = t.detach().contiguous().cpu()
    return kept, aliases


def build_bundle(
    args: BuildArgs,
    output: str | Path,
    recipe: tuple[str, ...] | None = None,
    graph_patch: str | Path | None = None,
    device: str | None = None,
    progress: Progress = NO_PROGRESS,
    workspace_bytes: int | None = None,
    overwrite: bool = False,
) -> BuildResult:
    """`recipe` is (RECIPE_ID, INSTANCE, ...): each instance becomes its own slot of the one binding
    (recipes.ALL_INSTANCES names every instance). `workspace_bytes` replaces the recipe's workspace.
    The bundle and its receipts replace existing files only with `overwrite` (checked before the
    captures for the bundle and a single receipt, once the instances are known for several)."""
    _check_options(recipe, graph_patch, workspace_bytes)
    parse_device(device)  # recorded for the bundle's runs: a name no run could use fails here, not there
    output = check_overwrite(output, overwrite)
    if recipe and len(recipe) == 2 and recipe[1] != ALL_INSTANCES:
        check_overwrite(receipt_path_for(output, None), overwrite)
    source, family, gargs = resolve(args)
    if recipe:  # the family's recipes are known before any role is captured
        known = {r.id for r in family.recipes(source.config, gargs)}
        if recipe[0] not in known:
            raise _unpublished(recipe[0], known)
    receipt_file = _read_graph_patch(graph_patch, family) if graph_patch else None
    caps = _capture_roles(args, (source, family, gargs), progress)
    receipts: list[Receipt] = []
    if recipe:
        receipts = _recipe_receipts(caps, recipe, workspace_bytes, output, overwrite)
    elif receipt_file is not None:
        receipts = [check_receipt_against(receipt_file, caps[receipt_file.engine_role].snapshot, str(graph_patch))]
    progress.report("loading weights", 0.6)
    members, weights, embedding_default = _model_members(args, source, family, gargs)
    progress.check()
    manifest = _manifest(args, output, device, (source, family, gargs), caps, receipts, weights, embedding_default)
    progress.report("writing bundle", 0.8)
    # the writer reports 0..1 over its members; here that is the build's last stretch, not a restart at 0%
    path = write_bundle(output, manifest.to_dict(), members, progress=progress.part(0.8, 0.99))
    receipt_paths: list[Path] = []
    if recipe:  # a --graph-patch build's receipt is already on disk
        for r in receipts:
            p = receipt_path_for(output, r.instance if len(receipts) > 1 else None)
            write_json(p, r.to_dict())
            receipt_paths.append(p)
    progress.report("bundle written", 1.0)
    return BuildResult(
        path,
        receipt_paths[0] if receipt_paths else None,
        receipts[0] if receipts else None,
        manifest,
        receipts,
        receipt_paths,
    )


def _check_options(recipe: tuple[str, ...] | None, graph_patch: str | Path | None, workspace_bytes: int | None) -> None:
    """The option combinations, before anything is read or captured."""
    if recipe and graph_patch:
        raise UserError("give either --recipe or --graph-patch, not both")
    if workspace_bytes is not None and not recipe:
        raise UserError(
            "--workspace-bytes applies to --recipe builds; a --graph-patch receipt carries its own "
            "(select with `mcore graph select ... --workspace-bytes N`)"
        )
    if workspace_bytes is not None:  # before the captures: a bad value fails fast
        check_workspace(workspace_bytes)
    if recipe is not None and len(recipe) < 2:
        raise UserError("--recipe needs RECIPE_ID and at least one INSTANCE (or all-instances)")


def _read_graph_patch(graph_patch: str | Path, family: Family) -> Receipt:
    """Read and check the receipt file before the (slower) captures."""
    receipt_file = Receipt.from_dict(read_json(graph_patch, "selection receipt"), str(graph_patch))
    if receipt_file.engine_role not in family.roles:
        raise UserError(
            f"{graph_patch}: engine role {receipt_file.engine_role!r} does not exist for family "
            f"{family.name} (roles: {', '.join(family.roles)}); select on a snapshot of this model"
        )
    return receipt_file


def _capture_roles(args: BuildArgs, resolved: Resolved, progress: Progress) -> dict[str, Captured]:
    """Capture every role of the family; each role's progress fills its share of 5%..55%."""
    family = resolved[1]
    caps: dict[str, Captured] = {}
    for i, role in enumerate(family.roles):

        def report(s: str, f: float, i: int = i, role: str = role) -> None:
            progress.report(f"[{role}] {s}", 0.05 + 0.5 * (i + f) / len(family.roles))

        sub = Progress(report, progress.token)
        caps[role] = capture(args, role, sub, resolved=resolved)
    return caps


def _recipe_receipts(
    caps: dict[str, Captured],
    recipe: tuple[str, ...],
    workspace_bytes: int | None,
    output: Path,
    overwrite: bool,
) -> list[Receipt]:
    """One receipt per recipe instance, selected on the role that publishes the recipe."""
    rid, *instances = recipe
    role = _recipe_role(caps, rid)
    receipts = select_recipe_instances(caps[role].snapshot, rid, instances, workspace_bytes)
    for r in receipts:  # before the weights load and anything is written
        check_overwrite(receipt_path_for(output, r.instance if len(receipts) > 1 else None), overwrite)
    return receipts


def _model_members(
    args: BuildArgs, source: ModelSource, family: Family, gargs: GraphArgs
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(the bundle's model members, the manifest's weights entry, the sentence-embedding default):
    config, tokenizer (checked by loading it) and, for checkpoint weights, the stored tensors."""
    members: dict[str, Any] = {"config.json": json.dumps(source.config, indent=2, sort_keys=True).encode()}
    from ..model.pooling import sentence_embedding
    from ..model.tokenization import TOKENIZER_CONFIG, TOKENIZER_JSON, TextTokenizer, read_tokenizer_files

    if source.path is None:
        raise UserError(f"{source.spec}: no model folder, so no tokenizer.json")
    tok_json, tok_config = read_tokenizer_files(Path(source.path))
    TextTokenizer(tok_json, tok_config, source.config.get("model_type", ""), f"{source.path}/{TOKENIZER_JSON}")
    # Stored as the checkpoint has them; the pipeline configures them as transformers does.
    members[TOKENIZER_JSON] = tok_json.encode("utf-8")
    members[TOKENIZER_CONFIG] = json.dumps(tok_config, indent=2, sort_keys=True).encode("utf-8")
    embedding_default = sentence_embedding(Path(source.path)) if family.kind == "encoder" else None
    weights: dict[str, Any]
    if args.weights == "random":
        weights = {"kind": "random", "seed": args.seed}
    else:
        core = build_core(family, source.config, gargs, "cpu")
        family.load_checkpoint(core, source)
        blob, aliases, digests = _weights_member(core)
        members["weights.safetensors"] = blob
        weights = {"kind": "checkpoint", "member": "weights.safetensors", "aliases": aliases, "tensor_sha256": digests}
    return members, weights, embedding_default


def _manifest(
    args: BuildArgs,
    output: Path,
    device: str | None,
    resolved: Resolved,
    caps: dict[str, Captured],
    receipts: list[Receipt],
    weights: dict[str, Any],
    embedding_default: Any,
) -> BundleManifest:
    """The bundle's manifest, checked as a reader would check it: never write what could not run."""
    from ..families.source import special_tokens

    source, family, gargs = resolved
    manifest_json = {
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "kind": BUNDLE_KIND,
        "engine": "torch",
        "family": family.name,
        "family_kind": family.kind,
        "model": {"spec": source.spec, "revision": source.revision},
        "build_args": args.to_dict(),
        "graph_args": gargs.to_dict(),
        "device": device,
        "roles": {
            r: {"fingerprint": c.snapshot.fingerprint, "inputs": list(c.io.inputs), "outputs": list(c.io.outputs)}
            for r, c in caps.items()
        },
        "kernel_slots": [r.slot().to_dict() for r in receipts],
        "weights": weights,
        "special_tokens": special_tokens(source),
        "sentence_embedding": embedding_default,
        "tool_versions": tool_versions(),
        "built_on": {"python": platform.python_version(), "machine": platform.machine()},
    }
    return BundleManifest.from_dict(manifest_json, str(output))


def _recipe_role(caps: dict[str, Captured], recipe_id: str) -> str:
    for role, cap in caps.items():
        if any(r.id == recipe_id for r in cap.snapshot.recipe_rows):
            return role
    raise _unpublished(recipe_id, {r.id for c in caps.values() for r in c.snapshot.recipe_rows})


def _unpublished(recipe_id: str, known: set[str]) -> UserError:
    return UserError(
        f"recipe {recipe_id!r} is not published for this model (recipes: {', '.join(sorted(known)) or 'none'}); "
        "list them with `mcore graph recipes SNAPSHOT`"
    )
