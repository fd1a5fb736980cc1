"""The promotion gates (tutorial steps 4 and 7): exact tokens, embedding numerics, and
measured no-regression throughput. The CLI (`mcore verify ...`) and the TUI share these.

Every gate returns a `GateResult`: `passed`, `line` (the final PASS/FAIL line), `details`
(numbers), and `info` (lines to show before the verdict, e.g. per-pair measurements).
Bad input (missing file, malformed JSON, missing fields) raises `UserError` (exit 2).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .errors import UserError
from .fileio import check_fields, parse_json, read_input_text
from .progress import NO_PROGRESS, Progress

# The `run --benchmark` and `embed --benchmark` lines (DESIGN.md §8); the first is the tutorial's.
RUN_BENCH_RE = re.compile(r"generated_tokens_mean=([0-9.]+).*tokens_per_sec=([0-9.]+)")
EMBED_BENCH_RE = re.compile(r"embeddings_per_sec=([0-9.]+)")
DEVICE_MS_RE = re.compile(r"\bdevice_step_ms=([0-9.]+)")
METRICS = ("throughput", "device")


@dataclass
class GateResult:
    passed: bool
    line: str
    details: dict[str, Any] = field(default_factory=dict)
    info: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


# ---------------------------------------------------------------- tokens


TOKEN_RECORD_FIELDS = frozenset({"prompt", "text"})  # beside the required tokens


def load_token_records(path: str | os.PathLike) -> list[dict]:
    """Records written by `mcore run --output` (JSONL; each with a `tokens` list of ints)."""
    path = Path(path)
    text = read_input_text(path, "token records", "write them with `mcore run --output`")
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        rec = parse_json(line, f"{path}: line {n}", "token records (one JSON object a line)")
        if not isinstance(rec, dict):
            raise UserError(f"{path}: line {n}: expected a JSON object, got {type(rec).__name__}")
        if "tokens" not in rec:
            raise UserError(f"{path}: line {n}: missing field tokens; write records with `mcore run --output`")
        check_fields(rec, f"{path}: line {n}", {"tokens"}, TOKEN_RECORD_FIELDS)  # as `mcore run --output` writes
        for k in ("prompt", "text"):
            if k in rec and not isinstance(rec[k], str):
                raise UserError(f"{path}: line {n}: field {k} must be a string")
        toks = rec["tokens"]
        if not isinstance(toks, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in toks):
            raise UserError(f"{path}: line {n}: field tokens must be a list of integers")
        rec = dict(rec)
        rec["_line"] = n
        records.append(rec)
    if not records:
        raise UserError(f"{path}: no token records; write them with `mcore run --output`")
    return records


def _records(src: Any) -> list[dict]:
    if isinstance(src, (str, os.PathLike)):
        return load_token_records(src)
    out = []
    for i, rec in enumerate(src):
        if not isinstance(rec, dict) or not isinstance(rec.get("tokens"), list):
            raise UserError(f"token record {i + 1}: expected an object with a tokens list")
        out.append({**rec, "_line": rec.get("_line", i + 1)})
    return out


def compare_tokens(a: Any, b: Any, labels: Sequence[str] = ("native", "external")) -> GateResult:
    """PASS when every record's tokens are identical. `a`/`b`: JSONL paths or lists of records."""
    ra, rb = _records(a), _records(b)
    la, lb = labels
    total = 0
    for i, (x, y) in enumerate(zip(ra, rb)):
        ta, tb = x["tokens"], y["tokens"]
        if ta != tb:
            pos = next((k for k, (p, q) in enumerate(zip(ta, tb)) if p != q), min(len(ta), len(tb)))
            va = ta[pos] if pos < len(ta) else "<end>"
            vb = tb[pos] if pos < len(tb) else "<end>"
            prompt = x.get("prompt")
            about = f" (prompt {prompt[:40]!r}{'...' if len(prompt) > 40 else ''})" if isinstance(prompt, str) else ""
            line = (
                f"FAIL: record {i + 1}{about} differs at token position {pos}: {la}={va} {lb}={vb} "
                f"({la} {len(ta)} tokens, {lb} {len(tb)} tokens)"
            )
            return GateResult(
                False,
                line,
                {"records": min(len(ra), len(rb)), "first_record": i + 1, "first_position": pos, la: va, lb: vb},
            )
        total += len(ta)
    if len(ra) != len(rb):
        return GateResult(
            False,
            f"FAIL: {la} has {len(ra)} records but {lb} has {len(rb)}; run both with the same prompts",
            {"records": min(len(ra), len(rb)), f"{la}_records": len(ra), f"{lb}_records": len(rb)},
        )
    info = []
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x.get("prompt") != y.get("prompt"):
            info.append(f"warning: record {i + 1} has different prompts in the two files")
    return GateResult(
        True, f"PASS: tokens identical ({len(ra)} records, {total} tokens)", {"records": len(ra), "tokens": total}, info
    )


