"""The perf gate (`mcore verify perf`): the interval rule against references (t-table values, the t
density integrated by brute force, coverage by simulation), the three verdicts and their exit codes,
`--pairs auto` stopping, the metrics, and bad input. Fake benchmark commands stand in for `mcore run`."""

from __future__ import annotations

import math
import random
import shlex
import statistics
import sys
import threading
import time

import pytest

from mcore.cli.main import main
from mcore.common.errors import Cancelled, UserError
from mcore.common.progress import CancelToken, Progress
from mcore.verify.compare import parse_benchmark, perf_gate
from mcore.verify.details import PerfDecision, PerfDetails, TokensDetails
from mcore.verify.interval import look_confidence, ratio_interval, t_quantile, t_two_sided_mass
from mcore.verify.verdicts import GateResult

PY = shlex.quote(sys.executable)

# ---------------------------------------------------------------- the interval rule

# Student's t upper quantiles as printed in statistics tables (3 decimals)
T_TABLE = {
    0.95: {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 8: 1.860, 10: 1.812, 11: 1.796},
    0.975: {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
            11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042},
    0.995: {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 9: 3.250, 11: 3.106},
}  # fmt: skip


@pytest.mark.parametrize("p", sorted(T_TABLE))
def test_t_quantiles_match_the_printed_table(p):
    for df, value in T_TABLE[p].items():
        assert t_quantile(p, df) == pytest.approx(value, abs=6e-4), (p, df)


def _t_mass_by_integration(t: float, df: int, steps: int = 20000) -> float:
    """P(|T| <= t) by Simpson's rule over the t density: an independent brute-force reference."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = t / steps
    total = 0.0
    for i in range(steps + 1):
        x = i * h
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * c * (1 + x * x / df) ** (-(df + 1) / 2)
    return 2 * total * h / 3


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 8, 11])
def test_t_closed_form_agrees_with_the_integrated_density(df):
    for t in (0.3, 1.0, 2.0, 4.3, 9.9):
        assert t_two_sided_mass(t, df) == pytest.approx(_t_mass_by_integration(t, df), abs=1e-9), (df, t)
    assert t_two_sided_mass(0.0, df) == 0.0 and t_two_sided_mass(math.inf, df) == 1.0


def test_interval_is_the_t_interval_of_the_log_ratios():
    ratios = [0.99, 1.01, 1.00, 0.97]
    logs = [math.log(r) for r in ratios]
    mean, sd = sum(logs) / 4, statistics.stdev(logs)
    half = 3.182446305284263 * sd / 2  # t(0.975, 3), computed apart
    iv = ratio_interval(ratios, 0.95)
    assert (iv.n, iv.t) == (4, pytest.approx(3.182446305284263, rel=1e-9))
    assert iv.estimate == pytest.approx(math.exp(mean))
    assert (iv.low, iv.high) == (pytest.approx(math.exp(mean - half)), pytest.approx(math.exp(mean + half)))
    assert iv.verdict(0.90) == "PROMOTE" and iv.verdict(1.05) == "REJECT" and iv.verdict(0.98) == "INCONCLUSIVE"
    # the threshold exactly at the low end promotes (ratio >= threshold passes, as the tutorial's rule)
    assert iv.verdict(iv.low) == "PROMOTE"
    # a ratio and its inverse are symmetric on the log scale
    inv = ratio_interval([1 / r for r in ratios], 0.95)
    assert (inv.low, inv.high) == (pytest.approx(1 / iv.high), pytest.approx(1 / iv.low))
    # one pair has no spread: nothing can be decided
    one = ratio_interval([0.5], 0.95)
    assert one.verdict(0.98) == "INCONCLUSIVE" and one.high == math.inf


@pytest.mark.parametrize("n", [3, 6, 12])
def test_interval_covers_the_true_ratio_as_often_as_it_says(n):
    """Brute force: log-normal pair ratios around a known ratio, seeded; the 95% interval must hold the
    true ratio in 95% of 4000 gates (binomial sd 0.34%: within 1.2%), and a threshold at the true
    ratio must be REJECTed wrongly in at most 2.5% of them."""
    rng = random.Random(1234 + n)
    true, inside, wrong_reject = 0.97, 0, 0
    for _ in range(4000):
        ratios = [true * math.exp(rng.gauss(0, 0.03)) for _ in range(n)]
        iv = ratio_interval(ratios, 0.95)
        inside += iv.low <= true <= iv.high
        wrong_reject += iv.verdict(true) == "REJECT"
    assert abs(inside / 4000 - 0.95) < 0.012
    assert wrong_reject / 4000 < 0.025 + 0.008


def test_bonferroni_checks_keep_the_overall_confidence():
    assert look_confidence(0.95, 10) == pytest.approx(0.995)
    assert look_confidence(0.95, 1) == pytest.approx(0.95)


def _decided(r: GateResult[PerfDetails]) -> PerfDecision:
    """What a perf gate that measured its pairs decided by (a failed run has none)."""
    assert r.details.decision is not None, r.line
    return r.details.decision


def test_gate_result_words_and_exit_codes():
    d = TokensDetails(records=1, tokens=3)
    assert GateResult(True, "PASS: x", d).exit_code == 0 and GateResult(True, "PASS: x", d).verdict == "PASS"
    assert GateResult(False, "FAIL: x", d).exit_code == 1
    assert GateResult(True, "", d, verdict="PROMOTE").exit_code == 0
    assert GateResult(False, "", d, verdict="REJECT").exit_code == 1
    assert GateResult(False, "", d, verdict="INCONCLUSIVE").exit_code == 3
    with pytest.raises(ValueError):
        GateResult(True, "", d, verdict="INCONCLUSIVE")  # the word and `passed` must agree


# ---------------------------------------------------------------- fake benchmark commands

FAKE = r"""
import sys
arm, gen, values, log, rc, extra = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4], int(sys.argv[5]), sys.argv[6]
with open(log, "a") as f:
    f.write(arm + "\n")
