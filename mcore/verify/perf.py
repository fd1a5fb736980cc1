"""The no-regression gate (tutorial step 4; DESIGN.md contract 11): fresh-process benchmark pairs,
native and external alternating which runs first, decided by a t-interval over the pairs'
log-ratios (mcore/verify/interval.py) against the threshold: PROMOTE, REJECT or INCONCLUSIVE.

Metrics (read from each run's benchmark line; higher is better):
  throughput  wall-clock tokens/s or embeddings/s: the tutorial's own comparison
  device      1000 / device_step_ms: device time of one decode step / encoder call (CUDA runs). On a
              small model the host's per-token work varies more between processes than a kernel
              changes the step; device time leaves it out
  min-step    1000 / decode_ms_min (latency_ms_min for an encoder): the run's fastest step, in-process
              wall clock. A loaded CPU stretches most steps of a run by an amount that varies from
              run to run, but some steps run undisturbed: the fastest one is what the code costs
              (bench/gate_under_load.py measured the alternatives, docs/perf-gate.md)
  auto        device where both arms' lines carry it, else min-step, else throughput (the default)

Pairs: a fixed count (2 or more), or "auto": from the 3rd pair on the interval is checked after each
pair, and the gate stops when it decides, after `max_pairs`, or once `budget_s` seconds have passed.
Each check runs at confidence 1 - (1 - C) / L for the L checks `max_pairs` allows (Bonferroni), so
the chance that any of them decides wrongly stays within 1 - C.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..common.errors import UserError
from ..common.progress import NO_PROGRESS, Progress
from .details import PerfDecision, PerfDetails, PerfInterval
from .interval import RatioInterval, look_confidence, ratio_interval
from .verdicts import FAIL, INCONCLUSIVE, PROMOTE, REJECT, GateResult, check_threshold

# The `run --benchmark` and `embed --benchmark` lines (DESIGN.md §8); the first is the tutorial's.
RUN_BENCH_RE = re.compile(r"generated_tokens_mean=([0-9.]+).*tokens_per_sec=([0-9.]+)")
EMBED_BENCH_RE = re.compile(r"embeddings_per_sec=([0-9.]+)")
DEVICE_MS_RE = re.compile(r"\bdevice_step_ms=([0-9.]+)")
MIN_MS_RE = {
    "tokens": re.compile(r"\bdecode_ms_min=([0-9.]+)"),
    "embeddings": re.compile(r"\blatency_ms_min=([0-9.]+)"),
}

AUTO = "auto"
METRICS = (AUTO, "device", "min-step", "throughput")
DEFAULT_METRIC = AUTO
DEFAULT_PAIRS = 6
DEFAULT_MIN_RATIO = 0.98
DEFAULT_CONFIDENCE = 0.95
DEFAULT_MAX_PAIRS = 12
FIRST_LOOK = 3  # --pairs auto checks the interval from this many pairs on


@dataclass(frozen=True)
class PerfDefaults:
    """The gate's defaults, one place for the CLI and the workbench's action."""

    pairs: int = DEFAULT_PAIRS
    min_ratio: float = DEFAULT_MIN_RATIO
    confidence: float = DEFAULT_CONFIDENCE
    max_pairs: int = DEFAULT_MAX_PAIRS
    metric: str = DEFAULT_METRIC
    first_check: int = FIRST_LOOK


PERF_DEFAULTS = PerfDefaults()
ABOUT = {
    "throughput": "the wall-clock throughput of each run (the tutorial's comparison)",
    "device": "the device time of a decode step / encoder call (device_step_ms, CUDA runs)",
    "min-step": "the fastest decode step / encoder call of each run (decode_ms_min / latency_ms_min, in-process)",
}
WHAT = {"throughput": "throughput", "device": "device-time", "min-step": "fastest-step"}
InfoFn = Callable[[str], None]


@dataclass
class BenchmarkReading:
    kind: str  # "tokens" | "embeddings"
    generated_tokens_mean: float | None
    throughput: float
    device_step_ms: float | None = None  # CUDA: device time per decode step / encoder call
    min_ms: float | None = None  # the run's fastest decode step / encoder call (wall clock)

    @property
    def unit(self) -> str:
        return "tokens/s" if self.kind == "tokens" else "embeddings/s"

    def field(self, metric: str) -> float | None:
        """The line's number behind `metric` (None when the line lacks it)."""
        return {"throughput": self.throughput, "device": self.device_step_ms, "min-step": self.min_ms}[metric]


