"""Running someone's command (an exporter, a benchmark arm) so that it cannot hang or flood mcore.

The command runs in its own process group (session) with stdin closed; its output is read by
threads that keep a bounded tail; it is killed with its whole group when it runs past its time
limit, prints more than the output limit, is cancelled, or exits while a child it left behind
still holds the output pipe (mcore stops waiting once the command itself has exited).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .errors import UserError
from .progress import NO_PROGRESS, Progress

MAX_OUTPUT_BYTES = 16 << 20  # the most a command may print before it is stopped
TAIL_BYTES = 1 << 20  # what is kept of each stream (the benchmark line comes last)
MAX_LINE = 4096  # a line passed on is cut here
DRAIN_S = 1.0  # after the command exits: how long buffered output may still arrive


def timeout_from_env(name: str, default: float) -> float:
    """A time limit from the environment (seconds; positive and finite), else `default`."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise UserError(f"{name}={raw!r} must be a positive number of seconds")
    return value


@dataclass
class _Stream:
    """One output stream: a bounded tail of its text, its byte count, complete lines for `on_line`."""

    on_line: Callable[[str], None] | None = None
    tail: deque = field(default_factory=deque)
    kept: int = 0
    total: int = 0
    partial: bytes = b""
    done: threading.Event = field(default_factory=threading.Event)

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self.tail.append(data)
        self.kept += len(data)
        while self.kept > TAIL_BYTES and len(self.tail) > 1:
            self.kept -= len(self.tail.popleft())
        if self.on_line is not None:
            *lines, self.partial = (self.partial + data).split(b"\n")
            for ln in lines:
                self.on_line(ln[:MAX_LINE].decode("utf-8", "replace"))
            self.partial = self.partial[-MAX_LINE:]

    def finish(self) -> None:
        if self.on_line is not None and self.partial:
            self.on_line(self.partial[:MAX_LINE].decode("utf-8", "replace"))
            self.partial = b""
        self.done.set()

    def text(self) -> str:
        return b"".join(self.tail).decode("utf-8", "replace")


def _pump(fd: int, stream: _Stream, lock: threading.Lock) -> None:
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            with lock:
                stream.feed(data)
    except OSError:
        pass
    finally:
        with lock:
            stream.finish()
        os.close(fd)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_bounded(
    cmd: str | Sequence[str],
    what: str,
    timeout_s: float,
    progress: Progress = NO_PROGRESS,
    on_stdout_line: Callable[[str], None] | None = None,
    merge_stderr: bool = False,
    cwd: str | os.PathLike | None = None,
    limit_hint: str = "",
) -> Finished:
    """Run `cmd` (a shell command when a string) in its own process group; see the module doc.
    `on_stdout_line` is called from the caller's thread. Raises UserError past the time or output
    limit (`what` names the command, `limit_hint` how to change the time limit); cancellation kills
    the group and re-raises."""
    try:
        proc = subprocess.Popen(
            cmd,
            shell=isinstance(cmd, str),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        raise UserError(f"could not start {what}: {e.strerror or e}") from None
    lines: deque = deque()
    lock = threading.Lock()
    out = _Stream(on_line=lines.append if on_stdout_line else None)
    err = _Stream()
    pipes = [(proc.stdout, out)] + ([] if merge_stderr else [(proc.stderr, err)])
    for pipe, stream in pipes:
        assert pipe is not None
        threading.Thread(target=_pump, args=(os.dup(pipe.fileno()), stream, lock), daemon=True).start()
        pipe.close()
    try:
        problem = _watch(proc, [s for _, s in pipes], lines, on_stdout_line, lock, timeout_s, progress)
    except BaseException:
        _kill_group(proc)
        raise
    _kill_group(proc)  # whatever it left running (holding our pipes or not) goes with it
    if problem == "timeout":
        raise UserError(f"{what} ran past its time limit of {timeout_s:g} s and was stopped{limit_hint}")
    if problem == "output":
        raise UserError(
            f"{what} printed more than {MAX_OUTPUT_BYTES >> 20} MiB and was stopped; "
            "a command mcore runs should print a few lines"
        )
    with lock:
        return Finished(proc.returncode, out.text(), err.text())


def _watch(
    proc: subprocess.Popen,
    streams: list[_Stream],
    lines: deque,
    on_line: Callable[[str], None] | None,
    lock: threading.Lock,
    timeout_s: float,
    progress: Progress,
) -> str | None:
    """Wait for the command; pass its lines on. None when it exited, else why it was stopped."""
    deadline = time.monotonic() + timeout_s
    exited_at: float | None = None
    while True:
        with lock:
            pending = [lines.popleft() for _ in range(len(lines))]
            total = sum(s.total for s in streams)
            drained = all(s.done.is_set() for s in streams)
        for ln in pending:
            assert on_line is not None
            on_line(ln)
        if total > MAX_OUTPUT_BYTES:
            return "output"
        if exited_at is None and proc.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and (drained or time.monotonic() - exited_at > DRAIN_S):
            with lock:
                rest = [lines.popleft() for _ in range(len(lines))]
            for ln in rest:
                assert on_line is not None
                on_line(ln)
            return None
        if time.monotonic() > deadline:
            return "timeout"
        progress.check()
        time.sleep(0.02 if exited_at is not None else 0.05)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
