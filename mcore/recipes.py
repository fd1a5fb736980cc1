"""Family recipes: named, versioned shortcuts for known manual selections.

At capture time each instance is resolved to exact node IDs (the nodes under the
instance's module path) and recorded in the snapshot. Selecting a recipe only looks
those values up and calls the same select_region() as a manual selection.
"""

from __future__ import annotations

from typing import Any, Sequence

from .errors import UserError
from .families.base import RecipeSpec
from .graph.snapshot import fingerprint
from .selection import select_region


def _nodes_under(snapshot: dict[str, Any], path: str) -> list[str]:
    return [n["id"] for n in snapshot["nodes"]
            if n["module_path"] == path or n["module_path"].startswith(path + ".")]


def annotate_recipes(snapshot: dict[str, Any], specs: Sequence[RecipeSpec]) -> None:
    """Record every recipe instance of this role with its exact node IDs (refingerprints)."""
    rows = []
    for spec in specs:
        for instance, path in spec.instances:
            node_ids = _nodes_under(snapshot, path)
            if not node_ids:
                raise RuntimeError(f"recipe {spec.id} instance {instance}: no graph nodes under {path}")
            rows.append({
                "id": spec.id, "instance": instance, "engine_role": spec.engine_role,
                "description": spec.description, "module_path": path, "node_ids": node_ids,
                "workspace_bytes": spec.workspace_bytes, "extra_args": list(spec.extra_args),
                "output_shape_input": spec.output_shape_input,
            })
    snapshot["recipes"] = rows
    snapshot["fingerprint"] = fingerprint(snapshot)


def recipe_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return list(snapshot.get("recipes", []))


def find_recipe(snapshot: dict[str, Any], recipe_id: str, instance: str) -> dict[str, Any]:
    """The one row for (recipe, instance); never guesses the first or every match."""
    rows = recipe_rows(snapshot)
    role = snapshot["metadata"]["engine_role"]
    ids = sorted({r["id"] for r in rows})
    if recipe_id not in ids:
        known = ", ".join(ids) or "none"
        raise UserError(f"recipe {recipe_id!r} is not published for the {role} role of this model (recipes: {known}); "
                        "list them with `mcore graph recipes SNAPSHOT`")
    for r in rows:
        if r["id"] == recipe_id and r["instance"] == instance:
            return r
    examples = [r["instance"] for r in rows if r["id"] == recipe_id][:3]
    raise UserError(f"recipe {recipe_id} has no instance {instance!r} (e.g. {', '.join(examples)}); "
                    "name one exact instance from `mcore graph recipes`")


def select_recipe(snapshot: dict[str, Any], recipe_id: str, instance: str, binding_id: str | None = None) -> dict[str, Any]:
    """Resolve a recipe instance and validate it exactly like a manual selection."""
    r = find_recipe(snapshot, recipe_id, instance)
    return select_region(snapshot, r["node_ids"], binding_id or recipe_id, r["workspace_bytes"], r["extra_args"],
                         r["output_shape_input"], recipe={"id": recipe_id, "instance": instance})