def parse_benchmark(text: str) -> BenchmarkReading | None:
    """The LAST `generated_tokens_mean=... tokens_per_sec=...` line, else the last
    `embeddings_per_sec=...`; None when neither is present (or a number does not parse). The
    line's `device_step_ms=` (CUDA runs) and fastest step come with it."""
    try:
        for kind, rx in (("tokens", RUN_BENCH_RE), ("embeddings", EMBED_BENCH_RE)):
            lines = [ln for ln in text.splitlines() if rx.search(ln)]
            if not lines:
                continue
            m = rx.search(lines[-1])
            assert m is not None
            dev, best = DEVICE_MS_RE.search(lines[-1]), MIN_MS_RE[kind].search(lines[-1])
            device_ms = float(dev.group(1)) if dev else None
            min_ms = float(best.group(1)) if best else None
            if kind == "tokens":
                return BenchmarkReading("tokens", float(m.group(1)), float(m.group(2)), device_ms, min_ms)
            return BenchmarkReading("embeddings", None, float(m.group(1)), device_ms, min_ms)
    except ValueError:
        return None
    return None


def metric_unit(metric: str, kind: str) -> str:
    if metric == "throughput":
        return "tokens/s" if kind == "tokens" else "embeddings/s"
    what = "steps/s" if kind == "tokens" else "calls/s"
    return f"device {what}" if metric == "device" else f"{what} (fastest)"


def resolve_metric(metric: str, native: BenchmarkReading, external: BenchmarkReading) -> str:
    """`auto`: the steadiest number both lines carry (device time, else the fastest step)."""
    if metric != AUTO:
        return metric
    for m in ("device", "min-step"):
        if native.field(m) is not None and external.field(m) is not None:
            return m
    return "throughput"


def run_shell(cmd: str, progress: Progress | None = None, poll_s: float = 0.2) -> tuple[int, str, str]:
    """Run `cmd` through the shell in a fresh process group; return (rc, stdout, stderr), each the
    last MiB of what it printed. Cancellation (through `progress`) or Ctrl-C kills the whole group;
    so do running past MCORE_COMMAND_TIMEOUT seconds (default 3600) and printing more than 16 MiB,
    which are one-line errors (mcore/common/subproc.py)."""
    from ..common.subproc import run_bounded, timeout_from_env

    timeout = timeout_from_env("MCORE_COMMAND_TIMEOUT", 3600.0)
    hint = "; set MCORE_COMMAND_TIMEOUT=SECONDS to allow longer"
    done = run_bounded(cmd, f"command `{cmd[:80]}`", timeout, progress or NO_PROGRESS, limit_hint=hint)
    return done.returncode, done.stdout, done.stderr


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else "(no output)"


def percent(confidence: float) -> str:
    return f"{confidence * 100:.4g}%"


# ---------------------------------------------------------------- the plan (validated arguments)


@dataclass(frozen=True)
class PerfPlan:
    pairs: int | None  # None: auto
    max_pairs: int
    budget_s: float | None
    min_ratio: float
    confidence: float
    warmup: int
    metric: str

    @property
    def auto(self) -> bool:
        return self.pairs is None

    @property
    def limit(self) -> int:
        return self.max_pairs if self.pairs is None else self.pairs

    @property
    def checks(self) -> int:
        return self.max_pairs - FIRST_LOOK + 1 if self.auto else 1

    @property
    def check_confidence(self) -> float:
        return look_confidence(self.confidence, self.checks)

    def rule(self) -> str:
        """The decision rule in words (the report's `rule:` line)."""
        text = (
            f"PROMOTE when the whole {percent(self.check_confidence)} t-interval of the pairs' mean log-ratio "
            f"(mean ± t × sd / √pairs) is at or above {self.min_ratio:g}, REJECT when it is wholly below, "
            "INCONCLUSIVE when it straddles"
        )
        if self.auto:
            budget = f" or {self.budget_s:g} s" if self.budget_s is not None else ""
            text += (
                f"; --pairs auto checks after each pair from pair {FIRST_LOOK} to pair {self.max_pairs}{budget}, "
                f"each check at {percent(self.check_confidence)} (Bonferroni over {self.checks} checks: "
                f"{percent(self.confidence)} overall)"
            )
        return text


def _pairs_arg(pairs: Any) -> int | None:
    if pairs == AUTO:
        return None
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 2:
        extra = "; one pair has no spread to judge" if pairs == 1 else ""
        raise UserError(f"verify perf: --pairs must be a whole number >= 2 or auto, got {pairs!r}{extra}")
    return pairs


