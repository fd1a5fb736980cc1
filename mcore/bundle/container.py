"""The bundle container (DESIGN.md §6): one file, written atomically, integrity-checked at load.

File format
-----------
A bundle is a plain, uncompressed POSIX tar archive (readable with `tar tf`), written
deterministically by this module (fixed header fields: mtime 0, mode 0644, uid/gid 0):

1. `manifest.json` — always the first member (UTF-8 JSON; `kind`, `schema_version`,
   `kernel_slots`, and whatever the builder records).
2. the members, in the order given to `write_bundle` (simple relative names such as
   `decode.weights.safetensors` or `roles/decode.pt2`; no absolute paths, no `.`/`..`).
3. `integrity.json` — always the last member: canonical JSON
   `{"algorithm": "sha256", "kind": "mcore.bundle.integrity", "schema_version": 1,
     "members": [{"name", "size", "sha256"}, ...],     # every member incl. manifest.json, in order
     "prefix_bytes": N, "prefix_sha256": H}`          # sha256 of file bytes [0, N)
   where N is the offset of the `integrity.json` header, i.e. the prefix covers every earlier
   header, content byte and padding byte.
4. the tar end-of-archive marker (two zero blocks), and nothing after it.

Why tar and not a custom framing: any user can list or unpack a bundle with standard tools,
while the framing is still fully under our control (we write every header ourselves through
`tarfile.TarInfo.tobuf`, so the layout is deterministic and members stream straight from disk).

Why every flipped byte is detected: bytes [0, N) are covered by `prefix_sha256`. The tail
(`integrity.json` header, its content, padding, the end marker) is regenerated at load from the
parsed integrity record and compared byte for byte with the file, and the parsed record must
match what the loader recomputed (member list, sizes, hashes, N, prefix hash) field by field.
A change anywhere therefore either breaks parsing, changes a hash, or changes the tail.
Truncation and appended bytes fail the same tail comparison.

Members are streamed in chunks while being hashed, so a multi-GB weights file is never held in
memory by the writer; the loader verifies in one sequential pass with bounded memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..common.errors import UserError
from ..common.fileio import atomic_write, canonical_json
from ..common.progress import Progress
from .manifest import BUNDLE_KIND, BUNDLE_SCHEMA_VERSION, BundleManifest

INTEGRITY_KIND = "mcore.bundle.integrity"
INTEGRITY_SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
INTEGRITY_NAME = "integrity.json"
RESERVED_NAMES = (MANIFEST_NAME, INTEGRITY_NAME)

BLOCK = tarfile.BLOCKSIZE  # 512
CHUNK = 8 << 20  # streaming chunk size (8 MiB)
MAX_INTEGRITY_BYTES = 64 << 20  # a sane upper bound for the integrity record
_NAME_PART_RE = re.compile(r"^[A-Za-z0-9_.@+-]+$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")

Member = bytes | bytearray | memoryview | str | os.PathLike


# ---------------------------------------------------------------- helpers


def check_member_name(name: Any) -> str:
    """A simple relative name: parts of letters, digits and `_ . @ + -`, joined by `/`, never
    `.` or `..`, at most 100 bytes (one plain tar header)."""
    if not isinstance(name, str) or not name:
        raise UserError(f"bundle member name {name!r} is invalid; use a simple relative file name")
    parts = name.split("/")
    if (
        len(name.encode("utf-8")) > 100
        or name.startswith("/")
        or any(p in ("", ".", "..") or not _NAME_PART_RE.match(p) for p in parts)
    ):
        raise UserError(
            f"bundle member name {name!r} is invalid; use a simple relative name "
            f"(letters, digits, _ . @ + -, optional sub/folder, no '..', at most 100 bytes)"
        )
    if name in RESERVED_NAMES:
        raise UserError(f"bundle member name {name!r} is reserved; choose another name")
    return name


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    # PAX format: a plain ustar header unless the size needs more than 11 octal digits (>= 8 GiB),
    # in which case a pax extended header carries the size.
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def _integrity_tail(record_bytes: bytes) -> bytes:
    """Everything from the integrity.json header to the end of the file."""
    return (
        _tar_header(INTEGRITY_NAME, len(record_bytes))
        + record_bytes
        + _padding(len(record_bytes))
        + b"\0" * (2 * BLOCK)
    )


def _check_manifest_shape(manifest: Any, where: str) -> None:
    """A bundle manifest as the container reads it; each phase names what is wrong and says to rebuild."""
    _check_manifest_header(manifest, where)
    _check_manifest_fields(manifest, where)
    _check_manifest_slots(manifest, where)


def _check_manifest_header(manifest: Any, where: str) -> None:
    """A JSON object of this kind and schema version, with a kernel_slots list."""
    if not isinstance(manifest, dict):
        raise UserError(f"{where}: bundle manifest must be a JSON object")
    for field in ("kind", "schema_version", "kernel_slots"):
        if field not in manifest:
            raise UserError(f"{where}: bundle manifest lacks field {field!r}; rebuild it with `mcore build`")
    if manifest["kind"] != BUNDLE_KIND:
        raise UserError(
            f"{where}: not an mcore bundle (manifest kind is {manifest['kind']!r}, "
            f"expected {BUNDLE_KIND!r}); give a bundle written by `mcore build`"
        )
    sv = manifest["schema_version"]
    if isinstance(sv, bool) or sv != BUNDLE_SCHEMA_VERSION:
        raise UserError(
            f"{where}: bundle schema_version {sv!r} is not supported (this mcore reads "
            f"{BUNDLE_SCHEMA_VERSION}); rebuild it with `mcore build`"
        )
    if not isinstance(manifest["kernel_slots"], list):
        raise UserError(f"{where}: bundle manifest field kernel_slots must be a list; rebuild it with `mcore build`")


def _check_manifest_fields(manifest: dict, where: str) -> None:
    """The optional fields a reader relies on: their types, family_kind's value, roles' entries."""
    rebuild = "; rebuild it with `mcore build`"
    for name, types in _MANIFEST_TYPES.items():
        if name in manifest and not isinstance(manifest[name], types):
            want = " or ".join("null" if t is type(None) else _TYPE_WORDS[t] for t in types)
            raise UserError(
                f"{where}: bundle manifest field {name} must be {want}, got {type(manifest[name]).__name__}{rebuild}"
            )
    if "family_kind" in manifest and manifest["family_kind"] not in ("decoder", "encoder"):
        raise UserError(
            f"{where}: bundle manifest field family_kind {manifest['family_kind']!r} must be decoder or "
            f"encoder{rebuild}"
        )
    roles = manifest.get("roles")
    if roles is not None and not all(isinstance(r, dict) for r in roles.values()):
        raise UserError(f"{where}: bundle manifest field roles must map each engine role to an object{rebuild}")


def _check_manifest_slots(manifest: dict, where: str) -> None:
    """Each kernel slot: an object with string binding_id, abi_sha256 and engine_role, in a role the bundle has."""
    rebuild = "; rebuild it with `mcore build`"
    roles = manifest.get("roles")
    for i, slot in enumerate(manifest["kernel_slots"]):
        sw = f"{where}: bundle manifest kernel_slots[{i}]"
        if not isinstance(slot, dict):
            raise UserError(f"{sw} must be an object{rebuild}")
        for k in ("binding_id", "abi_sha256", "engine_role"):
            if not isinstance(slot.get(k), str):
                raise UserError(f"{sw}: field {k} must be a string{rebuild}")
        # a slot in a role the bundle does not have could never run: refuse it at load, not at bind
        if roles is not None and slot["engine_role"] not in roles:
            raise UserError(
                f"{sw} (binding {slot['binding_id']}): engine role {slot['engine_role']!r} does not "
                f"exist in this bundle (roles: {', '.join(roles) or 'none'}){rebuild}"
            )


# The manifest fields a reader relies on, type-checked when present (the container itself needs
# only kind, schema_version and kernel_slots).
_MANIFEST_TYPES: dict[str, tuple[type, ...]] = {
    "engine": (str,),
    "family": (str,),
    "family_kind": (str,),
    "model": (dict,),
    "build_args": (dict,),
    "graph_args": (dict,),
    "device": (str, type(None)),
    "roles": (dict,),
    "weights": (dict,),
    "special_tokens": (dict,),
    "tool_versions": (dict,),
    "built_on": (dict,),
}
_TYPE_WORDS: dict[type, str] = {str: "a string", dict: "an object", list: "a list"}


class _HashingWriter:
    """Forwards writes to `f`, hashing and counting every byte (the prefix hash)."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.sha = hashlib.sha256()
        self.count = 0

    def write(self, data) -> None:
        self.f.write(data)
        self.sha.update(data)
        self.count += len(data)


