"""Progress reporting and cancellation shared by the CLI and the TUI."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import Cancelled

ProgressFn = Callable[[str, float], None]  # (step description, fraction 0..1)


@dataclass
class CancelToken:
    _event: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("cancelled")


@dataclass
class Progress:
    """What long work receives: report(step, fraction) and check() for cancellation."""

    callback: ProgressFn | None = None
    token: CancelToken | None = None

    def report(self, step: str, fraction: float) -> None:
        if self.token is not None:
            self.token.check()
        if self.callback is not None:
            self.callback(step, max(0.0, min(1.0, fraction)))

    def check(self) -> None:
        if self.token is not None:
            self.token.check()

    def part(self, lo: float, hi: float) -> Progress:
        """The same reporting and cancellation, with fractions mapped into [lo, hi] of this one."""
        if self.callback is None:
            return Progress(None, self.token)
        cb = self.callback
        return Progress(lambda step, f: cb(step, lo + (hi - lo) * f), self.token)


NO_PROGRESS = Progress()