def check_plan(
    native_cmd: Any,
    external_cmd: Any,
    pairs: Any,
    min_ratio: Any,
    warmup: Any,
    metric: Any,
    max_pairs: Any,
    budget_s: Any,
    confidence: Any,
) -> PerfPlan:
    """Every argument checked once, before anything runs (one-line UserError, exit 2)."""
    for flag, cmd in (("--native", native_cmd), ("--external", external_cmd)):
        if not isinstance(cmd, str) or not cmd.strip():
            raise UserError(f"verify perf: {flag} needs a command to run")
    n = _pairs_arg(pairs)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise UserError(f"verify perf: --warmup must be 0 or more, got {warmup!r}")
    check_threshold("verify perf: --min-ratio", min_ratio, 0.0, lo_open=True)
    check_threshold("verify perf: --confidence", confidence, 0.5, 0.999999)
    if metric not in METRICS:
        raise UserError(f"verify perf: --metric {metric!r} must be one of {', '.join(METRICS)}")
    if n is not None and (max_pairs is not None or budget_s is not None):
        raise UserError(
            "verify perf: --max-pairs and --budget-s bound --pairs auto; with a fixed --pairs leave them out"
        )
    if max_pairs is None:
        max_pairs = DEFAULT_MAX_PAIRS
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or not FIRST_LOOK <= max_pairs <= 1000:
        raise UserError(f"verify perf: --max-pairs must be a whole number in {FIRST_LOOK}..1000, got {max_pairs!r}")
    if budget_s is not None:
        check_threshold("verify perf: --budget-s", budget_s, 0.0, lo_open=True)
    return PerfPlan(
        n,
        max_pairs,
        None if budget_s is None else float(budget_s),
        float(min_ratio),
        float(confidence),
        warmup,
        metric,
    )


# ---------------------------------------------------------------- measuring