# ---------------------------------------------------------------- embeddings


def load_embedding(path: str | os.PathLike) -> list[float]:
    """`{"embedding": [floats]}` as `mcore embed` writes to stdout."""
    path = Path(path)
    text = read_input_text(path, "embedding", "write it with `mcore embed ... > FILE`")
    data = parse_json(text, str(path), "embedding (the stdout of `mcore embed`)", constants=True)  # as json.load
    return _embedding(data, str(path))


def _embedding(data: Any, where: str) -> list[float]:
    if isinstance(data, dict):
        if "embedding" not in data:
            raise UserError(f"{where}: missing field embedding; expected the stdout of `mcore embed`")
        data = data["embedding"]
    if not isinstance(data, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in data):
        raise UserError(f"{where}: field embedding must be a flat list of numbers")
    return data


def _embedding_src(src: Any, where: str) -> list[float]:
    if isinstance(src, (str, os.PathLike)):
        return load_embedding(src)
    return _embedding(src if isinstance(src, (dict, list)) else list(src), where)


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


def check_limits(min_cosine: Any, max_abs: Any) -> None:
    """--min-cosine in [-1, 1] and --max-abs >= 0 (None: not gated)."""
    check_threshold("--min-cosine", min_cosine, -1.0, 1.0)
    if max_abs is not None:
        check_threshold("--max-abs", max_abs, 0.0)


def compare_embeddings(
    a: Any, b: Any, max_abs: float = 0.02, min_cosine: float = 0.999, labels: Sequence[str] = ("native", "byok")
) -> GateResult:
    """The tutorial's step-7 numerical gate, computed exactly like its snippet.

    `a`/`b`: JSON paths, `{"embedding": [...]}` dicts or lists of numbers. The stats line
    `values=N max_abs=X cosine=Y` is in `info`; `line` is `PASS: numerical gate` or
    `FAIL: numerical gate` (or `FAIL: embedding lengths differ ...`).
    """
    check_limits(min_cosine, max_abs)
    la, lb = labels
    native = _embedding_src(a, la)
    byok = _embedding_src(b, lb)
    if not native or len(native) != len(byok):
        return GateResult(
            False,
            f"FAIL: embedding lengths differ ({la} {len(native)} values, {lb} {len(byok)} values)",
            {"values": len(native), f"{la}_values": len(native), f"{lb}_values": len(byok)},
        )
    if not all(math.isfinite(v) for v in native) or not all(math.isfinite(v) for v in byok):
        return GateResult(
            False,
            "FAIL: numerical gate",
            {"values": len(native), "reason": "non-finite values"},
            [f"values={len(native)} embedding contains NaN or infinite values"],
        )
    # Same expressions, same order as the tutorial's snippet, so the numbers agree to the bit.
    max_abs_value = max(abs(x - y) for x, y in zip(native, byok))
    denominator = math.sqrt(sum(value * value for value in native) * sum(value * value for value in byok))
    if denominator == 0:
        return GateResult(
            False,
            "FAIL: numerical gate",
            {"values": len(native), "max_abs": max_abs_value, "reason": "zero-norm embedding"},
            [f"values={len(native)} max_abs={max_abs_value:.6g} cosine=undefined (an embedding is all zeros)"],
        )
    cosine = sum(x * y for x, y in zip(native, byok)) / denominator
    stats = f"values={len(native)} max_abs={max_abs_value:.6g} cosine={cosine:.9f}"
    details: dict[str, Any] = {
        "values": len(native),
        "max_abs": max_abs_value,
        "cosine": cosine,
        "max_abs_limit": max_abs,
        "min_cosine": min_cosine,
    }
    if max_abs_value > max_abs or cosine < min_cosine:
        reasons = []
        if max_abs_value > max_abs:
            reasons.append(f"max_abs {max_abs_value:.6g} > {max_abs:g}")
        if cosine < min_cosine:
            reasons.append(f"cosine {cosine:.9f} < {min_cosine:g}")
        details["reason"] = "; ".join(reasons)
        return GateResult(False, "FAIL: numerical gate", details, [stats])
    return GateResult(True, "PASS: numerical gate", details, [stats])


