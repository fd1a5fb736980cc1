"""select_region(): the one validator for recipes and manual selections (DESIGN.md §4),
and the selection receipt with its ABI hash (§2, §3)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..common.errors import RegionError
from ..common.fileio import read_json
from ..graph.snapshot import Node, Snapshot
from .receipt import (
    ABI_FORMAT,
    ABI_STREAM,
    AbiTensor,
    Receipt,
    RecipeRef,
    abi_contract,
    abi_sha256,
    check_binding_id,
    check_workspace,
    normalize_extra_arg,
)

BOUNDARY_DTYPES = ("BF16", "FP16", "FP32", "INT32")
MAX_RANK = 8
NODE_ID_RE = re.compile(r"^node:\d+$")

__all__ = [  # with the receipt's names, still importable from here
    "ABI_FORMAT",
    "Receipt",
    "RegionError",
    "abi_contract",
    "abi_sha256",
    "check_binding_id",
    "check_workspace",
    "normalize_extra_arg",
    "check_receipt",
    "load_receipt",
    "select_region",
]


# ---------------------------------------------------------------- the validator

_FORBIDDEN_OPS = (
    ("control flow", ("higher_order.cond", "higher_order.while_loop", "higher_order.map", "cond", "while_loop")),
    ("collective", ("_c10d_functional.", "c10d.", "c10d_functional.")),
    ("existing slot", ("mcore.slot",)),
)


def _forbidden(node: Node) -> str | None:
    op = node.op
    for what, prefixes in _FORBIDDEN_OPS:
        if any(op == p or op.startswith(p) for p in prefixes):
            return what
    if node.category == "LayerType.CONDITIONAL":
        return "control flow"
    return None


def region_boundary(ix: Snapshot, region: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(inputs in first-use order, outputs, internal tensors) of a node set."""
    ordered = sorted(region, key=ix.order.__getitem__)
    inputs: list[str] = []
    produced: set[str] = set()
    for nid in ordered:
        produced.update(ix.node(nid).outputs)
    internal: list[str] = []
    outputs: list[str] = []
    for nid in ordered:
        for t in ix.node(nid).inputs:
            if t not in produced and t not in inputs:
                inputs.append(t)
        for t in ix.node(nid).outputs:
            if ix.is_output(t) or any(c not in region for c in ix.tensor(t).consumers):
                outputs.append(t)
            else:
                internal.append(t)
    return inputs, outputs, internal


def is_connected(ix: Snapshot, region: set[str]) -> bool:
    start = next(iter(region))
    seen = {start}
    stack = [start]
    while stack:
        n = stack.pop()
        for m in (ix.successors(n) | ix.predecessors(n)) & region:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return seen == region


def convexity_violation(ix: Snapshot, region: set[str]) -> tuple[str, str] | None:
    """(outside node left to, region node re-entered) for a path that leaves and re-enters, else None."""
    frontier = []
    came_from: dict[str, str] = {}
    for n in region:
        for m in ix.successors(n):
            if m not in region and m not in came_from:
                came_from[m] = m
                frontier.append(m)
    while frontier:
        n = frontier.pop()
        for m in ix.successors(n):
            if m in region:
                return came_from[n], m
            if m not in came_from:
                came_from[m] = came_from[n]
                frontier.append(m)
    return None


