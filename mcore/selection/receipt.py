"""The selection receipt (DESIGN.md §2) and the call ABI it fixes (§3), as typed contracts.

`SlotRecord` is the call contract a bundle records per kernel slot; `Receipt` is the file
`mcore graph select` writes: the same record plus its kind, schema version and the graph it
names. Both are checked once in `from_dict` (types, ranges, the ABI hash against the readable
ABI) and written by one `to_dict`. `SlotRecord.call_args` is the one place that knows the ABI's
argument order.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..common.contract import check_kind, field_error, is_int, need_dict, need_str, need_strs
from ..common.errors import RegionError, UserError
from ..common.fileio import canonical_json, check_fields

RECEIPT_SCHEMA_VERSION = 1
RECEIPT_KIND = "mcore.selection_receipt"
ABI_FORMAT = "mcore.tvm_ffi.abi/1"
ABI_STREAM = "the engine's current stream (TVM-FFI environment stream); never sync, never the default stream"
MAX_WORKSPACE = 2147483647
BINDING_ID_RE = re.compile(r"^[A-Za-z0-9_.@-]+$")
EXTRA_ARG_TYPES = ("none", "int", "float", "ptr")
RESELECT = "recreate it with `mcore graph select`"

T = TypeVar("T")


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
    if not is_int(workspace_bytes) or not 0 <= workspace_bytes <= MAX_WORKSPACE:
        raise RegionError(
            "workspace", None, f"workspace bytes {workspace_bytes!r} is out of range; use an integer 0..{MAX_WORKSPACE}"
        )
    return workspace_bytes


def normalize_extra_arg(arg: Any, index: int) -> dict[str, Any]:
    """Strict: {"type":"none"} | {"type":"int","value":i32} | {"type":"float","value":finite} | {"type":"ptr","value":null}."""
    where = f"extra arg {index}"
    if not isinstance(arg, Mapping) or "type" not in arg:
        raise RegionError("extra_args", None, f'{where}: expected a JSON object like {{"type":"int","value":32}}')
    kind = arg["type"]
    if kind not in EXTRA_ARG_TYPES:
        raise RegionError(
            "extra_args", None, f"{where}: type {kind!r} is not allowed; use one of {', '.join(EXTRA_ARG_TYPES)}"
        )
    try:
        check_fields(dict(arg), where, {"type"} if kind == "none" else {"type", "value"})
    except UserError as e:
        raise RegionError("extra_args", None, str(e)) from None
    if kind == "none":
        return {"type": "none"}
    v = arg["value"]
    if kind == "int":
        if not is_int(v) or not -(2**31) <= v < 2**31:
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
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    workspace_bytes: int,
    extra_args: Sequence[Mapping[str, Any]],
    output_shape_input: int | None,
) -> dict[str, Any]:
    """Exactly what abi_sha256 covers: the call contract, nothing model-specific. `inputs` and
    `outputs` are AbiTensors or anything with dtype and shape items."""

    def side(ts: Sequence[Any]) -> list[dict[str, Any]]:
        return [
            {"dtype": t.dtype, "shape": list(t.shape)}
            if isinstance(t, AbiTensor)
            else {"dtype": t["dtype"], "shape": list(t["shape"])}
            for t in ts
        ]

    return {
        "format": ABI_FORMAT,
        "inputs": side(inputs),
        "outputs": side(outputs),
        "workspace_bytes": workspace_bytes,
        "extra_args": [dict(a) for a in extra_args],
        "output_shape_input": output_shape_input,
    }


def abi_sha256(contract: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(contract).encode()).hexdigest()


# ---------------------------------------------------------------- the ABI section


@dataclass(frozen=True)
class AbiTensor:
    """One boundary tensor of the call, as the receipt's readable ABI lists it."""

    index: int
    tensor_id: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    location: str
    producer: str | None
    producer_op: str | None

    @classmethod
    def from_dict(cls, d: Any, where: str, path: str, index: int, todo: str) -> AbiTensor:
        check_fields(d, f"{where}: {path}", set(_ABI_TENSOR_KEYS))
        p = path + "."
        shape = d["shape"]
        if not isinstance(shape, list) or not all(is_int(x) and x >= -1 for x in shape):
            raise field_error(where, f"{p}shape", "must be a list of integers >= -1", todo)
        if d["index"] != index or not is_int(d["index"]):
            raise field_error(where, f"{p}index", f"must be {index} (its position)", todo)
        for k in ("producer", "producer_op"):
            if d[k] is not None and not isinstance(d[k], str):
                raise field_error(where, p + k, "must be a string or null", todo)
        return cls(
            index,
            need_str(d, "tensor_id", where, todo, path=p),
            need_str(d, "name", where, todo, path=p),
            need_str(d, "dtype", where, todo, path=p),
            tuple(shape),
            need_str(d, "location", where, todo, path=p),
            d["producer"],
            d["producer_op"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: list(self.shape) if k == "shape" else getattr(self, k) for k in _ABI_TENSOR_KEYS}


_ABI_TENSOR_KEYS = ("index", "tensor_id", "name", "dtype", "shape", "location", "producer", "producer_op")
_ABI_KEYS = ("format", "call", "stream", "inputs", "workspace_bytes", "outputs", "extra_args", "output_shape_input")


# ---------------------------------------------------------------- the slot record


@dataclass(frozen=True)
class RecipeRef:
    id: str
    instance: str


_SLOT_KEYS = (
    "binding_id",
    "abi_sha256",
    "engine_role",
    "graph_fingerprint",
    "node_ids",
    "input_tensor_ids",
    "output_tensor_ids",
    "output_shape_input",
    "workspace_bytes",
    "extra_args",
    "abi",
    "recipe",
)


@dataclass(frozen=True)
class SlotRecord:
    """A slot's call contract: what a bundle records per kernel slot (DESIGN.md §6)."""

    binding_id: str
    abi_sha256: str
    engine_role: str
    graph_fingerprint: str
    node_ids: tuple[str, ...]
    input_tensor_ids: tuple[str, ...]
    output_tensor_ids: tuple[str, ...]
    output_shape_input: int | None
    workspace_bytes: int
    extra_args: tuple[dict[str, Any], ...]  # normalized (normalize_extra_arg)
    inputs: tuple[AbiTensor, ...]  # abi.inputs
    outputs: tuple[AbiTensor, ...]  # abi.outputs
    recipe: RecipeRef | None
    stream: str = ABI_STREAM  # abi.stream, the readable stream rule

    # ------------------------------------------------------------ parse and write
    @classmethod
    def _parse(cls, d: Mapping[str, Any], where: str, todo: str) -> dict[str, Any]:
        """The checked fields shared by a slot record and a receipt (`d`'s keys already checked)."""
        _check_slot_scalars(d, where, todo)
        ids = {k: need_strs(d, k, where, todo) for k in ("node_ids", "input_tensor_ids", "output_tensor_ids")}
        norm = _parse_extra_args(d, where, todo)
        osi = d.get("output_shape_input")
        if osi is not None and not is_int(osi):
            raise field_error(where, "output_shape_input", "must be an integer or null", todo)
        recipe = _parse_recipe(d.get("recipe"), where, todo)
        abi = need_dict(d, "abi", where, todo)
        check_fields(abi, f"{where}: abi", set(_ABI_KEYS))
        sides = {side: _parse_abi_side(abi, side, where, todo) for side in ("inputs", "outputs")}
        if osi is not None and not 0 <= osi < len(sides["inputs"]):
            raise field_error(where, "output_shape_input", f"{osi} is not an input index", todo)
        fields = dict(
            binding_id=d["binding_id"],
            abi_sha256=d["abi_sha256"],
            engine_role=d["engine_role"],
            graph_fingerprint=d["graph_fingerprint"],
            **ids,
            output_shape_input=osi,
            workspace_bytes=d["workspace_bytes"],
            extra_args=norm,
            inputs=sides["inputs"],
            outputs=sides["outputs"],
            recipe=recipe,
            stream=need_str(abi, "stream", where, todo, path="abi."),
        )
        _check_abi_repeats_fields(d, abi, fields, where, todo)
        return fields

    @classmethod
    def from_dict(cls, data: Any, where: str, todo: str = "rebuild the bundle with `mcore build`") -> SlotRecord:
        check_fields(data, where, set(_SLOT_KEYS))
        return cls(**cls._parse(data, where, todo))

    def _abi_dict(self) -> dict[str, Any]:
        return {
            "format": ABI_FORMAT,
            "call": self.call,
            "stream": self.stream,
            "inputs": [e.to_dict() for e in self.inputs],
            "workspace_bytes": self.workspace_bytes,
            "outputs": [e.to_dict() for e in self.outputs],
            "extra_args": copy.deepcopy(list(self.extra_args)),
            "output_shape_input": self.output_shape_input,
        }

    def _value(self, key: str) -> Any:
        if key == "abi":
            return self._abi_dict()
        if key == "recipe":
            return None if self.recipe is None else {"id": self.recipe.id, "instance": self.recipe.instance}
        v = getattr(self, key)
        return copy.deepcopy(list(v)) if isinstance(v, tuple) else v

    def to_dict(self) -> dict[str, Any]:
        return {k: self._value(k) for k in _SLOT_KEYS}

    def slot(self) -> SlotRecord:
        """This call contract as a bundle records it."""
        return SlotRecord(**{f: getattr(self, f) for f in SlotRecord.__dataclass_fields__})

    # ------------------------------------------------------------ the call
    def contract(self) -> dict[str, Any]:
        """What abi_sha256 covers."""
        return abi_contract(self.inputs, self.outputs, self.workspace_bytes, self.extra_args, self.output_shape_input)

    def call_args(self, inputs: Sequence[T], workspace: T | None, outputs: Sequence[T], extras: Sequence[T]) -> list[T]:
        """`run(...)`'s arguments in this slot's ABI order (DESIGN.md §3). `workspace` is passed only
        when the slot has one; the caller gives one value per boundary tensor and extra arg."""
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs) or len(extras) != len(self.extra_args):
            raise ValueError(f"slot {self.binding_id}: arguments do not match its ABI")
        ws: list[T] = []
        if self.workspace_bytes:
            if workspace is None:
                raise ValueError(f"slot {self.binding_id}: its ABI has a workspace and none was given")
            ws = [workspace]
        # boundary inputs, the workspace when there is one, boundary outputs, the fixed extra args
        return [*inputs, *ws, *outputs, *extras]

    def call_params(self) -> list[str]:
        """`run(...)`'s parameter names in ABI order."""
        return self.call_args(
            [f"input{i}" for i in range(len(self.inputs))],
            "workspace",
            [f"output{i}" for i in range(len(self.outputs))],
            [f"extra{i}" for i in range(len(self.extra_args))],
        )

    @property
    def call(self) -> str:
        return f"run({', '.join(self.call_params())})"

    # ------------------------------------------------------------ names
    @property
    def instance(self) -> str | None:
        return self.recipe.instance if self.recipe else None

    @property
    def label(self) -> str:
        """The slot's name in messages: its recipe instance when it has one, else its binding ID."""
        return f"{self.binding_id} [{self.instance}]" if self.instance else self.binding_id

    def abi_lines(self) -> list[str]:
        """The readable ABI, one fact a line (the CLI and the TUI show these): the slot's identity,
        then its call."""
        return [
            f"binding_id={self.binding_id}",
            f"abi_sha256={self.abi_sha256}",
            f"engine_role={self.engine_role}",
            f"graph_fingerprint={self.graph_fingerprint}",
            *self.call_lines(),
        ]

    def call_lines(self) -> list[str]:
        """The call alone: its signature, each boundary tensor, workspace, extra args, output shape."""
        lines = [f"call: {self.call}"]
        for tag, entries in (("input", self.inputs), ("output", self.outputs)):
            for e in entries:
                pad = " " * (len("output") - len(tag) + 1)
                lines.append(
                    f"{tag}[{e.index}]{pad}{e.tensor_id:<12} {e.name:<24} {e.dtype} {e.location} {list(e.shape)}"
                )
        lines.append(f"workspace {self.workspace_bytes} bytes")
        extras = self.extra_args
        lines.append("extra args " + (", ".join(f"{a['type']}={a.get('value')}" for a in extras) if extras else "none"))
        rule = self.output_shape_input
        lines.append("output shape " + (f"like input[{rule}]" if rule is not None else "fixed as declared"))
        return lines


