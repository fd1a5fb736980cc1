"""Kernel bindings manifest (DESIGN.md §5) and load-time binding of bundle slots (§7).

Manifest::

    {"schema_version": 1,
     "bindings": [{"id": BINDING_ID, "abi_sha256": HEX64, "library": "./kernel.so", "function": "run"
                   [, "library_sha256": HEX64]}]}

Missing or unknown fields fail; `library` is relative to the manifest and may not leave its
folder (neither by `..` nor through a symlink); every slot is bound exactly once; an ABI hash
mismatch fails. `library_sha256` is optional (DESIGN.md contract 5 had no DSO hash; docs/trust.md
says why it was added): without it any DSO implementing the slot's ABI may be bound; with it, the
DSO's bytes must have that sha256, checked before dlopen.

The manifest is read once, inside `bind_slots`; the returned `BoundKernel`s hold the loaded
functions, so later edits of the manifest file do not affect them.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.fileio import check_fields, check_path_text, read_json
from ..kernels.dso import check_sha256
from ..selection.patch import SlotKey, slot_groups
from ..selection.receipt import SlotRecord, check_binding_id

BINDINGS_SCHEMA_VERSION = 1
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_announced: set[str] = set()
_announce_lock = threading.Lock()


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Binding:
    """One manifest entry, validated. `library_path` is the resolved absolute DSO path."""

    id: str
    abi_sha256: str
    library: str
    function: str
    manifest_dir: Path
    library_path: Path = field(default=None, compare=False)  # type: ignore[assignment]
    library_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"id": self.id, "abi_sha256": self.abi_sha256, "library": self.library, "function": self.function}
        if self.library_sha256 is not None:
            d["library_sha256"] = self.library_sha256
        return d


@dataclass(frozen=True)
class BoundKernel:
    """A slot's loaded kernel. `function` is the TVM-FFI callable (ABI order: inputs, workspace,
    outputs, extra args)."""

    binding_id: str
    abi_sha256: str
    library: Path
    function_name: str
    function: Callable[..., Any] = field(repr=False, compare=False)
    module: Any = field(default=None, repr=False, compare=False)  # keeps the DSO loaded

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)


# ---------------------------------------------------------------- manifest


def _resolve_library(library: str, manifest_dir: Path, where: str) -> Path:
    check_path_text(library, f"{where}: field library")
    if os.path.isabs(library) or library.startswith("~"):
        raise UserError(
            f"{where}: library {library!r} is an absolute path; give a path relative to the "
            f"manifest's folder (e.g. ./kernel.so) and copy the DSO there"
        )
    norm = os.path.normpath(library)
    if norm == ".." or norm.startswith(".." + os.sep):
        raise UserError(
            f"{where}: library {library!r} leaves the manifest's folder; copy the DSO into "
            f"{manifest_dir} and name it relative to it"
        )
    resolved = (manifest_dir / norm).resolve()
    try:
        resolved.relative_to(manifest_dir)
    except ValueError:
        raise UserError(
            f"{where}: library {library!r} resolves to {resolved} (through a symlink), outside the "
            f"manifest's folder {manifest_dir}; copy the DSO into that folder"
        ) from None
    return resolved


@dataclass(frozen=True)
class BindingsManifest:
    """A kernel bindings manifest, checked once (DESIGN.md §5). Iterating yields its bindings."""

    bindings: tuple[Binding, ...]
    path: Path  # where it was read from; libraries resolve against its folder
    schema_version: int = BINDINGS_SCHEMA_VERSION

    @classmethod
    def from_dict(cls, data: Any, path: str | os.PathLike) -> BindingsManifest:
        """Check fields, types and IDs; resolve each library inside the manifest's folder (loads no DSO)."""
        path = Path(path)
        where = str(path)
        check_fields(data, where, {"schema_version", "bindings"})
        sv = data["schema_version"]
        if isinstance(sv, bool) or sv != BINDINGS_SCHEMA_VERSION:
            raise UserError(f"{where}: schema_version {sv!r} is not supported; use {BINDINGS_SCHEMA_VERSION}")
        entries = data["bindings"]
        if not isinstance(entries, list):
            raise UserError(f"{where}: field bindings must be a list of binding entries")
        manifest_dir = path.parent.resolve()
        out: list[Binding] = []
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            ew = f"{where}: bindings[{i}]"
            check_fields(entry, ew, {"id", "abi_sha256", "library", "function"}, {"library_sha256"})
            try:
                bid = check_binding_id(entry["id"])
            except UserError as e:
                raise UserError(f"{ew}: field id: {e}") from None
            if bid in seen:
                raise UserError(
                    f"{ew}: binding {bid!r} is listed twice (also bindings[{seen[bid]}]); bind every slot exactly once"
                )
            seen[bid] = i
            abi = entry["abi_sha256"]
            if not isinstance(abi, str) or not _HEX64_RE.match(abi):
                raise UserError(
                    f"{ew}: field abi_sha256 must be 64 lowercase hex digits; copy abi_sha256 from the selection receipt"
                )
            lib = entry["library"]
            if not isinstance(lib, str) or not lib.strip():
                raise UserError(f"{ew}: field library must be a non-empty relative path such as ./kernel.so")
            fn = entry["function"]
            if not isinstance(fn, str) or not _IDENT_RE.match(fn):
                raise UserError(f"{ew}: field function {fn!r} must be a non-empty identifier such as run")
            lib_sha = entry.get("library_sha256")
            if "library_sha256" in entry and (not isinstance(lib_sha, str) or not _HEX64_RE.match(lib_sha)):
                raise UserError(
                    f"{ew}: field library_sha256 must be 64 lowercase hex digits (sha256sum of the DSO) or absent"
                )
            resolved = _resolve_library(lib, manifest_dir, f"{ew} (binding {bid})")
            out.append(Binding(bid, abi, lib, fn, manifest_dir, resolved, lib_sha))
        return cls(tuple(out), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BindingsManifest:
        return cls.from_dict(read_json(path, "kernel bindings manifest"), path)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "bindings": [b.to_dict() for b in self.bindings]}

    def __iter__(self) -> Iterator[Binding]:
        return iter(self.bindings)

    def __len__(self) -> int:
        return len(self.bindings)

    def get(self, binding_id: str) -> Binding | None:
        return next((b for b in self.bindings if b.id == binding_id), None)


