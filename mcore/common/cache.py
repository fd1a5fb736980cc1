"""The caches under $MCORE_CACHE_DIR that hold code: who may write them, and what each entry is.

Captured programs (`exported/`), precompiled roles (`compiled/`) and Inductor's own cache
(`inductor/`) are loaded with pickle: whoever can write them can run code in every later
`mcore run`. So (docs/trust.md):

- A cache folder is used only when it and every folder from $MCORE_CACHE_DIR down to it is a real
  folder (not a symlink), owned by this user (or root) and not writable by group or others, as
  ssh's StrictModes asks of ~/.ssh. mcore creates them owner-only (0700, files 0600). Where one
  is not, the run compiles into a private fresh folder instead and says once what to fix.
- Each entry carries a record (JSON, read without pickle) of what it was made from and the
  sha256 of each of its files; both are checked before anything is unpickled, and an entry that
  does not match is captured or compiled afresh with a one-line note. The record is not a
  signature: it tells a damaged, stale, swapped or foreign entry from a good one; the folder
  checks keep other users out.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import printable
from .fileio import canonical_json

ENTRY_KIND = "mcore.cache_entry"
ENTRY_SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 256 << 20  # a role record holds its snapshot: large for 8B-deep graphs, never this large
_CHUNK = 8 << 20

_private: dict[str, Path] = {}  # cache name -> this process's private fallback folder
_noted: set[str] = set()


def cache_root() -> Path:
    from ..families.demo import cache_root as root

    return root()


def _default_note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_note_sink: Callable[[str], None] = _default_note


def set_cache_note_sink(sink: Callable[[str], None] | None) -> None:
    """Where cache notes go (stderr by default; the workbench sends them to its log)."""
    global _note_sink
    _note_sink = sink or _default_note


def note(line: str) -> None:
    """A one-line note about a cache, said once per process."""
    if line in _noted:
        return
    _noted.add(line)
    _note_sink(printable(line))


def _uid() -> int:
    return os.geteuid()


def unsafe_reason(path: Path, is_dir: bool = True) -> str | None:
    """Why `path` may not hold trusted cache content, or None when it may."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be checked ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (fix: replace it with a real {'folder' if is_dir else 'file'})"
    if is_dir and not stat.S_ISDIR(st.st_mode):
        return "is not a folder (fix: remove it)"
    if not is_dir and not stat.S_ISREG(st.st_mode):
        return "is not a regular file (fix: remove it)"
    if st.st_uid not in (_uid(), 0):
        return f"is owned by uid {st.st_uid}, not by you (fix: remove it, or chown it to yourself)"
    if st.st_mode & 0o022:
        return f"is writable by group or others (fix: chmod go-w {path})"
    return None


def _make_checked(root: Path, parts: tuple[str, ...]) -> tuple[Path, str] | None:
    """Create root/parts... owner-only where missing; (folder, why) for the first unsafe one."""
    here = root
    for part in ("", *parts):
        here = here / part if part else here
        try:
            if part:
                here.mkdir(mode=0o700)
            else:
                here.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        except OSError as e:
            return here, f"cannot be created ({e.strerror or e})"
        why = unsafe_reason(here)
        if why is not None:
            return here, why
    return None


def cache_dir(*parts: str) -> Path:
    """$MCORE_CACHE_DIR/parts..., created owner-only, when that folder and each one from
    $MCORE_CACHE_DIR down to it is safe (see the module doc); else this process's private fresh
    folder for it, with a one-line note saying what to fix."""
    name = "/".join(parts)
    if name in _private:
        return _private[name]
    root = cache_root()
    bad = _make_checked(root, parts)
    if bad is None:
        return root.joinpath(*parts)
    folder, why = bad
    private = Path(tempfile.mkdtemp(prefix=f"mcore-{'-'.join(parts)}-"))
    atexit.register(shutil.rmtree, private, True)
    _private[name] = private
    note(f"note: cache folder {folder} {why}; not using it: this run compiles into a private fresh folder")
    return private


def check_dir(path: Path, what: str) -> str | None:
    """For a cache folder someone else chose (TORCHINDUCTOR_CACHE_DIR): the one-line problem, or None."""
    why = unsafe_reason(path)
    return None if why is None else f"{what} {path} {why}"


# ---------------------------------------------------------------- entries


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _self_hash(record: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        canonical_json({k: v for k, v in record.items() if k != "record_sha256"}).encode()
    ).hexdigest()


def write_private(path: Path, write: Callable[[Path], object]) -> None:
    """Write a cache file owner-only and whole: `write(staged)` fills a temp file beside `path`."""
    staged = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # torch.export wants its suffix
    try:
        write(staged)
        os.chmod(staged, 0o600)
        os.replace(staged, path)
    finally:
        if staged.exists():
            staged.unlink()