# ---------------------------------------------------------------- the slot record's parse phases


def _check_slot_scalars(d: Mapping[str, Any], where: str, todo: str) -> None:
    """The string fields, then binding_id and workspace_bytes by the region rules they were built with."""
    for k in ("abi_sha256", "engine_role", "graph_fingerprint"):
        need_str(d, k, where, todo)
    try:
        check_binding_id(d.get("binding_id"))
        check_workspace(d.get("workspace_bytes"))
    except RegionError as e:
        name = e.rule if e.rule == "binding_id" else "workspace_bytes"
        raise field_error(where, name, f"is invalid ({e})", todo) from None


def _parse_extra_args(d: Mapping[str, Any], where: str, todo: str) -> tuple[dict[str, Any], ...]:
    extras = d.get("extra_args")
    if not isinstance(extras, list):
        raise field_error(where, "extra_args", "must be a list of objects", todo)
    try:
        return tuple(normalize_extra_arg(a, i) for i, a in enumerate(extras))
    except RegionError as e:
        raise field_error(where, "extra_args", f"is invalid ({e})", todo) from None


def _parse_recipe(rec: Any, where: str, todo: str) -> RecipeRef | None:
    if rec is None:
        return None
    if not isinstance(rec, dict) or set(rec) != {"id", "instance"}:
        raise field_error(where, "recipe", "must be null or {id, instance}", todo)
    return RecipeRef(
        need_str(rec, "id", where, todo, path="recipe."), need_str(rec, "instance", where, todo, path="recipe.")
    )


