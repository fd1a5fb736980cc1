"""The manifest of a bundle that mcore builds and runs (DESIGN.md §6), as a typed contract.

The bundle container (container.py) checks only what any bundle needs (kind, schema version, the
kernel slots' binding IDs and roles). Running or describing a bundle reads more: every field
here is checked once, by `BundleManifest.from_dict`, and a bundle lacking one fails naming it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.contract import field_error, is_int, need_dict, need_str
from ..common.errors import UserError
from ..common.fileio import check_fields
from ..selection.receipt import SlotRecord

BUNDLE_KIND = "mcore.bundle"
BUNDLE_SCHEMA_VERSION = 1
REBUILD = "rebuild it with `mcore build`"

# the JSON key order build.py writes; the optional keys are written only when the file had them
_KEYS = (
    "schema_version",
    "kind",
    "engine",
    "family",
    "family_kind",
    "model",
    "build_args",
    "graph_args",
    "device",
    "roles",
    "kernel_slots",
    "weights",
    "special_tokens",
    "sentence_embedding",
    "tool_versions",
    "built_on",
)
_REQUIRED = ("engine", "family", "model", "build_args", "graph_args", "roles", "weights")
_OPTIONAL = frozenset({"family_kind", "device", "special_tokens", "sentence_embedding", "tool_versions", "built_on"})
FAMILY_KINDS = ("decoder", "encoder")


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_SPECIAL_IDS = ("eos_token_id", "bos_token_id", "pad_token_id", "cls_token_id", "sep_token_id")


def _check_weights(weights: dict[str, Any], w: str) -> dict[str, Any]:
    """{"kind": "random", "seed"} | {"kind": "checkpoint", "member", "aliases"[, "tensor_sha256"]}."""
    wk = weights.get("kind")
    if not (wk == "random" and is_int(weights.get("seed"))) and not (
        wk == "checkpoint" and isinstance(weights.get("member"), str)
    ):
        raise field_error(
            w, "weights.kind", "must be random (with an integer seed) or checkpoint (with its member)", REBUILD
        )
    if wk == "random":
        check_fields(weights, f"{w} weights", {"kind", "seed"})
        if not 0 <= weights["seed"] < 1 << 63:
            raise field_error(w, "weights.seed", f"{weights['seed']} is out of range 0..2**63-1", REBUILD)
        return weights
    check_fields(weights, f"{w} weights", {"kind", "member"}, {"aliases", "tensor_sha256"})
    aliases = weights.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise field_error(w, "weights.aliases", "must map tensor names to tensor names", REBUILD)
    digests = weights.get("tensor_sha256", {})
    if not isinstance(digests, dict) or not all(isinstance(v, str) and _HEX64.match(v) for v in digests.values()):
        raise field_error(w, "weights.tensor_sha256", "must map tensor names to sha256 hex digests", REBUILD)
    return weights


def _check_special_tokens(special: Any, w: str) -> None:
    """Token IDs are non-negative integers or null; eos_token_ids a list of them."""
    if not isinstance(special, dict):
        return  # absent, or refused as not an object below
    for k in _SPECIAL_IDS:
        v = special.get(k)
        if v is not None and (not is_int(v) or not 0 <= v < 1 << 31):
            raise field_error(w, f"special_tokens.{k}", f"{v!r} must be a token ID (an integer >= 0) or null", REBUILD)
    ids = special.get("eos_token_ids", [])
    if not isinstance(ids, list) or not all(is_int(v) and 0 <= v < 1 << 31 for v in ids):
        raise field_error(w, "special_tokens.eos_token_ids", "must be a list of token IDs", REBUILD)


@dataclass(frozen=True)
class ModelRef:
    spec: str
    revision: str | None


@dataclass(frozen=True)
class RoleRecord:
    """An engine role of the bundle: the fingerprint of its graph and its I/O names."""

    fingerprint: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


# ---------------------------------------------------------------- the manifest's parse phases


def _check_container(m: Any, where: str) -> None:
    """An object with every required field, no unknown one, and this kind and schema."""
    if not isinstance(m, dict):
        raise UserError(f"{where}: bundle manifest must be a JSON object")
    for name in _REQUIRED:
        if name not in m:
            raise UserError(f"{where}: bundle manifest lacks field {name}; {REBUILD}")
    check_fields(m, f"{where}: bundle manifest", {"schema_version", "kind", "kernel_slots", *_REQUIRED}, _OPTIONAL)
    if m["kind"] != BUNDLE_KIND or m["schema_version"] != BUNDLE_SCHEMA_VERSION:
        raise UserError(f"{where}: not an mcore bundle of schema {BUNDLE_SCHEMA_VERSION}; {REBUILD}")


def _parse_model(model: Any, w: str) -> ModelRef:
    if (
        not isinstance(model, dict)
        or not isinstance(model.get("spec"), str)
        or "revision" not in model
        or not isinstance(model["revision"], (str, type(None)))
    ):
        raise field_error(w, "model", "needs spec (a string) and revision", REBUILD)
    return ModelRef(model["spec"], model["revision"])


def _parse_roles(roles_d: dict[str, Any], w: str) -> dict[str, RoleRecord]:
    roles = {}
    for role, r in roles_d.items():
        if not isinstance(r, dict) or not isinstance(r.get("fingerprint"), str):
            raise UserError(f"{w} roles.{role} needs fingerprint, inputs and outputs; {REBUILD}")
        for k in ("inputs", "outputs"):
            if not isinstance(r.get(k), list) or not all(isinstance(x, str) for x in r[k]):
                raise UserError(f"{w} roles.{role} needs fingerprint, inputs and outputs; {REBUILD}")
        roles[role] = RoleRecord(r["fingerprint"], tuple(r["inputs"]), tuple(r["outputs"]))
    return roles


def _parse_slots(slots_d: Any, roles: Mapping[str, RoleRecord], w: str) -> tuple[SlotRecord, ...]:
    """Each slot record checked in full, then its engine role checked against the bundle's roles."""
    if not isinstance(slots_d, list):
        raise field_error(w, "kernel_slots", "must be a list", REBUILD)
    slots = tuple(SlotRecord.from_dict(s, f"{w} kernel_slots[{i}]", REBUILD) for i, s in enumerate(slots_d))
    for i, s in enumerate(slots):
        if s.engine_role not in roles:
            raise UserError(
                f"{w} kernel_slots[{i}] (binding {s.binding_id}): engine role {s.engine_role!r} does not exist "
                f"in this bundle (roles: {', '.join(roles) or 'none'}); {REBUILD}"
            )
    return slots