def select_region(
    snapshot: Snapshot | Mapping[str, Any],
    node_ids: Iterable[str],
    binding_id: str,
    workspace_bytes: int = 0,
    extra_args: Sequence[Any] = (),
    output_shape_input: int | None = None,
    recipe: Mapping[str, str] | None = None,
) -> Receipt:
    """Validate a region against every rule and return its selection receipt.

    Recipes and manual selections both come through here; nothing else validates a region.
    `snapshot` is a Snapshot, or its JSON (hand-made graphs), checked first.
    The rules run in a fixed order (the first broken one is the error a user sees).
    """
    check_binding_id(binding_id)
    check_workspace(workspace_bytes)
    extras = [normalize_extra_arg(a, i) for i, a in enumerate(extra_args)]
    ix = Snapshot.of(snapshot)
    region = _check_node_ids(ix, list(node_ids))
    _check_region_nodes(ix, region)
    inputs, outputs, internal = region_boundary(ix, region)
    _check_one_output(ix, outputs)
    _check_boundary_tensors(ix, inputs, outputs, internal)
    _check_output_shape(ix, inputs, outputs[0], output_shape_input)
    return make_receipt(
        ix,
        [n for n in sorted(region, key=ix.order.__getitem__)],
        inputs,
        outputs,
        binding_id,
        workspace_bytes,
        extras,
        output_shape_input,
        recipe,
    )


def _check_node_ids(ix: Snapshot, ids: list[str]) -> set[str]:
    """The selected IDs as a set: each well-formed, named once and present in this graph."""
    if not ids:
        raise RegionError("nodes", None, "no nodes selected; pass --nodes node:N [node:M ...]")
    seen: set[str] = set()
    for nid in ids:
        if not isinstance(nid, str) or not NODE_ID_RE.match(nid):
            raise RegionError(
                "nodes", str(nid), f"{nid!r} is not a node ID; node IDs look like node:42 (see `mcore graph list`)"
            )
        if nid in seen:
            raise RegionError("nodes", nid, f"{nid} is selected twice; name each node once")
        if nid not in ix.node_by_id:
            raise RegionError(
                "nodes", nid, f"{nid} does not exist in this graph; copy IDs from `mcore graph list` of this snapshot"
            )
        seen.add(nid)
    return seen


def _check_region_nodes(ix: Snapshot, region: set[str]) -> None:
    """No forbidden op (checked in graph order, so the first one named is stable), connected, convex."""
    for nid in sorted(region, key=ix.order.__getitem__):
        what = _forbidden(ix.node(nid))
        if what:
            raise RegionError(
                what.replace(" ", "_"),
                nid,
                f"{nid} ({ix.node(nid).op}) is a {what} node; a region cannot contain one",
            )
    if not is_connected(ix, region):
        raise RegionError(
            "connected", None, "the selected nodes are not connected by tensor edges; select one connected region"
        )
    bad = convexity_violation(ix, region)
    if bad:
        raise RegionError(
            "convex",
            bad[1],
            f"region is not convex: a path leaves it through {bad[0]} and re-enters at {bad[1]}; "
            f"add the nodes on that path or select fewer",
        )


def _check_one_output(ix: Snapshot, outputs: list[str]) -> None:
    """Exactly one output, and not a network output (the slot replaces the region, so the graph must consume it)."""
    for t in outputs:
        if ix.is_output(t):
            raise RegionError(
                "network_output",
                t,
                f"{t} ({ix.tensor_label(t)}) is a network output produced inside the region; "
                "leave the node that produces it out of the selection",
            )
    if not outputs:
        raise RegionError("one_output", None, "the region has no output used by the rest of the graph")
    if len(outputs) > 1:
        raise RegionError(
            "one_output",
            outputs[1],
            f"the region has {len(outputs)} outputs ({', '.join(outputs)}); a region must expose exactly one",
        )


def _check_boundary_tensors(ix: Snapshot, inputs: list[str], outputs: list[str], internal: list[str]) -> None:
    """Every touched tensor on the device; boundary tensors in an ABI dtype, bounded rank and linear layout."""
    for t in inputs + internal + outputs:
        tensor = ix.tensor(t)
        if tensor.is_shape_tensor or tensor.location != "device":
            raise RegionError(
                "shape_or_host_tensor",
                t,
                f"{t} is a {'shape' if tensor.is_shape_tensor else 'host'} tensor; "
                "a region may only touch device tensors",
            )
    for t in inputs + outputs:
        tensor = ix.tensor(t)
        if tensor.dtype not in BOUNDARY_DTYPES:
            raise RegionError(
                "boundary_dtype",
                t,
                f"boundary tensor {t} has dtype {tensor.dtype}; allowed: {', '.join(BOUNDARY_DTYPES)}",
            )
        if len(tensor.shape) > MAX_RANK:
            raise RegionError(
                "boundary_rank", t, f"boundary tensor {t} has rank {len(tensor.shape)}; at most {MAX_RANK}"
            )
        if (tensor.format or "linear") != "linear":
            raise RegionError(
                "boundary_linear",
                t,
                f"boundary tensor {t} is not linear (a strided view); extend the region to the op that made it",
            )