class _PerfRun:
    """One gate's measurements: runs the arms, keeps every pair, reports as it goes."""

    def __init__(
        self,
        plan: PerfPlan,
        cmds: dict[str, str],
        progress: Progress | None,
        on_sample: Callable[[str, int, float], None] | None,
        on_line: InfoFn | None,
    ):
        self.plan, self.cmds, self.on_sample, self.on_line = plan, cmds, on_sample, on_line
        self.prog = progress or Progress()
        self.info: list[str] = []
        self.samples: dict[str, list[float]] = {"native": [], "external": []}
        self.ratios: list[float] = []
        self.gens: list[float] = []
        self.metric: str | None = None if plan.metric == AUTO else plan.metric
        self.unit: str | None = None
        self.runs_done, self.total_runs = 0, 2 * (plan.warmup + plan.limit)
        self.t0 = time.monotonic()
        self.order: list[tuple[str, str]] = []  # which arm ran first, per pair begun

    def say(self, text: str) -> None:
        self.info.append(text)
        if self.on_line is not None:
            self.on_line(text)

    def details(self, verdict: str, decision: PerfDecision | None = None) -> PerfDetails:
        """The measurements so far, the settings and the verdict (with what decided it)."""
        plan = self.plan
        return PerfDetails(
            pairs=len(self.ratios),
            pairs_requested=AUTO if plan.pairs is None else plan.pairs,
            warmup=plan.warmup,
            min_ratio=plan.min_ratio,
            confidence=plan.confidence,
            native=tuple(self.samples["native"]),
            external=tuple(self.samples["external"]),
            ratios=tuple(self.ratios),
            order=tuple(self.order),
            verdict=verdict,
            decision=decision,
        )

    def fail(self, text: str) -> GateResult[PerfDetails]:
        return GateResult(False, f"FAIL: {text}", self.details(FAIL), self.info, FAIL)

    def label(self, i: int) -> str:
        return f"pair {i + 1}/{self.plan.limit}" + (" at most" if self.plan.auto else "")

    def run(self, arm: str, label: str) -> tuple[BenchmarkReading | None, str | None]:
        self.prog.report(f"{label}: {arm}", self.runs_done / self.total_runs)
        rc, out, err = run_shell(self.cmds[arm], self.prog)
        self.runs_done += 1
        self.prog.report(f"{label}: {arm} done", self.runs_done / self.total_runs)
        if rc != 0:
            return None, f"{arm} command exited with status {rc} ({label}): {_last_line(err or out)}"
        reading = parse_benchmark(out + "\n" + err)
        if reading is None:
            return None, (
                f"{arm} run ({label}) reported no benchmark line (expected "
                "'generated_tokens_mean=X ... tokens_per_sec=Y' or 'embeddings_per_sec=Y'); run it with --benchmark"
            )
        return reading, None

    def warmup(self) -> str | None:
        for w in range(self.plan.warmup):
            for arm in ("native", "external"):
                _, problem = self.run(arm, f"warmup {w + 1}/{self.plan.warmup}")
                if problem:
                    return problem
            self.say(f"warmup {w + 1}/{self.plan.warmup}: done")
        return None

    def pair(self, i: int) -> str | None:
        """Measure pair `i` (0-based); a problem string on a hard failure."""
        order = ("native", "external") if i % 2 == 0 else ("external", "native")
        self.order.append(order)
        label = self.label(i)
        readings: dict[str, BenchmarkReading] = {}
        for arm in order:
            reading, problem = self.run(arm, label)
            if reading is None:
                return problem
            readings[arm] = reading
        n, e = readings["native"], readings["external"]
        if n.kind != e.kind:
            return f"native reports {n.unit} but external reports {e.unit}; compare like with like"
        if n.generated_tokens_mean != e.generated_tokens_mean:
            return (
                f"generated_tokens_mean differs in {label} (native={n.generated_tokens_mean:g} "
                f"external={e.generated_tokens_mean:g})"
            )
        return self.record(i, order, readings)

    def record(self, i: int, order: tuple[str, str], readings: dict[str, BenchmarkReading]) -> str | None:
        n, e = readings["native"], readings["external"]
        if self.metric is None:
            self.metric = resolve_metric(self.plan.metric, n, e)
            self.say(f"metric: {self.metric}: {ABOUT[self.metric]}" + self._why_auto())
        self.unit = metric_unit(self.metric, n.kind)
        values = {}
        for arm in order:
            v, problem = self._value(arm, readings[arm], self.label(i))
            if v is None:
                return problem
            values[arm] = v
            self.samples[arm].append(v)
            if self.on_sample is not None:
                self.on_sample(arm, i, v)
        if n.generated_tokens_mean is not None:
            self.gens.append(n.generated_tokens_mean)
        ratio = values["external"] / values["native"]
        self.ratios.append(ratio)
        self.say(
            f"{self.label(i)}: native={values['native']:.2f} external={values['external']:.2f} {self.unit} "
            f"ratio={ratio:.4f} ({order[0]} first)"
        )
        return None

    def _why_auto(self) -> str:
        if self.plan.metric != AUTO:
            return ""
        why = {
            "device": "both lines carry device_step_ms",
            "min-step": "no device_step_ms (not CUDA runs)",
            "throughput": "the lines carry neither device_step_ms nor a fastest step",
        }
        return f" (auto: {why[self.metric or 'throughput']})"

    def _value(self, arm: str, r: BenchmarkReading, label: str) -> tuple[float | None, str | None]:
        assert self.metric is not None
        raw = r.field(self.metric)
        if raw is None:
            if self.metric == "device":
                return None, (
                    f"{arm} run ({label}) reports no device_step_ms (device time is measured on CUDA only); "
                    "use --metric min-step or --metric throughput"
                )
            return None, (
                f"{arm} run ({label}) reports no decode_ms_min / latency_ms_min (`mcore run/embed --benchmark` "
                "prints it); use --metric throughput"
            )
        if raw <= 0:
            name = {"throughput": "throughput", "device": "device_step_ms", "min-step": "the fastest step"}
            return None, f"{name[self.metric]} must be positive ({arm}={raw:g} in {label})"
        return (raw if self.metric == "throughput" else 1e3 / raw), None

    # ------------------------------------------------------------ deciding

    def interval(self) -> RatioInterval:
        return ratio_interval(self.ratios, self.plan.check_confidence)

    def stop_reason(self, iv: RatioInterval) -> str:
        """--pairs auto, after a check: why to stop now ("" to measure another pair)."""
        n = len(self.ratios)
        if iv.verdict(self.plan.min_ratio) != INCONCLUSIVE:
            reason = f"decided after {n} pairs"
        elif n >= self.plan.max_pairs:
            reason = f"undecided after --max-pairs {self.plan.max_pairs}"
        elif self.plan.budget_s is not None and time.monotonic() - self.t0 >= self.plan.budget_s:
            reason = f"the {self.plan.budget_s:g} s budget ran out after {n} pairs"
        else:
            reason = ""
        self.say(
            f"check after {n} pairs: {percent(iv.confidence)} interval [{iv.low:.4f}, {iv.high:.4f}] "
            f"-> {iv.verdict(self.plan.min_ratio)}" + (f"; stopping: {reason}" if reason else "; one more pair")
        )
        return reason

    def result(self, stop: str) -> GateResult[PerfDetails]:
        plan, iv = self.plan, self.interval()
        verdict = iv.verdict(plan.min_ratio)
        nm, em = statistics.median(self.samples["native"]), statistics.median(self.samples["external"])
        rule = plan.rule()
        decision = PerfDecision(
            ratio=iv.estimate,
            median_ratio=statistics.median(self.ratios),
            interval=PerfInterval(iv.low, iv.high, iv.confidence, iv.t, iv.sd_log),
            rule=rule,
            stop=stop or None,
            native_median=nm,
            external_median=em,
            unit=self.unit,
            metric=self.metric,
            generated_tokens_mean=self.gens[0] if self.gens else None,
        )
        self.say(
            f"interval: geometric mean ratio {iv.estimate:.4f}, log-ratio sd {iv.sd_log:.4f} over {iv.n} pairs, "
            f"t({1 - (1 - iv.confidence) / 2:.6g}, {iv.n - 1}) = {iv.t:.3f}: "
            f"{percent(iv.confidence)} interval [{iv.low:.4f}, {iv.high:.4f}]"
        )
        self.say(f"rule: {rule}")
        self.prog.report("done", 1.0)
        line = self._line(iv, verdict, nm, em, stop)
        return GateResult(verdict == PROMOTE, line, self.details(verdict, decision), self.info, verdict)

    def _line(self, iv: RatioInterval, verdict: str, nm: float, em: float, stop: str) -> str:
        assert self.metric is not None
        head = (
            f"{verdict}: external/native {WHAT[self.metric]} ratio {iv.estimate:.4f}, "
            f"{percent(iv.confidence)} interval [{iv.low:.4f}, {iv.high:.4f}]"
        )
        tail = f"({iv.n} pairs; medians native={nm:.2f} external={em:.2f} {self.unit})"
        thr = f"{self.plan.min_ratio:g}"
        if verdict == PROMOTE:
            return f"{head} is at or above {thr} {tail}"
        if verdict == REJECT:
            return f"{head} is below {thr} {tail}"
        hint = (
            f"{stop}; run again on a quieter machine or raise --max-pairs / --budget-s"
            if self.plan.auto
            else "measure more pairs (--pairs auto) or use a steadier metric"
        )
        return f"{head} straddles {thr}: the pairs cannot tell {tail}; {hint}"


