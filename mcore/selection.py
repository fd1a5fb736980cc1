"""select_region(): the one validator for recipes and manual selections (DESIGN.md §4),
and the selection receipt with its ABI hash (§2, §3)."""

from __future__ import annotations

import hashlib
import math
import os
import re
from typing import Any, Iterable, Optional, Sequence, TypeVar

from .errors import UserError
from .fileio import canonical_json, check_fields, read_json
from .graph.snapshot import SnapshotIndex

RECEIPT_SCHEMA_VERSION = 1
RECEIPT_KIND = "mcore.selection_receipt"
ABI_FORMAT = "mcore.tvm_ffi.abi/1"
BOUNDARY_DTYPES = ("BF16", "FP16", "FP32", "INT32")
MAX_RANK = 8
MAX_WORKSPACE = 2147483647
BINDING_ID_RE = re.compile(r"^[A-Za-z0-9_.@-]+$")
NODE_ID_RE = re.compile(r"^node:\d+$")
EXTRA_ARG_TYPES = ("none", "int", "float", "ptr")


class RegionError(UserError):
    """A region rule failed; `rule` names it and `subject` the node or tensor at fault."""

    def __init__(self, rule: str, subject: Optional[str], message: str):
        self.rule = rule
        self.subject = subject
        super().__init__(message)


# ---------------------------------------------------------------- parameters


def check_binding_id(binding_id: Any) -> str:
    if (
        not isinstance(binding_id, str)
        or not binding_id
        or not BINDING_ID_RE.match(binding_id)
        or len(binding_id) > 200
    ):
        raise RegionError(
            "binding_id",
            None,
            f"binding ID {binding_id!r} is invalid; use letters, digits and _ . @ - only (e.g. my.kernel@1)",
        )
    return binding_id


def check_workspace(workspace_bytes: Any) -> int:
    if (
        isinstance(workspace_bytes, bool)
        or not isinstance(workspace_bytes, int)
        or not 0 <= workspace_bytes <= MAX_WORKSPACE
    ):
        raise RegionError(
            "workspace", None, f"workspace bytes {workspace_bytes!r} is out of range; use an integer 0..{MAX_WORKSPACE}"
        )
    return workspace_bytes


def normalize_extra_arg(arg: Any, index: int) -> dict[str, Any]:
    """Strict: {"type":"none"} | {"type":"int","value":i32} | {"type":"float","value":finite} | {"type":"ptr","value":null}."""
    where = f"extra arg {index}"
    if not isinstance(arg, dict) or "type" not in arg:
        raise RegionError("extra_args", None, f'{where}: expected a JSON object like {{"type":"int","value":32}}')
    kind = arg["type"]
    if kind not in EXTRA_ARG_TYPES:
        raise RegionError(
            "extra_args", None, f"{where}: type {kind!r} is not allowed; use one of {', '.join(EXTRA_ARG_TYPES)}"
        )
    try:
        check_fields(arg, where, {"type"} if kind == "none" else {"type", "value"})
    except UserError as e:
        raise RegionError("extra_args", None, str(e)) from None
    if kind == "none":
        return {"type": "none"}
    v = arg["value"]
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int) or not -(2**31) <= v < 2**31:
            raise RegionError("extra_args", None, f"{where}: int value {v!r} is not a signed 32-bit integer")
        return {"type": "int", "value": v}
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise RegionError("extra_args", None, f"{where}: float value {v!r} is not a finite number")
        return {"type": "float", "value": float(v)}
    if v is not None:
        raise RegionError("extra_args", None, f"{where}: ptr value must be null (only null pointers are allowed)")
    return {"type": "ptr", "value": None}


def abi_contract(
    inputs: Sequence[dict],
    outputs: Sequence[dict],
    workspace_bytes: int,
    extra_args: Sequence[dict],
    output_shape_input: Optional[int],
) -> dict[str, Any]:
    """Exactly what abi_sha256 covers: the call contract, nothing model-specific."""
    return {
        "format": ABI_FORMAT,
        "inputs": [{"dtype": t["dtype"], "shape": list(t["shape"])} for t in inputs],
        "outputs": [{"dtype": t["dtype"], "shape": list(t["shape"])} for t in outputs],
        "workspace_bytes": workspace_bytes,
        "extra_args": list(extra_args),
        "output_shape_input": output_shape_input,
    }