# ---------------------------------------------------------------- perf


@dataclass
class BenchmarkReading:
    kind: str  # "tokens" | "embeddings"
    generated_tokens_mean: Optional[float]
    throughput: float
    device_step_ms: Optional[float] = None  # CUDA: device time per decode step / encoder call

    @property
    def unit(self) -> str:
        return "tokens/s" if self.kind == "tokens" else "embeddings/s"


def parse_benchmark(text: str) -> Optional[BenchmarkReading]:
    """The LAST `generated_tokens_mean=... tokens_per_sec=...` line, else the last
    `embeddings_per_sec=...`; None when neither is present (or a number does not parse). The
    line's `device_step_ms=` (CUDA runs) comes with it."""
    try:
        for kind, rx in (("tokens", RUN_BENCH_RE), ("embeddings", EMBED_BENCH_RE)):
            lines = [ln for ln in text.splitlines() if rx.search(ln)]
            if not lines:
                continue
            m = rx.search(lines[-1])
            assert m is not None
            dev = DEVICE_MS_RE.search(lines[-1])
            device_ms = float(dev.group(1)) if dev else None
            if kind == "tokens":
                return BenchmarkReading("tokens", float(m.group(1)), float(m.group(2)), device_ms)
            return BenchmarkReading("embeddings", None, float(m.group(1)), device_ms)
    except ValueError:
        return None
    return None


def run_shell(cmd: str, progress: Optional[Progress] = None, poll_s: float = 0.2) -> tuple[int, str, str]:
    """Run `cmd` through the shell in a fresh process group; return (rc, stdout, stderr), each the
    last MiB of what it printed. Cancellation (through `progress`) or Ctrl-C kills the whole group;
    so do running past MCORE_COMMAND_TIMEOUT seconds (default 3600) and printing more than 16 MiB,
    which are one-line errors (mcore/subproc.py)."""
    from .subproc import run_bounded, timeout_from_env

    timeout = timeout_from_env("MCORE_COMMAND_TIMEOUT", 3600.0)
    hint = "; set MCORE_COMMAND_TIMEOUT=SECONDS to allow longer"
    done = run_bounded(cmd, f"command `{cmd[:80]}`", timeout, progress or NO_PROGRESS, limit_hint=hint)
    return done.returncode, done.stdout, done.stderr


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else "(no output)"


