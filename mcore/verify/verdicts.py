"""What every gate returns (DESIGN.md contract 11): a verdict word, the line that says it, the numbers
and the lines that led to it.

Verdict words and exit codes (the CLI's `mcore verify ...`):

    PASS / PROMOTE   0   correctness held / the kernel is not slower (the interval clears the threshold)
    FAIL / REJECT    1   correctness broke or a run failed / the kernel is slower (the interval is below)
    INCONCLUSIVE     3   the measurements cannot tell (the interval straddles the threshold)

Exit code 2 stays bad input (UserError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..common.errors import UserError
from .details import GateDetails

PASS, FAIL = "PASS", "FAIL"
PROMOTE, REJECT, INCONCLUSIVE = "PROMOTE", "REJECT", "INCONCLUSIVE"
EXIT_INCONCLUSIVE = 3
EXIT_CODES = {PASS: 0, PROMOTE: 0, FAIL: 1, REJECT: 1, INCONCLUSIVE: EXIT_INCONCLUSIVE}
PASSING = (PASS, PROMOTE)


D = TypeVar("D", bound=GateDetails)


@dataclass
class GateResult(Generic[D]):
    """`passed` (PASS or PROMOTE), `line` (the final verdict line), `details` (the gate's numbers, typed:
    mcore/verify/details.py), `info` (lines to show before the verdict, e.g. per-pair measurements) and
    `verdict` (the word; left empty it is PASS or FAIL from `passed`)."""

    passed: bool
    line: str
    details: D
    info: list[str] = field(default_factory=list)
    verdict: str = ""

    def __post_init__(self) -> None:
        if not self.verdict:
            self.verdict = PASS if self.passed else FAIL
        if self.verdict not in EXIT_CODES or self.passed != (self.verdict in PASSING):
            raise ValueError(f"gate verdict {self.verdict!r} does not agree with passed={self.passed}")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def check_threshold(flag: str, value: Any, lo: float, hi: float = math.inf, lo_open: bool = False) -> float:
    """The one rule for gate thresholds: a finite number in range (NaN would pass every comparison)."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (value > lo if lo_open else value >= lo)
        and value <= hi
    )
    if not ok:
        rng = f"> {lo:g}" if lo_open else (f">= {lo:g}" if hi == math.inf else f"in [{lo:g}, {hi:g}]")
        raise UserError(f"{flag} {value!r} must be a finite number {rng}")
    return float(value)