T = TypeVar("T")


def call_order(inputs: Sequence[T], workspace: Optional[T], outputs: Sequence[T], extras: Sequence[T]) -> list[T]:
    """The one place that knows the ABI's argument order (DESIGN.md §3): boundary inputs, the
    workspace when there is one, boundary outputs, then the fixed extra args. Used for the
    parameter names a receipt prints, the stubs generated from it and the values a slot passes."""
    return [*inputs, *([] if workspace is None else [workspace]), *outputs, *extras]


def call_params(n_inputs: int, workspace_bytes: int, n_outputs: int, n_extras: int) -> list[str]:
    """`run(...)`'s parameter names in ABI order."""
    return call_order(
        [f"input{i}" for i in range(n_inputs)],
        "workspace" if workspace_bytes else None,
        [f"output{i}" for i in range(n_outputs)],
        [f"extra{i}" for i in range(n_extras)],
    )


def abi_sha256(contract: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(contract).encode()).hexdigest()


# ---------------------------------------------------------------- the validator

_FORBIDDEN_OPS = (
    ("control flow", ("higher_order.cond", "higher_order.while_loop", "higher_order.map", "cond", "while_loop")),
    ("collective", ("_c10d_functional.", "c10d.", "c10d_functional.")),
    ("existing slot", ("mcore.slot",)),
)


def _forbidden(node: dict) -> Optional[str]:
    op = node["op"]
    for what, prefixes in _FORBIDDEN_OPS:
        if any(op == p or op.startswith(p) for p in prefixes):
            return what
    if node.get("category") == "LayerType.CONDITIONAL":
        return "control flow"
    return None