def perf_gate(
    native_cmd: str,
    external_cmd: str,
    pairs: int = 6,
    min_ratio: float = 0.98,
    warmup: int = 1,
    on_sample: Optional[Callable[[str, int, float], None]] = None,
    progress: Optional[Progress] = None,
    on_line: Optional[Callable[[str], None]] = None,
    metric: str = "throughput",
) -> GateResult:
    """The no-regression gate: `warmup` runs of each command, then `pairs` fresh-process pairs
    alternating which arm goes first (pair 0: native first, pair 1: external first, ...).

    `metric`: "throughput" (the benchmark line's wall-clock tokens/s or embeddings/s, as the
    tutorial compares) or "device" (1000 / `device_step_ms`: the device time per step, CUDA
    runs only; on a small model the host's per-token work varies more between processes than a
    kernel changes the step, and this leaves it out).

    `on_sample(arm, pair_index, throughput)` is called after every measured run (arm is
    "native" or "external", pair_index 0-based); `on_line(text)` receives each info line as it
    is produced. Stops at the first hard failure (nonzero exit, missing benchmark line,
    non-positive throughput, differing generated_tokens_mean).
    """
    if not isinstance(native_cmd, str) or not native_cmd.strip():
        raise UserError("verify perf: --native needs a command to run")
    if not isinstance(external_cmd, str) or not external_cmd.strip():
        raise UserError("verify perf: --external needs a command to run")
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise UserError(f"verify perf: --pairs must be a positive integer, got {pairs!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise UserError(f"verify perf: --warmup must be 0 or more, got {warmup!r}")
    check_threshold("verify perf: --min-ratio", min_ratio, 0.0, lo_open=True)
    if metric not in METRICS:
        raise UserError(f"verify perf: --metric {metric!r} must be one of {', '.join(METRICS)}")
    prog = progress or Progress()
    cmds = {"native": native_cmd, "external": external_cmd}
    info: list[str] = []
    samples: dict[str, list[float]] = {"native": [], "external": []}
    ratios: list[float] = []
    gens: list[float] = []
    details: dict[str, Any] = {
        "pairs": pairs,
        "warmup": warmup,
        "min_ratio": min_ratio,
        "native": samples["native"],
        "external": samples["external"],
        "ratios": ratios,
        "order": [],
    }
    total_runs = 2 * (warmup + pairs)
    runs_done = 0

    def say(text: str) -> None:
        info.append(text)
        if on_line is not None:
            on_line(text)

    def fail(text: str) -> GateResult:
        return GateResult(False, f"FAIL: {text}", details, info)

    def run(arm: str, label: str) -> tuple[Optional[BenchmarkReading], Optional[str]]:
        nonlocal runs_done
        prog.report(f"{label}: {arm}", runs_done / total_runs)
        rc, out, err = run_shell(cmds[arm], prog)
        runs_done += 1
        prog.report(f"{label}: {arm} done", runs_done / total_runs)
        if rc != 0:
            return None, f"{arm} command exited with status {rc} ({label}): {_last_line(err or out)}"
        return parse_benchmark(out + "\n" + err), None

    for w in range(warmup):
        for arm in ("native", "external"):
            _, problem = run(arm, f"warmup {w + 1}/{warmup}")
            if problem:
                return fail(problem)
        say(f"warmup {w + 1}/{warmup}: done")

    unit = None
    for i in range(pairs):
        order = ("native", "external") if i % 2 == 0 else ("external", "native")
        details["order"].append(list(order))
        readings: dict[str, BenchmarkReading] = {}
        label = f"pair {i + 1}/{pairs}"
        for arm in order:
            reading, problem = run(arm, label)
            if problem:
                return fail(problem)
            if reading is None:
                return fail(
                    f"{arm} run ({label}) reported no benchmark line (expected "
                    f"'generated_tokens_mean=X ... tokens_per_sec=Y' or 'embeddings_per_sec=Y'); "
                    f"run it with --benchmark"
                )
            if metric == "device":
                if reading.device_step_ms is None:
                    return fail(
                        f"{arm} run ({label}) reports no device_step_ms (device time is measured on CUDA "
                        "only); use --metric throughput"
                    )
                if reading.device_step_ms <= 0:
                    return fail(f"device_step_ms must be positive ({arm}={reading.device_step_ms:g} in {label})")
                reading = BenchmarkReading(
                    reading.kind, reading.generated_tokens_mean, 1e3 / reading.device_step_ms, reading.device_step_ms
                )
            if reading.throughput <= 0:
                return fail(f"throughput must be positive ({arm}={reading.throughput:g} in {label})")
            readings[arm] = reading
            samples[arm].append(reading.throughput)
            if on_sample is not None:
                on_sample(arm, i, reading.throughput)
        n, e = readings["native"], readings["external"]
        if n.kind != e.kind:
            return fail(f"native reports {n.unit} but external reports {e.unit}; compare like with like")
        unit = n.unit if metric == "throughput" else ("device steps/s" if n.kind == "tokens" else "device calls/s")
        if n.generated_tokens_mean != e.generated_tokens_mean:
            return fail(
                f"generated_tokens_mean differs in {label} (native={n.generated_tokens_mean:g} "
                f"external={e.generated_tokens_mean:g})"
            )
        if n.generated_tokens_mean is not None:
            gens.append(n.generated_tokens_mean)
        ratio = e.throughput / n.throughput
        ratios.append(ratio)
        say(
            f"{label}: native={n.throughput:.2f} external={e.throughput:.2f} {unit} ratio={ratio:.4f} "
            f"({order[0]} first)"
        )

    median_ratio = statistics.median(ratios)
    native_median = statistics.median(samples["native"])
    external_median = statistics.median(samples["external"])
    details.update(
        median_ratio=median_ratio,
        native_median=native_median,
        external_median=external_median,
        unit=unit,
        metric=metric,
        generated_tokens_mean=gens[0] if gens else None,
    )
    summary = f"(native={native_median:.2f} external={external_median:.2f} {unit} over {pairs} pairs)"
    what = "throughput" if metric == "throughput" else "device-time throughput"
    prog.report("done", 1.0)
    if median_ratio < min_ratio:
        return GateResult(
            False,
            f"FAIL: external/native {what} median ratio {median_ratio:.4f} is below {min_ratio:g} {summary}",
            details,
            info,
        )
    return GateResult(True, f"PASS: external/native {what} median ratio {median_ratio:.4f} {summary}", details, info)
