"""The perf gate's decision rule: a Student-t confidence interval over the pairs' log-ratios.

Each measured pair gives one ratio external/native (higher is better for the external arm). On
the log scale a ratio and its inverse are symmetric, and a run that is slowed by a factor slows
its log by a constant, so the pairs' log-ratios are averaged and their spread gives a t-interval
for the typical ratio (the geometric mean). The verdict compares the interval, not a point, with
the threshold:

    PROMOTE       the whole interval is at or above the threshold
    REJECT        the whole interval is below it
    INCONCLUSIVE  it straddles the threshold: the pairs cannot tell (more pairs, or a steadier metric)

Why a t-interval: it is exact for normal log-ratios from 2 pairs up (3-12 in practice), while the
nonparametric intervals for a median (sign test, signed ranks) cannot reach 95% below 6 pairs. An
outlier pair (a run slowed by a neighbour's job) widens the interval through the spread, so a
noisy measurement ends INCONCLUSIVE rather than in a wrong verdict.

The t quantiles come from the closed form of the t distribution for integer degrees of freedom
(Abramowitz & Stegun 26.7.3-4), inverted by bisection: no scipy.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .verdicts import INCONCLUSIVE, PROMOTE, REJECT


def t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` >= 1 degrees of freedom (A&S 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    if math.isinf(t):
        return 1.0
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return min(1.0, s * total)
    # odd: (2/pi) (theta + sin(theta) cos(theta) (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)))
    if df == 1:
        return 2 * theta / math.pi
    term = total = 1.0
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return min(1.0, 2 / math.pi * (theta + s * math.sqrt(c2) * total))


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """The t value with P(T <= t) = p (0.5 <= p < 1), integer `df` >= 1, to 1e-12 relative."""
    if not 0.5 <= p < 1:
        raise ValueError(f"quantile level must be in [0.5, 1), got {p}")
    target = 2 * p - 1  # P(|T| <= t)
    lo, hi = 0.0, 1.0
    while t_two_sided_mass(hi, df) < target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_mass(mid, df) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class RatioInterval:
    """The interval for the typical external/native ratio and the verdict it gives."""

    n: int
    estimate: float  # geometric mean of the ratios
    low: float
    high: float
    confidence: float  # of this interval (two-sided)
    t: float  # the t quantile used (inf below 2 pairs)
    sd_log: float  # standard deviation of the log-ratios (0 below 2 pairs)

    def verdict(self, min_ratio: float) -> str:
        if self.low >= min_ratio:
            return PROMOTE
        if self.high < min_ratio:
            return REJECT
        return INCONCLUSIVE


def ratio_interval(ratios: Sequence[float], confidence: float) -> RatioInterval:
    """The two-sided `confidence` t-interval of the mean log-ratio, mapped back to ratios. Below two
    pairs there is no spread to judge, so the interval is (0, inf): INCONCLUSIVE whatever the ratio."""
    if any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise ValueError("ratios must be finite and positive")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    if n == 0:
        return RatioInterval(0, math.nan, 0.0, math.inf, confidence, math.inf, 0.0)
    mean = statistics.fmean(logs)
    if n < 2:
        return RatioInterval(n, math.exp(mean), 0.0, math.inf, confidence, math.inf, 0.0)
    sd = statistics.stdev(logs)
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    half = t * sd / math.sqrt(n)
    return RatioInterval(n, math.exp(mean), math.exp(mean - half), math.exp(mean + half), confidence, t, sd)


def look_confidence(confidence: float, looks: int) -> float:
    """The confidence of each of `looks` checks so that all of them together keep `confidence`
    (Bonferroni: the chance that any check decides wrongly is at most the sum of their chances)."""
    return 1 - (1 - confidence) / max(1, looks)