def region_boundary(ix: SnapshotIndex, region: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(inputs in first-use order, outputs, internal tensors) of a node set."""
    ordered = sorted(region, key=ix.order.__getitem__)
    inputs: list[str] = []
    produced: set[str] = set()
    for nid in ordered:
        produced.update(ix.nodes[nid]["outputs"])
    internal: list[str] = []
    outputs: list[str] = []
    for nid in ordered:
        for t in ix.nodes[nid]["inputs"]:
            if t not in produced and t not in inputs:
                inputs.append(t)
        for t in ix.nodes[nid]["outputs"]:
            tensor = ix.tensors[t]
            if t in ix.outputs or any(c not in region for c in tensor["consumers"]):
                outputs.append(t)
            else:
                internal.append(t)
    return inputs, outputs, internal


def is_connected(ix: SnapshotIndex, region: set[str]) -> bool:
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


def convexity_violation(ix: SnapshotIndex, region: set[str]) -> Optional[tuple[str, str]]:
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


def _describe(t: dict) -> str:
    return f"{t['dtype']} {t['shape']}"


def select_region(
    snapshot: dict[str, Any],
    node_ids: Iterable[str],
    binding_id: str,
    workspace_bytes: int = 0,
    extra_args: Sequence[Any] = (),
    output_shape_input: Optional[int] = None,
    recipe: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """Validate a region against every rule and return its selection receipt.

    Recipes and manual selections both come through here; nothing else validates a region.
    """
    check_binding_id(binding_id)
    check_workspace(workspace_bytes)
    extras = [normalize_extra_arg(a, i) for i, a in enumerate(extra_args)]
    ix = SnapshotIndex(snapshot)
    ids = list(node_ids)
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
        if nid not in ix.nodes:
            raise RegionError(
                "nodes", nid, f"{nid} does not exist in this graph; copy IDs from `mcore graph list` of this snapshot"
            )
        seen.add(nid)
    region = set(ids)
    for nid in sorted(region, key=ix.order.__getitem__):
        what = _forbidden(ix.nodes[nid])
        if what:
            raise RegionError(
                what.replace(" ", "_"),
                nid,
                f"{nid} ({ix.nodes[nid]['op']}) is a {what} node; a region cannot contain one",
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
    inputs, outputs, internal = region_boundary(ix, region)
    for t in outputs:
        if t in ix.outputs:
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
    for t in inputs + internal + outputs:
        tensor = ix.tensors[t]
        if tensor["is_shape_tensor"] or tensor["location"] != "device":
            raise RegionError(
                "shape_or_host_tensor",
                t,
                f"{t} is a {'shape' if tensor['is_shape_tensor'] else 'host'} tensor; "
                "a region may only touch device tensors",
            )
    for t in inputs + outputs:
        tensor = ix.tensors[t]
        if tensor["dtype"] not in BOUNDARY_DTYPES:
            raise RegionError(
                "boundary_dtype",
                t,
                f"boundary tensor {t} has dtype {tensor['dtype']}; allowed: {', '.join(BOUNDARY_DTYPES)}",
            )
        if len(tensor["shape"]) > MAX_RANK:
            raise RegionError(
                "boundary_rank", t, f"boundary tensor {t} has rank {len(tensor['shape'])}; at most {MAX_RANK}"
            )
        if tensor.get("format", "linear") != "linear":
            raise RegionError(
                "boundary_linear",
                t,
                f"boundary tensor {t} is not linear (a strided view); extend the region to the op that made it",
            )
    out = ix.tensors[outputs[0]]
    if output_shape_input is not None:
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
        src = ix.tensors[inputs[output_shape_input]]
        if src["dtype"] != out["dtype"] or list(src["shape"]) != list(out["shape"]):
            raise RegionError(
                "output_shape",
                inputs[output_shape_input],
                f"input {output_shape_input} ({inputs[output_shape_input]}, {_describe(src)}) does not match "
                f"the output ({outputs[0]}, {_describe(out)}); name an input with the same dtype and shape",
            )
    elif -1 in out["shape"]:
        raise RegionError(
            "output_shape",
            outputs[0],
            f"the output {outputs[0]} has a dynamic shape {out['shape']}; add --output-shape-like-input INDEX "
            "naming an input with the same dtype and shape",
        )
    return make_receipt(
        snapshot,
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


def make_receipt(
    snapshot, ix, node_ids, inputs, outputs, binding_id, workspace_bytes, extras, output_shape_input, recipe
) -> dict[str, Any]:
    def entry(i: int, t: str) -> dict[str, Any]:
        tensor = ix.tensors[t]
        producer = tensor["producer"]
        return {
            "index": i,
            "tensor_id": t,
            "name": ix.tensor_label(t),
            "dtype": tensor["dtype"],
            "shape": list(tensor["shape"]),
            "location": tensor["location"],
            "producer": producer,
            "producer_op": ix.nodes[producer]["op"] if producer else None,
        }

    ins = [entry(i, t) for i, t in enumerate(inputs)]
    outs = [entry(i, t) for i, t in enumerate(outputs)]
    contract = abi_contract(ins, outs, workspace_bytes, extras, output_shape_input)
    args = call_params(len(ins), workspace_bytes, len(outs), len(extras))
    meta = snapshot["metadata"]
    return {
        "schema_version": RECEIPT_SCHEMA_VERSION,
        "kind": RECEIPT_KIND,
        "graph_fingerprint": snapshot["fingerprint"],
        "engine_role": meta["engine_role"],
        "binding_id": binding_id,
        "abi_sha256": abi_sha256(contract),
        "workspace_bytes": workspace_bytes,
        "extra_args": extras,
        "node_ids": list(node_ids),
        "input_tensor_ids": list(inputs),
        "output_tensor_ids": list(outputs),
        "output_shape_input": output_shape_input,
        "abi": {
            "format": ABI_FORMAT,
            "call": f"run({', '.join(args)})",
            "stream": "the engine's current stream (TVM-FFI environment stream); never sync, never the default stream",
            "inputs": ins,
            "workspace_bytes": workspace_bytes,
            "outputs": outs,
            "extra_args": extras,
            "output_shape_input": output_shape_input,
        },
        "recipe": dict(recipe) if recipe else None,
        "graph": {k: meta[k] for k in ("family", "model", "revision", "engine_role", "build_args") if k in meta},
    }


_RECEIPT_FIELDS = {
    "schema_version",
    "kind",
    "graph_fingerprint",
    "engine_role",
    "binding_id",
    "abi_sha256",
    "workspace_bytes",
    "extra_args",
    "node_ids",
    "input_tensor_ids",
    "output_tensor_ids",
    "output_shape_input",
    "abi",
    "recipe",
    "graph",
}


_ABI_ENTRY = {"index": int, "tensor_id": str, "name": str, "dtype": str, "location": str, "shape": list}


def check_slot_types(slot: Any, where: str) -> None:
    """Field types of a receipt or of a bundle's slot record (the same call contract), so that a
    mistyped file is a one-line error naming the field, never a KeyError or TypeError later."""
    if not isinstance(slot, dict):
        raise UserError(f"{where}: expected a JSON object")

    def need(ok: bool, name: str, want: str) -> None:
        if not ok:
            raise UserError(f"{where}: field {name} must be {want}; recreate the file with mcore")

    for k in ("binding_id", "abi_sha256", "engine_role", "graph_fingerprint"):
        need(isinstance(slot.get(k), str), k, "a string")
    for k in ("node_ids", "input_tensor_ids", "output_tensor_ids"):
        v = slot.get(k)
        need(isinstance(v, list) and all(isinstance(x, str) for x in v), k, "a list of strings")
    need(
        isinstance(slot.get("extra_args"), list) and all(isinstance(a, dict) for a in slot["extra_args"]),
        "extra_args",
        "a list of objects",
    )
    osi = slot.get("output_shape_input")
    need(
        osi is None or (isinstance(osi, int) and not isinstance(osi, bool)), "output_shape_input", "an integer or null"
    )
    ws = slot.get("workspace_bytes")
    need(isinstance(ws, int) and not isinstance(ws, bool), "workspace_bytes", "an integer")
    rec = slot.get("recipe")
    need(
        rec is None
        or (isinstance(rec, dict) and isinstance(rec.get("id"), str) and isinstance(rec.get("instance"), str)),
        "recipe",
        "null or {id, instance}",
    )
    abi: Any = slot.get("abi")  # a dict once need() below has passed
    need(isinstance(abi, dict) and isinstance(abi.get("call"), str), "abi", "an object with call, inputs and outputs")
    for side in ("inputs", "outputs"):
        entries = abi.get(side)
        need(isinstance(entries, list), f"abi.{side}", "a list")
        for i, e in enumerate(entries):
            ok = isinstance(e, dict) and all(
                isinstance(e.get(k), t) and not isinstance(e.get(k), bool) for k, t in _ABI_ENTRY.items()
            )
            need(
                ok and all(isinstance(d, int) and not isinstance(d, bool) for d in e["shape"]),
                f"abi.{side}[{i}]",
                "an object with index, tensor_id, name, dtype, location and shape (integers)",
            )


def check_receipt(receipt: Any, where: str) -> dict[str, Any]:
    """Check a receipt's fields and that its ABI hash matches its readable ABI."""
    check_fields(receipt, where, _RECEIPT_FIELDS)
    check_slot_types(receipt, where)
    if receipt["kind"] != RECEIPT_KIND:
        raise UserError(
            f"{where}: kind is {receipt['kind']!r}, not a selection receipt; pass a file from `mcore graph select` or `mcore build --recipe`"
        )
    if receipt["schema_version"] != RECEIPT_SCHEMA_VERSION:
        raise UserError(
            f"{where}: schema_version {receipt['schema_version']!r} is not supported (expected {RECEIPT_SCHEMA_VERSION})"
        )
    check_binding_id(receipt["binding_id"])
    check_workspace(receipt["workspace_bytes"])
    abi = receipt["abi"]
    check_fields(
        abi,
        f"{where}: abi",
        {"format", "call", "stream", "inputs", "workspace_bytes", "outputs", "extra_args", "output_shape_input"},
    )
    contract = abi_contract(
        abi["inputs"],
        abi["outputs"],
        receipt["workspace_bytes"],
        [normalize_extra_arg(a, i) for i, a in enumerate(receipt["extra_args"])],
        receipt["output_shape_input"],
    )
    if abi_sha256(contract) != receipt["abi_sha256"]:
        raise UserError(
            f"{where}: abi_sha256 does not match the receipt's ABI (the file was edited); recreate it with `mcore graph select`"
        )
    if [e["tensor_id"] for e in abi["inputs"]] != receipt["input_tensor_ids"] or [
        e["tensor_id"] for e in abi["outputs"]
    ] != receipt["output_tensor_ids"]:
        raise UserError(f"{where}: input/output tensor IDs disagree with the abi section; recreate the receipt")
    return receipt


def load_receipt(path: str | os.PathLike) -> dict[str, Any]:
    return check_receipt(read_json(path, "selection receipt"), str(path))
