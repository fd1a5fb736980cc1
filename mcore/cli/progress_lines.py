"""The CLI's progress on stderr."""

from __future__ import annotations

import sys

from ..common.progress import Progress


class ProgressLines:
    """Progress as "[ pp%] step" lines on stderr, a line only when the text changes: the bundle writer
    reports every 8 MiB chunk, which for an 8B model's weights was some two thousand lines of one step."""

    def __init__(self) -> None:
        self.last = ""

    def __call__(self, step: str, fraction: float) -> None:
        line = f"[{fraction * 100:3.0f}%] {step}"
        if line != self.last:
            print(line, file=sys.stderr, flush=True)
            self.last = line


def stderr_progress() -> Progress:
    return Progress(ProgressLines())
