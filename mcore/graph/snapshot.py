"""The graph snapshot contract (DESIGN.md §1): the typed `Snapshot`, checked once at load (fields,
types, ranges and every reference between node and tensor IDs), its fingerprint, and the file.

Building one from a torch.export program lives in from_export.py; this module needs no torch.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.contract import (
    check_kind,
    field_error,
    is_int,
    need_bool,
    need_dict,
    need_int,
    need_opt_str,
    need_str,
    need_strs,
)
from ..common.errors import UserError
from ..common.fileio import canonical_json, check_fields, read_json

SCHEMA_VERSION = 1
KIND = "mcore.graph_snapshot"
NODE_ID_RE = re.compile(r"^node:\d+$")
TENSOR_ID_RE = re.compile(r"^tensor:\d+$")
LOCATIONS = ("device", "host")
FORMATS = ("linear", "strided")
RECAPTURE = "recapture with `mcore graph inspect`"

# Metadata that describes the machine that captured a graph, not the graph: recorded, never hashed,
# so the same graph captured with another torch or mcore gives the same fingerprint.
UNHASHED_METADATA = ("tool_versions",)


def fingerprint(snap: Mapping[str, Any]) -> str:
    """sha256 over what determines the graph (DESIGN.md §1): the metadata that names the model
    (spec, revision, config hash), the engine role and graph-producing args, then the graph itself
    (nodes, tensors, inputs, outputs, recipe instances). Tool versions are left out."""
    payload = {k: v for k, v in snap.items() if k != "fingerprint"}
    meta = payload.get("metadata")
    if isinstance(meta, dict):
        payload["metadata"] = {k: v for k, v in meta.items() if k not in UNHASHED_METADATA}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


# The JSON key order of each record is the order capture writes (a snapshot file is rewritten
# byte for byte); optional keys are written only when set.
_NODE_REQUIRED = ("id", "op", "name", "module_path", "inputs", "outputs")
_NODE_ORDER = ("id", "op", "category", "name", "module_path", "inputs", "outputs", "mutates")
_TENSOR_REQUIRED = ("id", "dtype", "shape", "location", "is_shape_tensor", "producer", "consumers")
_TENSOR_ORDER = (
    "id",
    "name",
    "dtype",
    "shape",
    "location",
    "is_shape_tensor",
    "format",
    "producer",
    "consumers",
    "output_name",
    "is_network_output",
)
_RECIPE_ORDER = (
    "id",
    "instance",
    "engine_role",
    "description",
    "module_path",
    "node_ids",
    "workspace_bytes",
    "extra_args",
    "output_shape_input",
)


def _record(obj: Any, order: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object of a node, tensor or recipe row: `order`'s keys, optional ones when set."""
    out: dict[str, Any] = {}
    for k in order:
        v = getattr(obj, k)
        if v is not None or k in obj.NULLABLE:
            out[k] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
    return out