def _parse_abi_side(abi: Mapping[str, Any], side: str, where: str, todo: str) -> tuple[AbiTensor, ...]:
    if not isinstance(abi[side], list):
        raise field_error(where, f"abi.{side}", "must be a list", todo)
    return tuple(AbiTensor.from_dict(e, where, f"abi.{side}[{i}]", i, todo) for i, e in enumerate(abi[side]))


def _check_abi_repeats_fields(
    d: Mapping[str, Any], abi: Mapping[str, Any], fields: dict[str, Any], where: str, todo: str
) -> None:
    """The readable ABI repeats the call contract: it must say exactly what the fields say, and hash to abi_sha256."""
    if abi["format"] != ABI_FORMAT:
        raise field_error(where, "abi.format", f"{abi['format']!r} is not {ABI_FORMAT}", todo)
    for k in ("workspace_bytes", "output_shape_input"):
        if abi[k] != d[k] or type(abi[k]) is not type(d[k]):
            raise field_error(where, f"abi.{k}", f"disagrees with field {k}", todo)
    if abi["extra_args"] != list(d["extra_args"]):
        raise field_error(where, "abi.extra_args", "disagrees with field extra_args", todo)
    if [e.tensor_id for e in fields["inputs"]] != list(fields["input_tensor_ids"]) or [
        e.tensor_id for e in fields["outputs"]
    ] != list(fields["output_tensor_ids"]):
        raise UserError(f"{where}: input/output tensor IDs disagree with the abi section; {todo}")
    probe = SlotRecord(**fields)
    if abi["call"] != probe.call:
        raise field_error(where, "abi.call", f"{abi['call']!r} is not {probe.call!r}", todo)
    if abi_sha256(probe.contract()) != probe.abi_sha256:
        raise UserError(f"{where}: abi_sha256 does not match the receipt's ABI (the file was edited); {todo}")