count = sum(1 for line in open(log) if line.strip() == arm)
v = values[(count - 1) % len(values)]
print("mcore: some log line", file=sys.stderr)
if rc:
    print(f"{arm}: CUDA error: out of memory", file=sys.stderr)
    sys.exit(rc)
extra = extra.replace("{v}", v)
if gen == "embed":
    print(f"embed: prompts=1 iterations=10 embeddings_per_sec={v} {extra}")
else:
    print(f"run: generated_tokens_mean={gen} latency_ms_mean=3.0 tokens_per_sec={v} {extra}")
"""


@pytest.fixture
def fake(tmp_path):
    """fake(arm, gen, values, rc, extra): a command printing a benchmark line; `values` (comma-separated)
    are taken in turn, one per run of that arm (cycling); `extra` is appended ({v} is the value)."""
    script = tmp_path / "fake_bench.py"
    script.write_text(FAKE)
    log = tmp_path / "order.log"

    def cmd(arm, gen="32.0", values="100", rc=0, extra=""):
        return f"{PY} {shlex.quote(str(script))} {arm} {gen} {values} {shlex.quote(str(log))} {rc} {shlex.quote(extra)}"

    cmd.log = log
    return cmd


def test_promote_with_every_pair_the_interval_and_the_rule(fake):
    samples, lines = [], []
    r = perf_gate(
        fake("native"),
        fake("external", values="99,99.5,99.2"),
        pairs=4,
        warmup=1,
        on_sample=lambda *a: samples.append(a),
        on_line=lines.append,
    )
    assert (r.verdict, r.passed, r.exit_code) == ("PROMOTE", True, 0), r.line
    assert r.line.startswith("PROMOTE: external/native throughput ratio 0.99")
    assert "95% interval [" in r.line and "is at or above 0.98 (4 pairs;" in r.line
    assert r.info == lines  # streamed as produced
    pair_lines = [l for l in r.info if l.startswith("pair ")]
    # the warm-up run took the first value
    assert pair_lines[0] == "pair 1/4: native=100.00 external=99.50 tokens/s ratio=0.9950 (native first)"
    assert len(pair_lines) == 4
    assert any(l.startswith("metric: throughput") for l in r.info)
    assert any(l.startswith("interval: geometric mean ratio") for l in r.info)
    assert any(l.startswith("rule: PROMOTE when the whole 95% t-interval") for l in r.info)
    d = r.details
    assert d.decision is not None and d.decision.metric == "throughput"
    assert d.verdict == "PROMOTE" and d.pairs == 4
    iv = ratio_interval(list(d.ratios), 0.95)
    assert (d.decision.interval.low, d.decision.interval.high) == (iv.low, iv.high)
    assert d.decision.interval.low >= 0.98
    assert [s[0] for s in samples] == ["native", "external", "external", "native"] * 2


def test_reject_and_inconclusive(fake):
    r = perf_gate(fake("native"), fake("external", values="90,91,89"), pairs=3, warmup=0)
    assert (r.verdict, r.exit_code) == ("REJECT", 1) and r.line.startswith("REJECT: external/native")
    assert " is below 0.98 (3 pairs;" in r.line and _decided(r).interval.high < 0.98
    # one pair ran at half speed (a neighbour's job): the median would still say 1.0, the interval
    # cannot tell
    fake.log.unlink()
    r = perf_gate(fake("native"), fake("external", values="50,100,100,100,100"), pairs=5, warmup=0)
    assert r.details.ratios == (0.5, 1.0, 1.0, 1.0, 1.0) and _decided(r).median_ratio == 1.0
    assert (r.verdict, r.passed, r.exit_code) == ("INCONCLUSIVE", False, 3)
    assert "straddles 0.98: the pairs cannot tell" in r.line and "--pairs auto" in r.line


def test_alternation_order_and_warmup(fake):
    r = perf_gate(fake("native"), fake("external"), pairs=4, warmup=1)
    assert r.verdict == "PROMOTE"
    order = fake.log.read_text().split()
    assert order == ["native", "external"] + ["native", "external", "external", "native"] * 2
    assert r.details.order == (("native", "external"), ("external", "native")) * 2
    fake.log.unlink()
    perf_gate(fake("native"), fake("external"), pairs=2, warmup=3)
    assert fake.log.read_text().split().count("native") == 5


def test_pairs_auto_stops_once_decided(fake):
    r = perf_gate(fake("native"), fake("external", values="60,61,59"), pairs="auto", warmup=0)
    assert r.verdict == "REJECT" and r.details.pairs == 3 and _decided(r).stop == "decided after 3 pairs"
    assert fake.log.read_text().split().count("external") == 3
    checks = [l for l in r.info if l.startswith("check after")]
    assert checks == [checks[0]] and "99.5% interval" in checks[0] and "stopping: decided after 3 pairs" in checks[0]
    assert "each check at 99.5% (Bonferroni over 10 checks: 95% overall)" in _decided(r).rule
    assert "99.5% interval" in r.line


def test_pairs_auto_stops_at_max_pairs_undecided(fake):
    r = perf_gate(fake("native"), fake("external", values="90,110"), pairs="auto", max_pairs=5, warmup=0)
    assert r.verdict == "INCONCLUSIVE" and r.details.pairs == 5
    assert _decided(r).stop == "undecided after --max-pairs 5"
    assert [l.split(":")[0] for l in r.info if l.startswith("check after")] == [
        "check after 3 pairs",
        "check after 4 pairs",
        "check after 5 pairs",
    ]
    assert "undecided after --max-pairs 5; run again on a quieter machine" in r.line
    # each of the 3 checks runs at 1 - 0.05/3
    assert _decided(r).interval.confidence == pytest.approx(1 - 0.05 / 3)


def test_pairs_auto_stops_when_the_time_budget_runs_out(fake):
    r = perf_gate(fake("native"), fake("external", values="90,110"), pairs="auto", budget_s=0.001, warmup=0)
    assert r.details.pairs == 3 and r.verdict == "INCONCLUSIVE"  # the first 3 pairs always run
    assert _decided(r).stop == "the 0.001 s budget ran out after 3 pairs"


def test_pairs_auto_takes_more_pairs_when_the_first_ones_are_noisy(fake):
    # pairs 1-3 spread widely, then the runs settle at 0.95: the gate keeps measuring and REJECTs
    r = perf_gate(fake("native"), fake("external", values="92,99,95" + ",95" * 9), pairs="auto", max_pairs=12, warmup=0)
    assert r.verdict == "REJECT" and r.details.pairs == 8 and _decided(r).stop == "decided after 8 pairs"


def test_metric_auto_picks_device_then_fastest_step_then_throughput(fake):
    # device time steady, wall clock 30% apart: device decides
    dev = "device_step_ms={v}"
    r = perf_gate(
        fake("native", values="0.02000", extra=dev),
        fake("external", values="0.02010", extra=dev),
        pairs=2,
        warmup=0,
    )
    assert _decided(r).metric == "device" and r.verdict == "PROMOTE" and "device steps/s" in r.line
    assert list(r.details.ratios) == [pytest.approx(0.02 / 0.0201)] * 2
    assert any("(auto: both lines carry device_step_ms)" in l for l in r.info)
    # a CPU run: the fastest step decides; here the wall clock says 0.5 but every fastest step is the same
    best = "decode_ms_p50=9.0 decode_ms_min=1.2500"
    r = perf_gate(
        fake("native", values="100", extra=best), fake("external", values="50", extra=best), pairs=3, warmup=0
    )
    assert _decided(r).metric == "min-step" and r.verdict == "PROMOTE" and "steps/s (fastest)" in r.line
    assert r.details.native == (800.0,) * 3
    r = perf_gate(
        fake("native", values="100", extra=best),
        fake("external", values="50", extra=best),
        pairs=2,
        warmup=0,
        metric="throughput",
    )
    assert r.verdict == "REJECT"
    # an encoder's fastest call
    enc = "latency_ms_min=2.0000"
    r = perf_gate(
        fake("n", gen="embed", extra=enc), fake("e", gen="embed", extra="latency_ms_min=2.5"), pairs=2, warmup=0
    )
    assert _decided(r).metric == "min-step" and r.verdict == "REJECT" and "calls/s (fastest)" in r.line
    # lines as the tutorial prints them: throughput
    r = perf_gate(fake("native"), fake("external"), pairs=2, warmup=0)
    assert _decided(r).metric == "throughput"


def test_a_named_metric_the_lines_lack_fails_saying_what_to_use(fake):
    r = perf_gate(fake("native"), fake("external"), pairs=2, warmup=0, metric="device")
    assert r.verdict == "FAIL" and "no device_step_ms" in r.line and "--metric throughput" in r.line
    r = perf_gate(fake("native"), fake("external"), pairs=2, warmup=0, metric="min-step")
    assert r.verdict == "FAIL" and "no decode_ms_min" in r.line


def test_hard_failures(fake):
    r = perf_gate(fake("native", gen="32.0"), fake("external", gen="31.5"), pairs=3, warmup=1)
    assert r.line == "FAIL: generated_tokens_mean differs in pair 1/3 (native=32 external=31.5)"
    assert r.exit_code == 1 and r.verdict == "FAIL"
    r = perf_gate(fake("native"), fake("external", rc=3), pairs=2, warmup=1)
    assert r.line == "FAIL: external command exited with status 3 (warmup 1/1): external: CUDA error: out of memory"
    r = perf_gate(fake("native", values="0"), fake("external"), pairs=2, warmup=0)
    assert "throughput must be positive (native=0" in r.line
    r = perf_gate("echo hello", "echo hello", pairs=2, warmup=0)
    assert "native run (pair 1/2) reported no benchmark line" in r.line
    r = perf_gate(fake("native", gen="embed"), fake("external"), pairs=2, warmup=0)
    assert "compare like with like" in r.line


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"pairs": 1}, "--pairs must be a whole number >= 2 or auto, got 1; one pair has no spread"),
        ({"pairs": 0}, "--pairs"),
        ({"pairs": "sometimes"}, "--pairs"),
        ({"pairs": True}, "--pairs"),
        ({"warmup": -1}, "--warmup"),
        ({"min_ratio": 0}, "--min-ratio"),
        ({"min_ratio": float("nan")}, "--min-ratio"),
        ({"confidence": 1.0}, "--confidence"),
        ({"confidence": float("nan")}, "--confidence"),
        ({"confidence": 0.3}, "--confidence"),
        ({"metric": "gpu"}, "--metric 'gpu'"),
        ({"pairs": 4, "max_pairs": 8}, "--max-pairs and --budget-s bound --pairs auto"),
        ({"pairs": 4, "budget_s": 60}, "--max-pairs and --budget-s bound --pairs auto"),
        ({"pairs": "auto", "max_pairs": 2}, "--max-pairs must be a whole number in 3..1000"),
        ({"pairs": "auto", "budget_s": -1}, "--budget-s"),
        ({"pairs": "auto", "budget_s": float("inf")}, "--budget-s"),
        ({"native_cmd": " "}, "--native"),
        ({"external_cmd": ""}, "--external"),
    ],
)
def test_bad_arguments(kw, match):
    args = {"native_cmd": "true", "external_cmd": "true", "pairs": 2, "warmup": 0}
    args.update(kw)
    with pytest.raises(UserError, match=match.replace("(", r"\(")):
        perf_gate(**args)


@pytest.mark.timing
def test_progress_and_cancel():
    token = CancelToken()
    seen = []
    slow = f'{PY} -c "import time; time.sleep(30)"'
    t0 = time.monotonic()
    threading.Timer(0.5, token.cancel).start()
    with pytest.raises(Cancelled):
        perf_gate(slow, slow, pairs=2, warmup=0, progress=Progress(lambda s, f: seen.append(s), token))
    assert time.monotonic() - t0 < 10
    assert seen and seen[0].startswith("pair 1/2")


# ---------------------------------------------------------------- the CLI


def test_cli_prints_every_pair_the_interval_the_rule_and_exits_by_verdict(fake, capsys):
    rc = main(
        ["verify", "perf", "--native", fake("native"), "--external", fake("external", values="99"), "--pairs", "2"]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0] == "warmup 1/1: done"
    assert out[1].startswith("metric: throughput")
    assert out[2] == "pair 1/2: native=100.00 external=99.00 tokens/s ratio=0.9900 (native first)"
    assert out[3] == "pair 2/2: native=100.00 external=99.00 tokens/s ratio=0.9900 (external first)"
    assert out[4].startswith("interval: ") and out[5].startswith("rule: ")
    assert out[6].startswith("PROMOTE: external/native throughput ratio 0.9900, 95% interval [0.9900, 0.9900]")
    rc = main(
        ["verify", "perf", "--native", fake("native"), "--external", fake("external", values="50"), "--pairs", "2"]
    )
    assert rc == 1 and capsys.readouterr().out.splitlines()[-1].startswith("REJECT:")
    argv = ["verify", "perf", "--native", fake("native"), "--external", fake("external", values="90,110")]
    rc = main(argv + ["--pairs", "auto", "--max-pairs", "4", "--warmup", "0"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 3 and out[-1].startswith("INCONCLUSIVE:") and "undecided after --max-pairs 4" in out[-1]
    assert len([l for l in out if l.startswith("pair ")]) == 4
    assert [l for l in out if l.startswith("pair ")][0].startswith("pair 1/4 at most: ")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--pairs", "1"], "--pairs must be a whole number >= 2 or auto, got 1"),
        (["--pairs", "lots"], "--pairs must be a whole number >= 2 or auto, got 'lots'"),
        (["--pairs", "-3"], "got -3"),
        (["--max-pairs", "8"], "--max-pairs and --budget-s bound --pairs auto"),
        (["--pairs", "auto", "--budget-s", "nan"], "--budget-s nan must be a finite number"),
        (["--confidence", "2"], "--confidence 2.0 must be a finite number"),
        (["--metric", "gpu"], "invalid choice: 'gpu'"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, fragment, capsys):
    try:
        rc = main(["verify", "perf", "--native", "true", "--external", "true", *args])
    except SystemExit as e:  # argparse's own checks (a --metric it does not know)
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and fragment in err, err


def test_parse_benchmark_reads_the_fastest_step():
    r = parse_benchmark(
        "generated_tokens_mean=64.00 runs=10 tokens_per_sec=685.88 decode_ms_p50=1.382 decode_ms_min=1.0148 device=cpu"
    )
    assert (r.throughput, r.min_ms, r.device_step_ms) == (685.88, 1.0148, None)
    r = parse_benchmark("embeddings_per_sec=52.5 latency_ms_p50=19 latency_ms_min=17.5000 device_step_ms=0.5")
    assert (r.kind, r.min_ms, r.device_step_ms) == ("embeddings", 17.5, 0.5)