def perf_gate(
    native_cmd: str,
    external_cmd: str,
    pairs: int | str = DEFAULT_PAIRS,
    min_ratio: float = DEFAULT_MIN_RATIO,
    warmup: int = 1,
    on_sample: Callable[[str, int, float], None] | None = None,
    progress: Progress | None = None,
    on_line: InfoFn | None = None,
    metric: str = DEFAULT_METRIC,
    max_pairs: int | None = None,
    budget_s: float | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> GateResult[PerfDetails]:
    """The no-regression gate: `warmup` runs of each command, then fresh-process pairs alternating
    which arm goes first (pair 1: native first, pair 2: external first, ...), decided by the
    t-interval of the pairs' log-ratios against `min_ratio` (module docstring: metrics, --pairs auto).

    `on_sample(arm, pair_index, value)` is called after every measured run (arm "native" or
    "external", pair_index 0-based, value in the metric's unit); `on_line(text)` receives each info
    line as it is produced. A hard failure (nonzero exit, missing benchmark line, non-positive
    number, differing generated_tokens_mean) stops the gate with FAIL.
    """
    plan = check_plan(native_cmd, external_cmd, pairs, min_ratio, warmup, metric, max_pairs, budget_s, confidence)
    g = _PerfRun(plan, {"native": native_cmd, "external": external_cmd}, progress, on_sample, on_line)
    problem = g.warmup()
    if problem:
        return g.fail(problem)
    stop = ""
    for i in range(plan.limit):
        problem = g.pair(i)
        if problem:
            return g.fail(problem)
        if plan.auto and i + 1 >= FIRST_LOOK:
            stop = g.stop_reason(g.interval())
            if stop:
                break
    return g.result(stop)