@dataclass(frozen=True)
class Node:
    id: str
    op: str
    name: str
    module_path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    category: str | None = None  # the TensorRT-style layer type shown in lists
    mutates: tuple[str, ...] | None = None  # the tensor versions an in-place op writes

    NULLABLE = ()

    @classmethod
    def from_dict(cls, d: Any, where: str, path: str) -> Node:
        check_fields(d, f"{where}: {path}", set(_NODE_REQUIRED), {"category", "mutates"})
        p = path + "."
        nid = need_str(d, "id", where, RECAPTURE, path=p)
        if not NODE_ID_RE.match(nid):
            raise field_error(where, f"{p}id", f"{nid!r} must look like node:N", RECAPTURE)
        return cls(
            nid,
            need_str(d, "op", where, RECAPTURE, path=p),
            need_str(d, "name", where, RECAPTURE, path=p),
            need_str(d, "module_path", where, RECAPTURE, path=p),
            need_strs(d, "inputs", where, RECAPTURE, path=p),
            need_strs(d, "outputs", where, RECAPTURE, path=p),
            need_str(d, "category", where, RECAPTURE, path=p) if "category" in d else None,
            need_strs(d, "mutates", where, RECAPTURE, path=p) if "mutates" in d else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return _record(self, _NODE_ORDER)


@dataclass(frozen=True)
class Tensor:
    id: str
    dtype: str  # BF16, FP16, FP32, INT32, INT64, ...
    shape: tuple[int, ...]  # -1 for a dynamic dimension
    location: str  # device | host
    is_shape_tensor: bool
    producer: str | None  # None for a graph input
    consumers: tuple[str, ...]
    name: str | None = None
    format: str | None = None  # linear | strided
    output_name: str | None = None  # the role output (or written state) this tensor is
    is_network_output: bool | None = None

    NULLABLE = ("producer",)

    @classmethod
    def from_dict(cls, d: Any, where: str, path: str) -> Tensor:
        optional = {"name", "format", "output_name", "is_network_output"}
        check_fields(d, f"{where}: {path}", set(_TENSOR_REQUIRED), optional)
        p = path + "."
        tid = need_str(d, "id", where, RECAPTURE, path=p)
        if not TENSOR_ID_RE.match(tid):
            raise field_error(where, f"{p}id", f"{tid!r} must look like tensor:N", RECAPTURE)
        shape = d["shape"]
        if not isinstance(shape, list) or not all(is_int(x) and x >= -1 for x in shape):
            raise field_error(where, f"{p}shape", "must be a list of integers >= -1 (-1: dynamic)", RECAPTURE)
        location = need_str(d, "location", where, RECAPTURE, path=p)
        if location not in LOCATIONS:
            raise field_error(where, f"{p}location", f"{location!r} must be device or host", RECAPTURE)

        # optional keys, when present, hold a value (absent and null would write back differently)
        def opt_str(k: str) -> str | None:
            return need_str(d, k, where, RECAPTURE, path=p) if k in d else None

        fmt = opt_str("format")
        if fmt is not None and fmt not in FORMATS:
            raise field_error(where, f"{p}format", f"{fmt!r} must be linear or strided", RECAPTURE)
        net = need_bool(d, "is_network_output", where, RECAPTURE, path=p) if "is_network_output" in d else None
        return cls(
            tid,
            need_str(d, "dtype", where, RECAPTURE, path=p),
            tuple(shape),
            location,
            need_bool(d, "is_shape_tensor", where, RECAPTURE, path=p),
            need_opt_str(d, "producer", where, RECAPTURE, path=p),
            need_strs(d, "consumers", where, RECAPTURE, path=p),
            opt_str("name"),
            fmt,
            opt_str("output_name"),
            net,
        )

    def to_dict(self) -> dict[str, Any]:
        return _record(self, _TENSOR_ORDER)

    @property
    def label(self) -> str:
        """The name people know the tensor by: its role output name, else its FX name, else its ID."""
        return self.output_name or self.name or self.id

    def describe(self) -> str:
        return f"{self.dtype} {list(self.shape)}"


@dataclass(frozen=True)
class RecipeRow:
    """One recipe instance resolved at capture to exact node IDs (mcore/selection/recipes.py)."""

    id: str
    instance: str
    engine_role: str
    description: str
    module_path: str
    node_ids: tuple[str, ...]
    workspace_bytes: int
    extra_args: tuple[dict[str, Any], ...]
    output_shape_input: int | None

    NULLABLE = ("output_shape_input",)

    @classmethod
    def from_dict(cls, d: Any, where: str, path: str) -> RecipeRow:
        check_fields(d, f"{where}: {path}", set(_RECIPE_ORDER))
        p = path + "."
        extras = d["extra_args"]
        if not isinstance(extras, list) or not all(isinstance(a, dict) for a in extras):
            raise field_error(where, f"{p}extra_args", "must be a list of objects", RECAPTURE)
        osi = d["output_shape_input"]
        if osi is not None and not (is_int(osi) and osi >= 0):
            raise field_error(where, f"{p}output_shape_input", "must be an input index (>= 0) or null", RECAPTURE)
        return cls(
            need_str(d, "id", where, RECAPTURE, path=p),
            need_str(d, "instance", where, RECAPTURE, path=p),
            need_str(d, "engine_role", where, RECAPTURE, path=p),
            need_str(d, "description", where, RECAPTURE, path=p),
            need_str(d, "module_path", where, RECAPTURE, path=p),
            need_strs(d, "node_ids", where, RECAPTURE, path=p),
            need_int(d, "workspace_bytes", where, RECAPTURE, path=p, lo=0),
            tuple(copy.deepcopy(extras)),
            osi,
        )

    def to_dict(self) -> dict[str, Any]:
        d = _record(self, _RECIPE_ORDER)
        d["extra_args"] = copy.deepcopy(d["extra_args"])
        return d


@dataclass(frozen=True)
class Snapshot:
    """A graph snapshot, checked once, with its node and tensor indexes.

    `nodes` and `tensors` are in ID (topological) order; `node(id)` and `tensor(id)` look them up.
    `recipes` is None when the file has no recipe list (hand-made graphs)."""

    metadata: dict[str, Any]
    nodes: tuple[Node, ...]
    tensors: tuple[Tensor, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fingerprint: str
    recipes: tuple[RecipeRow, ...] | None = None
    schema_version: int = SCHEMA_VERSION
    kind: str = KIND
    # indexes, derived from the fields above
    node_by_id: Mapping[str, Node] = field(init=False, repr=False, compare=False)
    tensor_by_id: Mapping[str, Tensor] = field(init=False, repr=False, compare=False)
    order: Mapping[str, int] = field(init=False, repr=False, compare=False)  # node ID -> position
    output_set: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_by_id", {n.id: n for n in self.nodes})
        object.__setattr__(self, "tensor_by_id", {t.id: t for t in self.tensors})
        object.__setattr__(self, "order", {n.id: i for i, n in enumerate(self.nodes)})
        object.__setattr__(self, "output_set", frozenset(self.outputs))

    # ------------------------------------------------------------ parse and write
    @classmethod
    def from_dict(cls, data: Any, where: str) -> Snapshot:
        """Check every field, type and ID reference, then the fingerprint; errors name `where`."""
        check_kind(
            data,
            where,
            KIND,
            SCHEMA_VERSION,
            f"a graph snapshot ({KIND})",
            "the file written by `mcore graph inspect --snapshot`",
            "recapture with this mcore",
        )
        check_fields(
            data,
            where,
            {"schema_version", "kind", "metadata", "nodes", "tensors", "inputs", "outputs", "fingerprint"},
            {"recipes"},
        )
        meta = need_dict(data, "metadata", where, RECAPTURE)
        need_str(meta, "engine_role", where, RECAPTURE, path="metadata.")
        for k in ("nodes", "tensors"):
            if not isinstance(data[k], list):
                raise field_error(where, k, "must be a list", RECAPTURE)
        nodes = tuple(Node.from_dict(n, where, f"nodes[{i}]") for i, n in enumerate(data["nodes"]))
        tensors = tuple(Tensor.from_dict(t, where, f"tensors[{i}]") for i, t in enumerate(data["tensors"]))
        recipes = None
        if "recipes" in data:
            if not isinstance(data["recipes"], list):
                raise field_error(where, "recipes", "must be a list", RECAPTURE)
            recipes = tuple(RecipeRow.from_dict(r, where, f"recipes[{i}]") for i, r in enumerate(data["recipes"]))
        fp = need_str(data, "fingerprint", where, RECAPTURE)
        snap = cls(
            copy.deepcopy(meta),
            nodes,
            tensors,
            need_strs(data, "inputs", where, RECAPTURE),
            need_strs(data, "outputs", where, RECAPTURE),
            fp,
            recipes,
        )
        snap._check_references(where)
        if fingerprint(data) != fp:
            raise UserError(
                f"{where}: fingerprint does not match the content (the file was edited or damaged); {RECAPTURE}"
            )
        return snap

    def _check_references(self, where: str) -> None:  # noqa: C901 - flat checklist, one branch per reference rule
        """Every ID names something that exists, once, and both ends of each edge agree: the region
        rules walk these edges, so a dangling or one-sided edge would make them unsound."""
        for what, all_ids in (("nodes", [n.id for n in self.nodes]), ("tensors", [t.id for t in self.tensors])):
            if len(set(all_ids)) != len(all_ids):
                seen: set[str] = set()
                for i, x in enumerate(all_ids):
                    if x in seen:
                        raise field_error(where, f"{what}[{i}].id", f"{x} is used twice; IDs are unique", RECAPTURE)
                    seen.add(x)

        def bad(name: str, problem: str) -> UserError:
            return field_error(where, name, problem, RECAPTURE)

        tensors, nodes = self.tensor_by_id, self.node_by_id
        for i, n in enumerate(self.nodes):
            for key, ids in (("inputs", n.inputs), ("outputs", n.outputs), ("mutates", n.mutates or ())):
                for tid in ids:
                    if tid not in tensors:
                        raise bad(f"nodes[{i}].{key}", f"names {tid}, which is not in tensors")
            for tid in n.inputs:
                if n.id not in tensors[tid].consumers:
                    raise bad(f"nodes[{i}].inputs", f"reads {tid} but {tid} does not list {n.id} among its consumers")
            for tid in n.outputs:
                if tensors[tid].producer != n.id:
                    raise bad(f"nodes[{i}].outputs", f"writes {tid} but {tid} names another producer")
        for i, t in enumerate(self.tensors):
            if t.producer is not None and (t.producer not in nodes or t.id not in nodes[t.producer].outputs):
                raise bad(f"tensors[{i}].producer", f"{t.producer} is not a node that outputs {t.id}")
            for nid in t.consumers:
                if nid not in nodes or t.id not in nodes[nid].inputs:
                    raise bad(f"tensors[{i}].consumers", f"{nid} is not a node that reads {t.id}")
        for key, ids in (("inputs", self.inputs), ("outputs", self.outputs)):
            for tid in ids:
                if tid not in tensors:
                    raise bad(key, f"names {tid}, which is not in tensors")
        for i, r in enumerate(self.recipes or ()):
            for nid in r.node_ids:
                if nid not in nodes:
                    raise bad(f"recipes[{i}].node_ids", f"names {nid}, which is not in nodes")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, key for key as capture writes it (the fingerprint is taken over it)."""
        d: dict[str, Any] = {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "metadata": copy.deepcopy(self.metadata),
            "nodes": [n.to_dict() for n in self.nodes],
            "tensors": [t.to_dict() for t in self.tensors],
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "fingerprint": self.fingerprint,
        }
        if self.recipes is not None:
            d["recipes"] = [r.to_dict() for r in self.recipes]
        return d

    # ------------------------------------------------------------ lookups
    @property
    def engine_role(self) -> str:
        return self.metadata["engine_role"]

    @property
    def family(self) -> str | None:
        return self.metadata.get("family")

    @property
    def recipe_rows(self) -> tuple[RecipeRow, ...]:
        return self.recipes or ()

    def node(self, nid: str) -> Node:
        return self.node_by_id[nid]

    def tensor(self, tid: str) -> Tensor:
        return self.tensor_by_id[tid]

    def successors(self, nid: str) -> set[str]:
        out: set[str] = set()
        for t in self.node_by_id[nid].outputs:
            out.update(self.tensor_by_id[t].consumers)
        return out

    def predecessors(self, nid: str) -> set[str]:
        out: set[str] = set()
        for t in self.node_by_id[nid].inputs:
            p = self.tensor_by_id[t].producer
            if p is not None:
                out.add(p)
        return out

    def tensor_label(self, tid: str) -> str:
        return self.tensor_by_id[tid].label

    def is_output(self, tid: str) -> bool:
        return tid in self.output_set

    @classmethod
    def of(cls, snapshot: Snapshot | Mapping[str, Any], where: str = "graph snapshot") -> Snapshot:
        """`snapshot` as a Snapshot: itself, or a JSON dict (hand-made graphs, scripts) parsed now."""
        return snapshot if isinstance(snapshot, Snapshot) else cls.from_dict(snapshot, where)


def load_snapshot(path: str | os.PathLike) -> Snapshot:
    """Read and check a snapshot file; errors name the file and the field."""
    return Snapshot.from_dict(read_json(path, "graph snapshot"), str(path))