def load_bindings_manifest(path: str | os.PathLike) -> BindingsManifest:
    """Read and validate a kernel bindings manifest (does not load any DSO)."""
    return BindingsManifest.load(path)


def open_bound_bundle(bundle_path: str | os.PathLike, kernel_bindings: str | os.PathLike | None) -> Any:
    """open_bundle for a pipeline that `kernel_bindings` will bind: the manifest's own faults (its JSON, fields,
    library paths) need no bundle, so they are said before the bundle's integrity hash (seconds on an
    8B-sized bundle); which slots it binds is checked once the bundle is open."""
    from ..bundle.container import open_bundle

    if kernel_bindings is not None:
        load_bindings_manifest(kernel_bindings)
    return open_bundle(bundle_path)


# ---------------------------------------------------------------- binding


def _announce_once(library: Path, binding_id: str, announce: Callable[[str], None]) -> None:
    key = str(library)
    with _announce_lock:
        if key in _announced:
            return
        _announced.add(key)
    announce(f"loading native code from {library} ({binding_id}): load only DSOs you trust")


def _load_function(library: Path, function: str, binding_id: str) -> tuple[Any, Any]:
    import tvm_ffi

    from ..kernels.dso import check_before_load, note_loaded

    check_before_load(library, f"binding {binding_id}")  # before dlopen: a bad file must not crash us
    try:
        module = tvm_ffi.load_module(str(library))
        note_loaded(library)
    except Exception as e:  # noqa: BLE001 - tvm_ffi raises RuntimeError with the dlopen message
        detail = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{library}: cannot load DSO for binding {binding_id} ({detail}); "
            f"give a TVM-FFI shared library built for this machine"
        ) from None
    try:
        present = module.implements_function(function)
    except Exception:  # noqa: BLE001
        present = True  # fall back to the lookup below
    func = None
    if present:
        try:
            func = module.get_function(function)
        except (AttributeError, RuntimeError):
            func = None
    if func is None:
        raise UserError(
            f"{library}: function {function!r} not found in the DSO for binding {binding_id}; "
            f"export it with TVM_FFI_DLL_EXPORT_TYPED_FUNC or fix field function in the manifest"
        )
    return module, func


def _slots_named(group: Sequence[SlotKey]) -> str:
    if len(group) == 1:
        return group[0].label
    return f"{group[0].binding_id} ({len(group)} slots: {', '.join(s.label for s in group)})"


@dataclass(frozen=True)
class _Slot:
    """What binding reads of a slot given as a plain dict (scripts, tests)."""

    binding_id: str
    abi_sha256: str
    engine_role: str
    label: str


