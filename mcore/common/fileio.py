"""Atomic writes and strict JSON reading shared by every artifact writer/reader."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Set
from pathlib import Path
from typing import Any

from .errors import UserError, printable


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], binary: bool = False) -> Path:
    """Write through `write(fileobj)` into a temp file beside `path`, then rename.

    Nothing is left at `path` (or beside it) if `write` raises.
    """
    path = check_output_path(path)
    fd, tmp = _temp_beside(path)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it (mkstemp's 0600 is for secrets)
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):  # disk full, quota, I/O error: one line, nothing left behind
            raise write_error(path, e) from None
        raise
    return path


def _umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temp file next to `path` named `.NAME.PID.XXXX.tmp`; first remove the temp files of
    writers of `path` that died (kill -9, power loss) before they could clean up."""
    parent = path.parent if str(path.parent) else Path(".")
    prefix = f".{path.name}."
    try:
        for old in parent.glob(f"{_glob_escape(prefix)}*.tmp"):
            parts = old.name[len(prefix) : -len(".tmp")].split(".")  # exactly PID.RANDOM: ours, not `NAME.x`'s
            if len(parts) == 2 and parts[0].isdigit() and not _alive(int(parts[0])):
                try:
                    old.unlink()
                except OSError:
                    pass
        return tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise write_error(path, e) from None


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


# write failures that are about where the output goes (disk full, closed stdout), not a bug
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EBADF, errno.EFBIG, errno.EROFS}


# a path the user gave that no OS call can take: its name, not a traceback
_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.ELOOP}


def stdout_failed(prog: str, e: OSError) -> int:
    """A CLI's answer to stdout failing (disk full, closed descriptor): one line on stderr, exit 2,
    and stdout pointed at /dev/null so the interpreter's final flush cannot fail again. A path too
    long (or looping through symlinks) for any OS call is one line too. Other OSErrors are
    re-raised (they are bugs)."""
    if e.errno in _PATH_ERRNOS:
        name = printable(str(e.filename)[:80]) + ("..." if len(str(e.filename)) > 80 else "")
        print(f"{prog}: error: {name}: {e.strerror}; give a shorter path", file=sys.stderr)
        return 2
    if e.errno not in _OUTPUT_ERRNOS:
        raise e
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    print(
        f"{prog}: error: cannot write the output ({e.strerror or e}); free some space or redirect stdout "
        f"elsewhere and rerun",
        file=sys.stderr,
    )
    return 2


