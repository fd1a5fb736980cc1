"""Family recipes: named, versioned shortcuts for known manual selections.

At capture time each instance is resolved to exact node IDs (the nodes under the
instance's module path) and recorded in the snapshot. Selecting a recipe only looks
those values up and calls the same select_region() as a manual selection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..common.errors import UserError
from ..families.base import RecipeSpec
from ..graph.snapshot import RecipeRow, Snapshot, fingerprint
from .region import Receipt, select_region


def _nodes_under(snapshot: dict[str, Any], path: str) -> list[str]:
    return [n["id"] for n in snapshot["nodes"] if n["module_path"] == path or n["module_path"].startswith(path + ".")]


def annotate_recipes(snapshot: dict[str, Any], specs: Sequence[RecipeSpec]) -> None:
    """Record every recipe instance of this role with its exact node IDs (refingerprints). Runs on
    the capture's JSON, before it becomes a Snapshot."""
    rows = []
    for spec in specs:
        for instance, path in spec.instances:
            if instance == ALL_INSTANCES:  # reserved: it names every instance at build time
                raise RuntimeError(f"recipe {spec.id}: an instance may not be named {ALL_INSTANCES}")
            node_ids = _nodes_under(snapshot, path)
            if not node_ids:
                raise RuntimeError(f"recipe {spec.id} instance {instance}: no graph nodes under {path}")
            rows.append(
                {
                    "id": spec.id,
                    "instance": instance,
                    "engine_role": spec.engine_role,
                    "description": spec.description,
                    "module_path": path,
                    "node_ids": node_ids,
                    "workspace_bytes": spec.workspace_bytes,
                    "extra_args": list(spec.extra_args),
                    "output_shape_input": spec.output_shape_input,
                }
            )
    snapshot["recipes"] = rows
    snapshot["fingerprint"] = fingerprint(snapshot)


# The functions below take a Snapshot, or its JSON (hand-made graphs, scripts), checked first.
SnapshotLike = Snapshot | Mapping[str, Any]


def recipe_rows(snapshot: SnapshotLike) -> list[RecipeRow]:
    return list(Snapshot.of(snapshot).recipe_rows)


def find_recipe(snapshot: SnapshotLike, recipe_id: str, instance: str) -> RecipeRow:
    """The one row for (recipe, instance); never guesses the first or every match."""
    snapshot = Snapshot.of(snapshot)
    rows = recipe_rows(snapshot)
    role = snapshot.engine_role
    ids = sorted({r.id for r in rows})
    if recipe_id not in ids:
        known = ", ".join(ids) or "none"
        raise UserError(
            f"recipe {recipe_id!r} is not published for the {role} role of this model (recipes: {known}); "
            "list them with `mcore graph recipes SNAPSHOT`"
        )
    for r in rows:
        if r.id == recipe_id and r.instance == instance:
            return r
    examples = [r.instance for r in rows if r.id == recipe_id][:3]
    raise UserError(
        f"recipe {recipe_id} has no instance {instance!r} (e.g. {', '.join(examples)}); "
        "name one exact instance from `mcore graph recipes`"
    )


# The one explicit way to name every instance of a recipe (`mcore build --recipe ID all-instances`).
# Instances are module paths (dotted), so this literal can never be one of them.
ALL_INSTANCES = "all-instances"


def expand_instances(snapshot: SnapshotLike, recipe_id: str, instances: Sequence[str]) -> list[str]:
    """The instances a build names, in the order given; `all-instances` alone means every instance of
    the recipe in graph order. Never a silent default: at least one instance must be named."""
    if not instances:
        raise UserError(f"recipe {recipe_id}: name at least one instance, or {ALL_INSTANCES} for every one")
    if ALL_INSTANCES in instances:
        if len(instances) > 1:
            raise UserError(f"recipe {recipe_id}: {ALL_INSTANCES} already names every instance; give it alone")
        every = [r.instance for r in recipe_rows(snapshot) if r.id == recipe_id]
        if not every:
            find_recipe(snapshot, recipe_id, ALL_INSTANCES)  # raises: the recipe is not published here
        return every
    seen: set[str] = set()
    for inst in instances:
        if inst in seen:
            raise UserError(f"recipe {recipe_id}: instance {inst} is named twice; name each instance once")
        seen.add(inst)
    return list(instances)


def select_recipe(
    snapshot: SnapshotLike,
    recipe_id: str,
    instance: str,
    binding_id: str | None = None,
    workspace_bytes: int | None = None,
) -> Receipt:
    """Resolve a recipe instance and validate it exactly like a manual selection. `workspace_bytes`
    replaces the recipe's own (a kernel that needs scratch declares it; the ABI hash covers it)."""
    snapshot = Snapshot.of(snapshot)
    r = find_recipe(snapshot, recipe_id, instance)
    return select_region(
        snapshot,
        r.node_ids,
        binding_id or recipe_id,
        r.workspace_bytes if workspace_bytes is None else workspace_bytes,
        r.extra_args,
        r.output_shape_input,
        recipe={"id": recipe_id, "instance": instance},
    )


def select_recipe_instances(
    snapshot: SnapshotLike, recipe_id: str, instances: Sequence[str], workspace_bytes: int | None = None
) -> list[Receipt]:
    """One receipt per named instance, each from select_recipe(). They become slots of one binding
    (same binding ID), so they must share one ABI: a bindings manifest lists a binding ID once."""
    snapshot = Snapshot.of(snapshot)
    receipts = [
        select_recipe(snapshot, recipe_id, inst, workspace_bytes=workspace_bytes)
        for inst in expand_instances(snapshot, recipe_id, instances)
    ]
    first = receipts[0]
    for r in receipts[1:]:
        if r.abi_sha256 != first.abi_sha256:
            raise UserError(
                f"recipe {recipe_id}: instance {r.instance} has ABI {r.abi_sha256[:16]}… but "
                f"{first.instance} has {first.abi_sha256[:16]}…; one binding serves slots of "
                "one ABI, so build these instances into separate bundles"
            )
    return receipts