# ---------------------------------------------------------------- the receipt

_RECEIPT_KEYS = (
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
)


RECEIPT_FIELDS = _RECEIPT_KEYS  # every field of a receipt file (the generated exporters refuse any other)


@dataclass(frozen=True)
class Receipt(SlotRecord):
    """A selection receipt file: a slot record plus the graph it was selected on."""

    graph: dict[str, Any] | None = None  # family, model, revision, engine_role, build_args

    @classmethod
    def from_dict(cls, data: Any, where: str, todo: str = RESELECT) -> Receipt:
        """Check a receipt's fields, their types and ranges, and that its ABI hash matches its ABI."""
        check_kind(
            data,
            where,
            RECEIPT_KIND,
            RECEIPT_SCHEMA_VERSION,
            "a selection receipt",
            "a file from `mcore graph select` or `mcore build --recipe`",
            "",
        )
        check_fields(data, where, set(_RECEIPT_KEYS))
        graph = need_dict(data, "graph", where, todo)
        return cls(**cls._parse(data, where, todo), graph=copy.deepcopy(graph))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema_version": RECEIPT_SCHEMA_VERSION, "kind": RECEIPT_KIND}
        d.update((k, self._value(k)) for k in _RECEIPT_KEYS[2:-1])
        d["graph"] = copy.deepcopy(self.graph)
        return d

    @classmethod
    def of(cls, receipt: Receipt | Mapping[str, Any], where: str = "selection receipt") -> Receipt:
        """`receipt` as a Receipt: itself, or a JSON dict parsed and checked now."""
        return receipt if isinstance(receipt, Receipt) else cls.from_dict(receipt, where)