def check_std_streams(prog: str) -> int | None:
    """Before a CLI does anything: a stdout closed at start (Python sets it to None) is the one-line
    error of a failed write (exit 2), not a traceback at the first print; text that cannot be encoded
    (a lone surrogate from someone's file) is written escaped instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
    if sys.stdout is not None:
        return None
    if sys.stderr is not None:
        print(
            f"{prog}: error: cannot write the output (stdout is closed); redirect stdout elsewhere and rerun",
            file=sys.stderr,
        )
    return 2


def write_error(path: Path, e: OSError) -> UserError:
    """The one-line error for a failed write (disk full, permissions, I/O)."""
    return UserError(
        f"{path}: cannot write ({e.strerror or e}); nothing was written there; free some space or choose another path"
    )


PATH_MAX_BYTES = 4095  # Linux PATH_MAX less the terminating NUL
NAME_MAX_BYTES = 255


def check_path_text(p: Any, where: str) -> str:
    """A path named in someone's file (a session, a manifest) that OS calls can take: text without
    NUL bytes, encodable as a file name, at most PATH_MAX bytes with no part over NAME_MAX; else
    a one-line UserError naming `where` (an OS call would raise ValueError or ENAMETOOLONG)."""
    if not isinstance(p, str) or not p:
        raise UserError(f"{where}: must be a non-empty path string, got {type(p).__name__}")
    if "\0" in p:
        raise UserError(f"{where}: contains a NUL byte; give a plain path")
    try:
        raw = os.fsencode(p)
    except UnicodeEncodeError:
        raise UserError(f"{where}: is not a valid file name (unencodable characters); give a plain path") from None
    if len(raw) > PATH_MAX_BYTES or any(len(part) > NAME_MAX_BYTES for part in raw.split(b"/")):
        raise UserError(
            f"{where}: path is too long ({len(raw)} bytes; at most {PATH_MAX_BYTES}, "
            f"{NAME_MAX_BYTES} a part); give a shorter path"
        )
    return p


def check_output_path(path: str | os.PathLike) -> Path:
    """Fail fast (before long work) when an output cannot be written where asked: the one rule for
    every output. Only a regular file (or nothing) may be replaced; a symlink, FIFO, socket or
    device node at the path is refused, since replacing or writing through it is never intended."""
    raw = os.fspath(path)
    # Path() drops a trailing slash: "out/" would become a file named out, where the user meant a folder
    if isinstance(raw, str) and raw.endswith(os.sep) and raw.strip(os.sep):
        raise UserError(f"{raw}: ends in {os.sep!r}, which names a folder; give a file path for the output")
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UserError(f"{path}: cannot check the output path ({e.strerror or e}); choose another path") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UserError(f"{path}: is a symbolic link; refusing to write over it, give the path of a regular file")
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise UserError(
            f"{path}: is a {_file_kind(st.st_mode)}, not a regular file; refusing to write over it, "
            f"give the path of a regular file"
        )
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give a file path for the output")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: folder {parent} does not exist; create it first")
    return path


def check_overwrite(path: str | os.PathLike, overwrite: bool, flag: str = "--force") -> Path:
    """The one overwrite rule for every output mcore and the workbench write: never over anything but a
    regular file (check_output_path), and over an existing one only when the caller says so (`--force`
    on the command line; in the workbench, the user's yes). Checked before the work that makes it."""
    path = check_output_path(path)
    if not overwrite and path.exists():
        raise UserError(f"{path} already exists; choose a new path or pass {flag} to replace it")
    return path


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def install_file(path: str | os.PathLike, data: bytes | Path, overwrite: bool = False, mode: int = 0o755) -> Path:
    """Put `data` (bytes, or a file to copy) at `path` atomically; never replace an existing file
    unless `overwrite` (a hard link makes the no-replace case race-free)."""
    import shutil

    path = check_overwrite(path, overwrite)
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        if isinstance(data, (bytes, bytearray)):
            Path(tmp).write_bytes(data)
        else:
            shutil.copyfile(data, tmp)
        os.chmod(tmp, mode & ~_umask())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise UserError(f"{path} already exists; choose a new path or pass --force to replace it") from None
            except OSError:  # a filesystem without hard links
                if path.exists():
                    raise UserError(f"{path} already exists; choose a new path or pass --force to replace it") from None
                os.replace(tmp, path)
    except UserError:
        raise
    except OSError as e:
        raise write_error(path, e) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_json(path: str | os.PathLike, data: Any) -> Path:
    def write(f: Any) -> None:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")

    return atomic_write(path, write)


def canonical_json(data: Any) -> str:
    """The canonical form that hashes are taken over."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def read_input_text(path: str | os.PathLike, what: str, hint: str = "check the path") -> str:
    """The one rule for opening an input file: it must exist and be a regular file (a FIFO or a
    device would block or never end), read as UTF-8; else a one-line UserError naming it."""
    if not str(path):  # Path("") is ".": it would read as "is a directory"
        raise UserError(f"the {what} path is empty; name the {what} file")
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: {what} not found; {hint}")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a {what} file")
    if not path.is_file():
        raise UserError(f"{path}: is not a regular file (a pipe or device?); give the {what} as a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a bundle, a DSO or another binary given where a JSON file belongs
        raise UserError(f"{path}: is not a text file, so not a {what}; give the {what} file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read {what}: {e}") from None


def parse_json(text: str, where: str, what: str, constants: bool = False) -> Any:
    """json.loads with one-line errors; NaN/Infinity refused unless `constants` (the tutorial's own
    json.load accepts them in embeddings); a key twice in one object and too deep a nesting are
    errors, not a silent pick or a RecursionError."""

    def no_constants(name: str):
        raise ValueError(f"non-standard JSON constant {name}")

    try:
        if constants:
            return json.loads(text, object_pairs_hook=_unique_keys)
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=_unique_keys)
    except ValueError as e:
        raise UserError(f"{where}: malformed JSON in {what}: {e}") from None
    except RecursionError:
        raise UserError(f"{where}: malformed JSON in {what}: nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: a repeated key (which json.loads would let the last
    copy win silently) is an error."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Read a JSON file or raise a one-line UserError naming the file and the problem."""
    return parse_json(read_input_text(path, what), str(path), what)


def check_fields(obj: Any, where: str, required: set[str], optional: Set[str] = frozenset()) -> None:
    """Missing or unknown fields fail with a message naming them."""
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = sorted(required - obj.keys())
    if missing:
        raise UserError(f"{where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(obj.keys() - required - set(optional))
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(unknown)}; remove them")