def _optional_fields(m: dict[str, Any], w: str) -> dict[str, Any]:
    """device, special_tokens, tool_versions and built_on where the file has them (sentence_embedding aside)."""
    _check_special_tokens(m.get("special_tokens"), w)
    opt: dict[str, Any] = {}
    if m.get("device") is not None:
        opt["device"] = need_str(m, "device", w, REBUILD)
    for k in ("special_tokens", "tool_versions", "built_on"):
        if k in m:
            opt[k] = copy.deepcopy(need_dict(m, k, w, REBUILD))
    return opt


@dataclass(frozen=True)
class BundleManifest:
    engine: str
    family: str
    model: ModelRef
    build_args: dict[str, Any]
    graph_args: dict[str, Any]
    roles: Mapping[str, RoleRecord]
    kernel_slots: tuple[SlotRecord, ...]
    weights: dict[str, Any]  # {"kind": "random", "seed"} | {"kind": "checkpoint", "member", "aliases"}
    family_kind: str | None = None  # decoder | encoder (older bundles: the family's kind)
    device: str | None = None
    special_tokens: dict[str, Any] | None = None
    sentence_embedding: dict[str, Any] | None = None
    tool_versions: dict[str, Any] | None = None
    built_on: dict[str, Any] | None = None
    present: frozenset[str] = field(default=_OPTIONAL, repr=False)  # optional keys the file has

    @classmethod
    def from_dict(cls, m: Any, where: str) -> BundleManifest:
        """Check every field the runner and `mcore inspect` read: present, typed, in range."""
        _check_container(m, where)
        w = f"{where}: bundle manifest"
        kind = m.get("family_kind")
        if kind is not None and kind not in FAMILY_KINDS:
            raise field_error(w, "family_kind", f"{kind!r} must be decoder or encoder", REBUILD)
        model = _parse_model(m["model"], w)
        weights = _check_weights(need_dict(m, "weights", w, REBUILD), w)
        roles = _parse_roles(need_dict(m, "roles", w, REBUILD), w)
        slots = _parse_slots(m["kernel_slots"], roles, w)
        opt = _optional_fields(m, w)
        emb = m.get("sentence_embedding")
        if emb is not None and not isinstance(emb, dict):
            raise field_error(w, "sentence_embedding", "must be an object or null", REBUILD)
        return cls(
            engine=need_str(m, "engine", w, REBUILD),
            family=need_str(m, "family", w, REBUILD),
            model=model,
            build_args=copy.deepcopy(need_dict(m, "build_args", w, REBUILD)),
            graph_args=copy.deepcopy(need_dict(m, "graph_args", w, REBUILD)),
            roles=roles,
            kernel_slots=slots,
            weights=copy.deepcopy(weights),
            family_kind=kind,
            sentence_embedding=copy.deepcopy(emb),
            present=frozenset(k for k in _OPTIONAL if k in m),
            **opt,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for k in _KEYS:
            if k in _OPTIONAL and k not in self.present:
                continue
            if k == "schema_version":
                d[k] = BUNDLE_SCHEMA_VERSION
            elif k == "kind":
                d[k] = BUNDLE_KIND
            elif k == "model":
                d[k] = {"spec": self.model.spec, "revision": self.model.revision}
            elif k == "roles":
                d[k] = {
                    role: {"fingerprint": r.fingerprint, "inputs": list(r.inputs), "outputs": list(r.outputs)}
                    for role, r in self.roles.items()
                }
            elif k == "kernel_slots":
                d[k] = [s.to_dict() for s in self.kernel_slots]
            else:
                d[k] = copy.deepcopy(getattr(self, k))
        return d

    def slots_of(self, role: str) -> list[SlotRecord]:
        return [s for s in self.kernel_slots if s.engine_role == role]