def _slot_key(slot: SlotRecord | Mapping[str, Any], i: int) -> SlotKey:
    if isinstance(slot, SlotRecord):
        return slot
    if not isinstance(slot, Mapping) or not all(
        isinstance(slot.get(k), str) for k in ("binding_id", "abi_sha256", "engine_role")
    ):
        raise UserError(
            f"bundle kernel_slots[{i}] is malformed (needs binding_id, abi_sha256, engine_role); "
            f"rebuild the bundle with `mcore build`"
        )
    rec = slot.get("recipe")
    inst = rec.get("instance") if isinstance(rec, Mapping) else None
    bid = slot["binding_id"]
    return _Slot(bid, slot["abi_sha256"], slot["engine_role"], f"{bid} [{inst}]" if inst else bid)


def bind_slots(
    manifest_path: str | os.PathLike | None,
    slots: Sequence[SlotRecord | Mapping[str, Any]],
    announce: Callable[[str], None] = print_to_stderr,
) -> dict[str, BoundKernel]:
    """Bind every slot of a bundle exactly once; return {binding_id: BoundKernel}.

    `slots` are the bundle's kernel slots (SlotRecords; a plain dict needs at least binding_id,
    abi_sha256, engine_role). Everything is checked before any DSO is loaded; then each named
    library is announced once per process through `announce` and loaded. Fails closed naming the slot.
    """
    groups, entries = _checked(manifest_path, slots)
    bound: dict[str, BoundKernel] = {}
    for sid in groups:
        b = entries[sid]
        _announce_once(b.library_path, sid, announce)
        if b.library_sha256 is not None:  # before dlopen: only the bytes the manifest names may run
            check_sha256(b.library_path, b.library_sha256, f"binding {sid}")
        module, func = _load_function(b.library_path, b.function, sid)
        bound[sid] = BoundKernel(sid, b.abi_sha256, b.library_path, b.function, func, module)
    return bound


def check_bindings(manifest_path: str | os.PathLike | None, slots: Sequence[SlotRecord | Mapping[str, Any]]) -> None:
    """Every check bind_slots makes before it loads a DSO, loading nothing: for a verb that loads
    something long first (`verify logits` its native pipeline) to fail in a second, not after it."""
    _checked(manifest_path, slots)


def _checked(
    manifest_path: str | os.PathLike | None, slots: Sequence[SlotRecord | Mapping[str, Any]]
) -> tuple[dict[str, list[SlotKey]], dict[str, Binding]]:
    """The slots grouped by binding ID and the manifest entry for each, every check made."""
    keys = [_slot_key(s, i) for i, s in enumerate(slots)]
    # One entry binds every slot sharing its binding ID and ABI hash (e.g. all layers' attention).
    groups = slot_groups(keys)
    if manifest_path is None:
        if groups:
            raise _not_bound(next(iter(groups.values())))
        return groups, {}
    return groups, _matched_entries(manifest_path, groups)


def _not_bound(group: Sequence[SlotKey]) -> UserError:
    slot = group[0]
    return UserError(
        f"slot {_slots_named(group)} (engine role {slot.engine_role}) is not bound; pass "
        f"--kernel-bindings with an entry for it (id {slot.binding_id}, abi_sha256 {slot.abi_sha256})"
    )


def _matched_entries(manifest_path: str | os.PathLike, groups: Mapping[str, Sequence[SlotKey]]) -> dict[str, Binding]:
    """The manifest's entries by binding ID, once each matches the bundle both ways (no unknown entry, no
    unbound slot), with the slot's ABI hash and a library file on disk; nothing is loaded yet."""
    bindings = load_bindings_manifest(manifest_path)
    entries = {b.id: b for b in bindings}
    for b in bindings:
        if b.id not in groups:
            known = ", ".join(sorted(groups)) or "none"
            raise UserError(
                f"{manifest_path}: unknown binding {b.id}: the bundle has no slot with that ID "
                f"(its slots: {known}); remove the entry or use the matching bundle"
            )
    for sid, group in groups.items():
        slot, entry = group[0], entries.get(sid)
        if entry is None:
            raise _not_bound(group)
        if entry.abi_sha256 != slot.abi_sha256:
            raise UserError(
                f"slot {_slots_named(group)}: ABI hash mismatch: manifest has {entry.abi_sha256} but the bundle slot "
                f"expects {slot.abi_sha256}; use the abi_sha256 from the selection receipt"
            )
        if not entry.library_path.is_file():
            raise UserError(
                f"{entry.library_path}: DSO for slot {sid} not found; copy the kernel library there "
                f"or fix field library in {manifest_path}"
            )
    return entries