# ---------------------------------------------------------------- writing


def write_bundle(
    path: str | os.PathLike, manifest: dict, members: Mapping[str, Member], progress: Progress | None = None
) -> Path:
    """Write a bundle atomically (temp file beside `path`, fsync, rename) and return its path.

    `members` maps a name to bytes or to a file path (streamed from disk in chunks).
    Nothing is left behind when this raises or `progress` is cancelled.
    """
    path = Path(path)
    _check_manifest_shape(manifest, str(path))
    try:
        manifest_bytes = (json.dumps(manifest, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: bundle manifest is not valid JSON data ({e})") from None
    # Validate everything before the temp file exists.
    plan = [(MANIFEST_NAME, manifest_bytes, len(manifest_bytes)), *_member_plan(members)]
    total = sum(size for _, _, size in plan) or 1
    prog = progress or Progress()
    atomic_write(path, lambda f: _BundleBody(f, total, prog).write(plan), binary=True)
    _fsync_dir(path.parent if str(path.parent) else Path("."))
    return path


def _member_plan(members: Mapping[str, Member]) -> list[tuple[str, Any, int]]:
    """(name, bytes view or file path, size) per member: names checked, files present, nothing written yet."""
    plan: list[tuple[str, Any, int]] = []
    for name, src in members.items():
        check_member_name(name)
        if isinstance(src, (bytes, bytearray, memoryview)):
            plan.append((name, memoryview(src).cast("B"), memoryview(src).nbytes))
        elif isinstance(src, (str, os.PathLike)):
            p = Path(src)
            if not p.is_file():
                raise UserError(f"{p}: file for bundle member {name!r} not found; check the path")
            plan.append((name, p, p.stat().st_size))
        else:
            raise UserError(f"bundle member {name!r}: expected bytes or a file path, got {type(src).__name__}")
    return plan


class _BundleBody:
    """Writes the tar members and then the integrity tail: each member's hash and the hash of every byte before it."""

    def __init__(self, f: BinaryIO, total: int, prog: Progress):
        self.f = f
        self.out = _HashingWriter(f)
        self.total = total
        self.prog = prog
        self.done = 0  # member bytes written so far, for progress

    def write(self, plan: list[tuple[str, Any, int]]) -> None:
        _default_mode(self.f)
        entries = []
        for name, src, size in plan:
            self.prog.report(f"writing {name}", self.done / self.total)
            self.out.write(_tar_header(name, size))
            sha = hashlib.sha256()
            if isinstance(src, Path):
                self._copy_file(name, src, size, sha)
            else:
                for start in range(0, size, CHUNK):
                    self._put(name, src[start : start + CHUNK], sha)
            self.out.write(_padding(size))
            entries.append({"name": name, "size": size, "sha256": sha.hexdigest()})
        record = {
            "algorithm": "sha256",
            "kind": INTEGRITY_KIND,
            "schema_version": INTEGRITY_SCHEMA_VERSION,
            "members": entries,
            "prefix_bytes": self.out.count,
            "prefix_sha256": self.out.sha.hexdigest(),
        }
        self.f.write(_integrity_tail(canonical_json(record).encode("ascii")))
        self.prog.report("finishing bundle", 1.0)

    def _put(self, name: str, chunk, sha) -> None:
        self.out.write(chunk)
        sha.update(chunk)
        self.done += len(chunk)
        self.prog.report(f"writing {name}", self.done / self.total)

    def _copy_file(self, name: str, src: Path, size: int, sha) -> None:
        """Stream a file member; it must still have the size it had when planned (the header says so)."""
        written = 0
        with open(src, "rb") as inp:
            while written < size:
                chunk = inp.read(min(CHUNK, size - written))
                if not chunk:
                    break
                self._put(name, chunk, sha)
                written += len(chunk)
            if written != size or inp.read(1):
                raise UserError(f"{src}: file changed while it was being written into the bundle; run the build again")


def _default_mode(f: BinaryIO) -> None:
    """Temp files are created 0600; give the bundle the usual 0666 & ~umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        os.fchmod(f.fileno(), 0o666 & ~umask)
    except (OSError, AttributeError):
        pass


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Entry:
    name: str
    offset: int  # file offset of the content
    size: int
    sha256: str


class Bundle:
    """A verified bundle. `manifest` is the parsed manifest.json; members are read on demand
    (each read re-checks the member's sha256, so a file changed after opening is caught)."""

    def __init__(self, path: Path, manifest: dict, entries: list[_Entry]):
        self.path = path
        self.manifest = manifest
        self._entries = {e.name: e for e in entries}
        self._order = [e.name for e in entries]
        self._runnable: BundleManifest | None = None

    def runnable(self) -> BundleManifest:
        """The manifest checked for running or describing the bundle (parsed once, then kept)."""
        if self._runnable is None:
            self._runnable = BundleManifest.from_dict(self.manifest, str(self.path))
        return self._runnable

    def names(self) -> list[str]:
        """Member names in file order (without manifest.json and integrity.json)."""
        return [n for n in self._order if n not in RESERVED_NAMES]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UserError(f"{self.path}: bundle has no member {name!r}; rebuild it with `mcore build`") from None

    def size(self, name: str) -> int:
        return self._entry(name).size

    def sha256(self, name: str) -> str:
        return self._entry(name).sha256

    def read(self, name: str) -> bytes:
        """The member's bytes (verified against its recorded sha256)."""
        e = self._entry(name)
        try:
            with open(self.path, "rb") as f:
                f.seek(e.offset)
                data = f.read(e.size)  # buffered read(n): one allocation of n bytes, loops over short reads
        except OSError as err:
            raise UserError(f"{self.path}: cannot read bundle: {err}") from None
        if len(data) != e.size or hashlib.sha256(data).hexdigest() != e.sha256:
            raise _damaged(self.path, f"member {name} changed after the bundle was opened")
        return data

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, members={self.names()!r})"


def _damaged(path: Path, reason: str) -> UserError:
    return UserError(f"{path}: bundle is damaged ({reason}); rebuild it with `mcore build`")


def _parse_integrity(raw: bytes) -> dict:
    try:
        record = json.loads(raw.decode("ascii"), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("integrity record is not valid JSON") from None
    if not isinstance(record, dict) or canonical_json(record).encode("ascii") != raw:
        raise ValueError("integrity record is not in canonical form")
    if set(record) != {"algorithm", "kind", "schema_version", "members", "prefix_bytes", "prefix_sha256"}:
        raise ValueError("integrity record has unexpected fields")
    if (
        record["algorithm"] != "sha256"
        or record["kind"] != INTEGRITY_KIND
        or record["schema_version"] != INTEGRITY_SCHEMA_VERSION
    ):
        raise ValueError("integrity record kind/version/algorithm not recognized")
    pb = record["prefix_bytes"]
    if isinstance(pb, bool) or not isinstance(pb, int) or pb < 0 or pb % BLOCK:
        raise ValueError("integrity record has a bad prefix length")
    if not isinstance(record["prefix_sha256"], str) or not _HEX64_RE.match(record["prefix_sha256"]):
        raise ValueError("integrity record has a bad prefix hash")
    members = record["members"]
    if not isinstance(members, list) or not members:
        raise ValueError("integrity record has no member list")
    for m in members:
        if (
            not isinstance(m, dict)
            or set(m) != {"name", "size", "sha256"}
            or not isinstance(m["name"], str)
            or isinstance(m["size"], bool)
            or not isinstance(m["size"], int)
            or m["size"] < 0
            or not isinstance(m["sha256"], str)
            or not _HEX64_RE.match(m["sha256"])
        ):
            raise ValueError("integrity record has a malformed member entry")
    return record


def open_bundle(path: str | os.PathLike, progress: Progress | None = None) -> Bundle:
    """Verify a bundle's integrity (every byte), then its manifest kind and schema; return it.

    The file is read once, front to back: every member's bytes are hashed as they stream by, and
    the manifest (the first member) is kept from that same pass but parsed only after every hash
    matched the integrity record."""
    if not str(path):  # Path("") is "."
        raise UserError("the bundle path is empty; give a bundle written by `mcore build`")
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: bundle not found; check the path")
    if not path.is_file():
        raise UserError(f"{path}: is not a file; give a bundle written by `mcore build`")
    prog = progress or Progress()
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            _check_tar_header(f.read(BLOCK), path)
            f.seek(0)
            infos, record = _read_integrity(f, path, file_size)
            hasher = _PrefixHasher(f, path, record["prefix_bytes"], prog)
            computed, manifest_raw = hasher.hash_members(infos[:-1])
            _check_against_record(path, record, hasher.prefix_sha.hexdigest(), computed)
    except OSError as e:
        raise UserError(f"{path}: cannot read bundle: {e}") from None
    manifest = _parse_manifest(path, computed, manifest_raw)
    prog.report("verifying bundle", 1.0)
    return Bundle(path, manifest, computed)


BLOCK = 512  # one tar header block


def _check_tar_header(head: bytes, path: Path) -> None:
    """A file that is plainly something else (a receipt or snapshot given by mistake, a DSO, nothing) is
    named so, not called damaged with advice to rebuild. Any other bad start is left to the tar parse:
    a bundle with a damaged first block is still a damaged bundle."""
    stripped = head.lstrip()
    if not head:
        what = "empty"
    elif stripped[:1] in (b"{", b"["):
        what = "a JSON file"
    elif head[:4] == b"\x7fELF":
        what = "an ELF file: a DSO goes in --kernel-bindings"
    else:
        return
    raise UserError(f"{path}: not a bundle ({what}); give a bundle written by `mcore build`")


def _read_integrity(f: BinaryIO, path: Path, file_size: int) -> tuple[list[tarfile.TarInfo], dict]:
    """(the tar member list, the parsed integrity record), the file's tail checked against the record.

    Only headers and the small integrity member are read here; member contents are skipped."""
    # 1. Structure: the tar member list (headers only; contents are skipped).
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            infos = tar.getmembers()
    except Exception as e:  # noqa: BLE001 - any parse failure means "not a sound bundle"
        raise _damaged(path, f"not a bundle file: {e}") from None
    if not infos or infos[-1].name != INTEGRITY_NAME:
        raise _damaged(path, "integrity record missing; the file is truncated or not a bundle")
    integ = infos[-1]
    if not integ.isreg() or integ.size > MAX_INTEGRITY_BYTES or integ.offset_data + integ.size > file_size:
        raise _damaged(path, "integrity record is malformed")
    f.seek(integ.offset_data)
    raw = f.read(integ.size)
    try:
        record = _parse_integrity(raw)
    except ValueError as e:
        raise _damaged(path, str(e)) from None
    prefix_bytes = record["prefix_bytes"]
    # 2. The tail must be exactly what the writer produces for this record.
    expected_tail = _integrity_tail(raw)
    f.seek(prefix_bytes)
    tail = f.read(len(expected_tail) + 1)
    if integ.offset != prefix_bytes or tail != expected_tail:
        raise _damaged(path, "integrity record or end of file does not match (truncated or altered)")
    return infos, record


class _PrefixHasher:
    """3. One sequential pass over bytes [0, prefix_bytes): every byte feeds the prefix hash, a
    member's content also feeds its own hash, and the first member (the manifest) is kept."""

    def __init__(self, f: BinaryIO, path: Path, prefix_bytes: int, prog: Progress):
        self.f, self.path, self.prefix_bytes, self.prog = f, path, prefix_bytes, prog
        self.prefix_sha = hashlib.sha256()
        self.pos = 0

    def hash_members(self, members: list[tarfile.TarInfo]) -> tuple[list[_Entry], bytes]:
        """(each member's entry with its computed sha256, the manifest's bytes)."""
        computed: list[_Entry] = []
        manifest_raw = b""
        self.f.seek(0)
        for i, info in enumerate(members):
            start, size = info.offset_data, info.size
            if not info.isreg() or start < self.pos or start + size > self.prefix_bytes:
                raise _damaged(self.path, f"member {info.name!r} has a bad header")
            self._take(start - self.pos)
            sha = hashlib.sha256()
            keep = bytearray() if i == 0 else None
            self._take(size, sha, keep)
            if keep is not None:
                manifest_raw = bytes(keep)
            computed.append(_Entry(info.name, start, size, sha.hexdigest()))
        self._take(self.prefix_bytes - self.pos)
        return computed, manifest_raw

    def _take(self, n: int, member_sha: Any = None, keep: bytearray | None = None) -> None:
        """Read the next n bytes in chunks (bounded memory), hashing each chunk."""
        while n > 0:
            chunk = self.f.read(min(CHUNK, n))
            if not chunk:
                raise _damaged(self.path, "file ends early")
            self.prefix_sha.update(chunk)
            if member_sha is not None:
                member_sha.update(chunk)
            if keep is not None:
                keep += chunk
            n -= len(chunk)
            self.pos += len(chunk)
            self.prog.report("verifying bundle", self.pos / max(self.prefix_bytes, 1))


def _check_against_record(path: Path, record: dict, prefix_sha256: str, computed: list[_Entry]) -> None:
    """What the pass computed must be what the integrity record says: prefix hash, then the member list."""
    if prefix_sha256 != record["prefix_sha256"]:
        raise _damaged(path, "checksum mismatch")
    expected = [(m["name"], m["size"], m["sha256"]) for m in record["members"]]
    got = [(e.name, e.size, e.sha256) for e in computed]
    if got != expected:
        missing = sorted({n for n, _, _ in expected} - {n for n, _, _ in got})
        raise _damaged(path, f"member {missing[0]} missing" if missing else "member checksum mismatch")


def _parse_manifest(path: Path, computed: list[_Entry], manifest_raw: bytes) -> dict:
    """The manifest (verified bytes from the pass), parsed and checked for kind and schema."""
    if not computed or computed[0].name != MANIFEST_NAME:
        raise _damaged(path, "manifest.json is not the first member")
    try:
        manifest = json.loads(manifest_raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _damaged(path, f"manifest.json is not valid JSON: {e}") from None
    except RecursionError:
        raise _damaged(path, "manifest.json is nested too deeply") from None
    _check_manifest_shape(manifest, str(path))
    return manifest
