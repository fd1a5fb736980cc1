"""Checks on a DSO before it is dlopen'ed (DESIGN.md: loading a DSO runs native code).

- The file must be a complete ELF shared object for this machine: a truncated library maps
  fine and then dies with SIGBUS when the loader touches a missing page, so the header tables
  and loadable segments are checked against the file size first.
- A library path this process already loaded is not loaded again by dlopen (it hands back the
  old mapping): if the file changed since (size, mtime, inode), say so instead of silently
  running the old code.
"""

from __future__ import annotations

import hashlib
import os
import platform
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..common.errors import UserError

_ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "s390x": 22, "riscv64": 243}
_PT_LOAD = 1

_loaded: dict[str, tuple[int, int, int, int]] = {}
_lock = threading.Lock()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _ElfHeader(NamedTuple):
    is64: bool
    end: str  # struct byte order: "<" or ">"
    phoff: int
    phentsize: int
    phnum: int
    shoff: int
    shentsize: int
    shnum: int


def check_elf(path: Path, what: str) -> None:
    """A one-line UserError unless `path` is a whole ELF shared object for this machine."""

    def bad(why: str) -> UserError:
        return UserError(f"{path}: {why}; {what}: give a complete TVM-FFI shared library built for this machine")

    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            h = _elf_header(f.read(64), bad)
            _check_tables_fit(h, size, bad)
            f.seek(h.phoff)
            _check_segments_fit(h, f.read(h.phnum * h.phentsize), size, bad)
    except OSError as e:
        raise UserError(f"{path}: cannot read the DSO ({e.strerror or e}); {what}") from None
    except struct.error:
        raise bad("truncated or malformed ELF tables") from None


def _elf_header(head: bytes, bad: Callable[[str], UserError]) -> _ElfHeader:
    """The ELF header's table positions, once it is a shared object for this machine and word size."""
    if head[:4] != b"\x7fELF":
        raise bad("not an ELF shared library (bad magic)")
    if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise bad("truncated or malformed ELF header")
    is64, end = head[4] == 2, "<" if head[5] == 1 else ">"
    if is64 and len(head) < 64:
        raise bad("truncated ELF header")
    if is64:
        e_type, e_machine = struct.unpack_from(end + "HH", head, 16)
        e_phoff, e_shoff = struct.unpack_from(end + "QQ", head, 32)
        e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from(end + "HHHH", head, 54)
    else:
        e_type, e_machine = struct.unpack_from(end + "HH", head, 16)
        e_phoff, e_shoff = struct.unpack_from(end + "II", head, 28)
        e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from(end + "HHHH", head, 42)
    if e_type != 3:  # ET_DYN
        raise bad("not a shared object (ELF type is not ET_DYN)")
    want = _ELF_MACHINES.get(platform.machine().lower())
    if want is not None and e_machine != want:
        raise bad(f"built for another machine (ELF machine {e_machine}, this is {platform.machine()})")
    if is64 != (sys.maxsize > 2**32):
        raise bad("built for another word size (32/64-bit)")
    return _ElfHeader(is64, end, e_phoff, e_phentsize, e_phnum, e_shoff, e_shentsize, e_shnum)


def _check_tables_fit(h: _ElfHeader, size: int, bad: Callable[[str], UserError]) -> None:
    for name, off, n, entsize in (
        ("program header", h.phoff, h.phnum, h.phentsize),
        ("section header", h.shoff, h.shnum, h.shentsize),
    ):
        if n and off + n * entsize > size:
            raise bad(f"truncated: its {name} table ends at byte {off + n * entsize} but the file has {size} bytes")


def _check_segments_fit(h: _ElfHeader, table: bytes, size: int, bad: Callable[[str], UserError]) -> None:
    """Every loadable segment's bytes must be in the file (the loader maps them)."""
    for i in range(h.phnum):
        if h.is64:
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(h.end + "IIQQQQ", table, i * h.phentsize)
        else:
            p_type, p_offset, _, _, p_filesz = struct.unpack_from(h.end + "IIIII", table, i * h.phentsize)
        if p_type == _PT_LOAD and p_offset + p_filesz > size:
            raise bad(f"truncated: a loadable segment ends at byte {p_offset + p_filesz} but the file has {size} bytes")


def library_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a DSO's bytes, as a bindings manifest's `library_sha256` records it."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise UserError(f"{path}: cannot read the DSO ({e.strerror or e})") from None
    return h.hexdigest()


def check_sha256(path: Path, sha256: str, what: str) -> None:
    """Before dlopen, when a bindings manifest pins the DSO's bytes (`library_sha256`)."""
    if library_sha256(path) != sha256:
        raise UserError(
            f"{path}: the DSO's sha256 is not the library_sha256 the bindings manifest gives ({what}); "
            f"the library was replaced or rebuilt: bind the one you meant, or update library_sha256 "
            f"(`sha256sum {path.name}`)"
        )


def check_before_load(path: Path, what: str) -> None:
    """Everything checked before dlopen: ELF soundness, and that a library this process already
    loaded from `path` is still the same file."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise UserError(f"{path}: cannot read the DSO ({e.strerror or e}); {what}") from None
    with _lock:
        before = _loaded.get(str(path))
    if before is not None and before != _identity(st):
        raise UserError(
            f"{path}: the library changed on disk after this process loaded it; the loader would "
            f"run the old code ({what}); restart the process (or the workbench) to load the new build"
        )
    if before is None:
        check_elf(path, what)


def note_loaded(path: Path) -> None:
    """Remember which file `path` was when it was loaded."""
    try:
        st = os.stat(path)
    except OSError:
        return
    with _lock:
        _loaded.setdefault(str(path), _identity(st))