def _check_output_shape(ix: Snapshot, inputs: list[str], output: str, output_shape_input: int | None) -> None:
    """The runtime must know the output's shape: a static one, or an input named to copy it from."""
    out = ix.tensor(output)
    if output_shape_input is None:
        if -1 in out.shape:
            raise RegionError(
                "output_shape",
                output,
                f"the output {output} has a dynamic shape {list(out.shape)}; add --output-shape-like-input INDEX "
                "naming an input with the same dtype and shape",
            )
        return
    if (
        isinstance(output_shape_input, bool)
        or not isinstance(output_shape_input, int)
        or not 0 <= output_shape_input < len(inputs)
    ):
        raise RegionError(
            "output_shape",
            None,
            f"--output-shape-like-input {output_shape_input!r} is not an input index; use 0..{len(inputs) - 1}",
        )
    src = ix.tensor(inputs[output_shape_input])
    if src.dtype != out.dtype or src.shape != out.shape:
        raise RegionError(
            "output_shape",
            inputs[output_shape_input],
            f"input {output_shape_input} ({inputs[output_shape_input]}, {src.describe()}) does not match "
            f"the output ({output}, {out.describe()}); name an input with the same dtype and shape",
        )


def make_receipt(
    snap: Snapshot,
    node_ids: list[str],
    inputs: list[str],
    outputs: list[str],
    binding_id: str,
    workspace_bytes: int,
    extras: list[dict[str, Any]],
    output_shape_input: int | None,
    recipe: Mapping[str, str] | None,
) -> Receipt:
    def entry(i: int, tid: str) -> AbiTensor:
        t = snap.tensor(tid)
        return AbiTensor(
            i,
            tid,
            t.label,
            t.dtype,
            t.shape,
            t.location,
            t.producer,
            snap.node(t.producer).op if t.producer else None,
        )

    ins = [entry(i, t) for i, t in enumerate(inputs)]
    outs = [entry(i, t) for i, t in enumerate(outputs)]
    contract = abi_contract(ins, outs, workspace_bytes, extras, output_shape_input)
    meta = snap.metadata
    return Receipt(
        binding_id=binding_id,
        abi_sha256=abi_sha256(contract),
        engine_role=snap.engine_role,
        graph_fingerprint=snap.fingerprint,
        node_ids=tuple(node_ids),
        input_tensor_ids=tuple(inputs),
        output_tensor_ids=tuple(outputs),
        output_shape_input=output_shape_input,
        workspace_bytes=workspace_bytes,
        extra_args=tuple(extras),
        inputs=tuple(ins),
        outputs=tuple(outs),
        recipe=RecipeRef(recipe["id"], recipe["instance"]) if recipe else None,
        stream=ABI_STREAM,
        graph={k: meta[k] for k in ("family", "model", "revision", "engine_role", "build_args") if k in meta},
    )


def check_receipt(receipt: Any, where: str) -> Receipt:
    """A receipt's JSON (or a Receipt's, written out again) checked into a Receipt: fields, types,
    ranges, the ABI hash."""
    return Receipt.from_dict(receipt.to_dict() if isinstance(receipt, Receipt) else receipt, where)


def load_receipt(path: str | os.PathLike) -> Receipt:
    return Receipt.from_dict(read_json(path, "selection receipt"), str(path))