def write_entry(record_path: Path, made_from: Mapping[str, Any], files: Mapping[str, Path], **extra: Any) -> None:
    """The record of an entry whose `files` are already written: what it was made from, each file's
    sha256 and size, `extra` (what a later load needs), and the record's own hash."""
    record: dict[str, Any] = {
        "kind": ENTRY_KIND,
        "schema_version": ENTRY_SCHEMA_VERSION,
        "made_from": dict(made_from),
        "files": {k: {"name": p.name, "sha256": file_sha256(p), "size": p.stat().st_size} for k, p in files.items()},
        **extra,
    }
    record["record_sha256"] = _self_hash(record)
    text = json.dumps(record, allow_nan=False)
    write_private(record_path, lambda p: p.write_text(text, encoding="utf-8"))


def read_entry(
    record_path: Path, made_from: Mapping[str, Any], files: Mapping[str, Path], ignore: tuple[str, ...] = ()
) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) when the entry at `record_path` was made from `made_from` (keys in `ignore`
    aside) and each of `files` has its recorded sha256; else (None, why), why None for no entry
    (or one an older mcore wrote, replaced without a word). Reads JSON and hashes bytes only:
    nothing is unpickled here."""
    if not record_path.exists() and not record_path.is_symlink():
        return None, None
    try:
        record = _parse_record(record_path)
    except _Legacy:
        return None, None
    except ValueError as e:
        return None, str(e)
    got = {k: v for k, v in record["made_from"].items() if k not in ignore}
    want = {k: v for k, v in made_from.items() if k not in ignore}
    if got != want:
        differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        return None, f"it was made from another {', '.join(differ)}"
    for key, path in files.items():
        why = _file_mismatch(record["files"].get(key), path)
        if why is not None:
            return None, why
    return record, None


def _parse_record(path: Path) -> dict[str, Any]:
    why = unsafe_reason(path, is_dir=False)
    if why is not None:
        raise ValueError(f"its record {why}")
    try:
        too_large = path.stat().st_size > MAX_RECORD_BYTES
        record = None if too_large else json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError, ValueError):
        raise ValueError("its record is unreadable") from None
    if too_large:
        raise ValueError("its record is too large")
    if isinstance(record, dict) and record.get("kind") in LEGACY_KINDS:
        raise _Legacy()
    if (
        not isinstance(record, dict)
        or record.get("kind") != ENTRY_KIND
        or record.get("schema_version") != ENTRY_SCHEMA_VERSION
        or not isinstance(record.get("made_from"), dict)
        or not isinstance(record.get("files"), dict)
    ):
        raise ValueError("its record is not a cache entry record of this mcore")
    try:
        if record.get("record_sha256") != _self_hash(record):
            raise ValueError("its record was edited (its own hash differs)")
    except (TypeError, ValueError) as e:
        raise ValueError(str(e) if "edited" in str(e) else "its record is unreadable") from None
    return record


LEGACY_KINDS = ("mcore.precompiled_role",)  # role records before entries carried their files' sha256


class _Legacy(ValueError):
    """A record an older mcore wrote: not used, replaced, not worth a note."""


def _file_mismatch(entry: Any, path: Path) -> str | None:
    if not isinstance(entry, dict) or entry.get("name") != path.name:
        return f"its record does not name {path.name}"
    why = unsafe_reason(path, is_dir=False)
    if why is not None:
        return f"{path.name} {why}"
    try:
        if path.stat().st_size != entry.get("size") or file_sha256(path) != entry.get("sha256"):
            return f"{path.name} differs from its record (sha256)"
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror or e})"
    return None


def read_checked(record: Mapping[str, Any], key: str, path: Path) -> bytes:
    """The bytes of file `key` of an entry whose record `read_entry` accepted, read once (never
    through a symbolic link) and checked against the record again: what the caller then unpickles
    is exactly what was checked, even where the file changed after `read_entry` hashed it.
    ValueError (why, one line) where they differ."""
    files = record.get("files")
    entry = files.get(key) if isinstance(files, dict) else None
    if not isinstance(entry, dict) or entry.get("name") != path.name:
        raise ValueError(f"its record does not name {path.name}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError(f"{path.name} cannot be read ({e.strerror or e})") from None
    if len(raw) != entry.get("size") or hashlib.sha256(raw).hexdigest() != entry.get("sha256"):
        raise ValueError(f"{path.name} differs from its record (sha256)")
    return raw


def stale(what: str, path: Path, why: str, redo: str) -> None:
    """The one-line note for an entry that is there but not used: `redo` says what happens instead."""
    note(f"note: cached {what} at {path} not used ({why}); {redo} afresh")
