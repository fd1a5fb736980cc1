"""The gates (`mcore verify tokens|embeddings|perf`), checked against the tutorial's own snippets."""

from __future__ import annotations

import json
import math
import random
import shlex
import sys
from pathlib import Path

import pytest

from mcore.cli.main import main
from mcore.common.errors import UserError
from mcore.verify.compare import GateResult, compare_embeddings, compare_tokens, parse_benchmark, perf_gate
from mcore.verify.details import TokensDetails
from tests.tutorial_snippets import STEP4_PERF_SNIPPET, STEP7_EMBEDDING_SNIPPET, run_snippet, tutorial_path

PY = shlex.quote(sys.executable)


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def rec(tokens, prompt="Explain grouped-query attention."):
    return {"prompt": prompt, "tokens": tokens, "text": "".join(chr(65 + t % 26) for t in tokens)}


# ---------------------------------------------------------------- snippets are verbatim


def test_snippets_are_verbatim_from_tutorial():
    p = tutorial_path()
    if p is None:
        pytest.skip("seed tutorial not visible from this checkout")
    text = p.read_text(encoding="utf-8")
    assert f"<<'PY'\n{STEP4_PERF_SNIPPET}PY\n" in text
    assert f"<<'PY'\n{STEP7_EMBEDDING_SNIPPET}PY\n" in text


# ---------------------------------------------------------------- tokens


def test_tokens_equal(tmp_path, capsys):
    a = write_jsonl(tmp_path / "native.jsonl", [rec([1, 2, 3]), rec([4, 5], "second")])
    b = write_jsonl(tmp_path / "external.jsonl", [rec([1, 2, 3]), rec([4, 5], "second")])
    r = compare_tokens(a, b)
    assert isinstance(r, GateResult) and r.passed
    assert r.line == "PASS: tokens identical (2 records, 5 tokens)"
    assert r.details == TokensDetails(records=2, tokens=5)
    assert main(["verify", "tokens", str(a), str(b)]) == 0
    assert capsys.readouterr().out.strip().endswith("PASS: tokens identical (2 records, 5 tokens)")


def test_tokens_differ(tmp_path, capsys):
    a = write_jsonl(tmp_path / "native.jsonl", [rec([1, 2, 3]), rec([4, 5, 6, 7], "second")])
    b = write_jsonl(tmp_path / "external.jsonl", [rec([1, 2, 3]), rec([4, 5, 9, 7], "second")])
    r = compare_tokens(a, b)
    assert not r.passed
    assert r.line.startswith("FAIL: record 2 (prompt 'second') differs at token position 2: native=6 external=9")
    assert r.details.first_record == 2 and r.details.first_position == 2
    assert r.details.differing == (6, 9)
    assert main(["verify", "tokens", str(a), str(b)]) == 1
    assert "FAIL: record 2" in capsys.readouterr().out


def test_tokens_shorter_sequence(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [rec([1, 2, 3])])
    b = write_jsonl(tmp_path / "b.jsonl", [rec([1, 2])])
    r = compare_tokens(a, b)
    assert not r.passed and "position 2: native=3 external=<end>" in r.line


def test_tokens_of_other_runs_are_a_usage_error_not_a_fail(tmp_path, capsys):
    # unequal record counts or prompts are two different runs, never a kernel's doing: exit 2, one line
    a = write_jsonl(tmp_path / "a.jsonl", [rec([1])])
    b = write_jsonl(tmp_path / "b.jsonl", [rec([1]), rec([2])])
    c = write_jsonl(tmp_path / "c.jsonl", [rec([1], "another prompt")])
    with pytest.raises(UserError, match=f"native {a} has 1 records but external {b} has 2; run both with the same"):
        compare_tokens(a, b)
    with pytest.raises(UserError, match="record 1 has different prompts in native .* and external .*'another prompt'"):
        compare_tokens(a, c)
    for other in (b, c):
        assert main(["verify", "tokens", str(a), str(other)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("mcore: error: ") and err.count("\n") == 1
    # records given from Python without prompts are compared by their tokens alone
    assert compare_tokens([{"tokens": [1]}], [rec([1], "any")]).passed
    with pytest.raises(UserError, match="native has 1 records but external has 0"):
        compare_tokens([{"tokens": [1]}], [])


def test_tokens_in_memory_records():
    assert compare_tokens([rec([1, 2])], [rec([1, 2])]).passed
    assert not compare_tokens([rec([1, 2])], [rec([1, 3])]).passed


def test_tokens_ignores_blank_lines(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps(rec([1])) + "\n\n" + json.dumps(rec([2])) + "\n")
    b = write_jsonl(tmp_path / "b.jsonl", [rec([1]), rec([2])])
    assert compare_tokens(a, b).passed


@pytest.mark.parametrize(
    "content,match",
    [
        ('{"prompt": "a", "tokens": [1]}\n{"prompt": "b", "tokens": [1\n', r"line 2: malformed JSON"),
        ('{"prompt": "a", "text": "x"}\n', r"line 1: missing field tokens"),
        ('{"tokens": [1, "2"]}\n', r"line 1: field tokens must be a list of integers"),
        ('{"tokens": [true]}\n', r"line 1: field tokens must be a list of integers"),
        ('[1, 2]\n', r"line 1: expected a JSON object"),
        ("", r"no token records"),
    ],
)
def test_tokens_bad_input(tmp_path, capsys, content, match):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    good = write_jsonl(tmp_path / "good.jsonl", [rec([1])])
    with pytest.raises(UserError, match=match):
        compare_tokens(good, bad)
    assert main(["verify", "tokens", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mcore: error: {bad}: ") and err.count("\n") == 1 and "Traceback" not in err


def test_tokens_missing_file(tmp_path, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", [rec([1])])
    assert main(["verify", "tokens", str(tmp_path / "nope.jsonl"), str(good)]) == 2
    assert "not found" in capsys.readouterr().err


# ---------------------------------------------------------------- embeddings vs the tutorial snippet


def _vec(seed: int, n: int = 768, scale: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0.0, scale) for _ in range(n)]


def _noisy(v, seed, amp):
    rng = random.Random(seed)
    return [x + rng.uniform(-amp, amp) for x in v]


EMBED_CASES = {
    "identical": (_vec(1), _vec(1)),
    "small_noise_pass": (_vec(2), _noisy(_vec(2), 3, 0.01)),
    "max_abs_fail": (_vec(4), [*_vec(4)[:-1], _vec(4)[-1] + 0.05]),
    "cosine_fail": (_vec(5, 64, 0.001), _noisy(_vec(5, 64, 0.001), 6, 0.0005)),
    "both_fail": (_vec(7), _vec(8)),
    "exact_max_abs_boundary": ([0.0, 1.0], [0.02, 1.0]),
    "ints_and_floats": ([1, 2, 3], [1.0, 2.0, 3.001]),
    "length_differs": (_vec(9, 10), _vec(9, 11)),
    "empty": ([], []),
}


@pytest.mark.parametrize("case", sorted(EMBED_CASES))
def test_embeddings_agree_with_tutorial_snippet(tmp_path, capsys, case):
    native, byok = EMBED_CASES[case]
    a, b = tmp_path / "native.json", tmp_path / "byok.json"
    a.write_text(json.dumps({"embedding": native}))
    b.write_text(json.dumps({"embedding": byok}))
    snip = run_snippet(STEP7_EMBEDDING_SNIPPET, a, b)
    snippet_pass = snip.returncode == 0
    assert snippet_pass == ("PASS: numerical gate" in snip.stdout)
    r = compare_embeddings(a, b, max_abs=0.02, min_cosine=0.999)
    assert r.passed == snippet_pass, (case, snip.stdout, snip.stderr, r)
    stats = [l for l in snip.stdout.splitlines() if l.startswith("values=")]
    if stats:
        assert r.info == stats  # the same numbers, printed the same way
        assert r.details.values == len(native)
    else:
        assert not r.passed and "FAIL: embedding lengths differ" in snip.stderr
        assert r.line.startswith("FAIL: embedding lengths differ")
    # The CLI prints the same stats line and verdict.
    rc = main(["verify", "embeddings", str(a), str(b), "--max-abs", "0.02", "--min-cosine", "0.999"])
    out = capsys.readouterr().out
    assert rc == (0 if snippet_pass else 1)
    if stats:
        assert out.splitlines() == [*stats, "PASS: numerical gate" if snippet_pass else "FAIL: numerical gate"]


def test_embeddings_numbers_exactly_as_snippet():
    native, byok = EMBED_CASES["small_noise_pass"]
    r = compare_embeddings({"embedding": native}, {"embedding": byok})
    max_abs = max(abs(a - b) for a, b in zip(native, byok, strict=True))
    denominator = math.sqrt(sum(v * v for v in native) * sum(v * v for v in byok))
    cosine = sum(a * b for a, b in zip(native, byok, strict=True)) / denominator
    assert r.details.max_abs == max_abs and r.details.cosine == cosine


def test_embeddings_thresholds():
    native, byok = EMBED_CASES["small_noise_pass"]
    assert compare_embeddings(native, byok).passed
    r = compare_embeddings(native, byok, max_abs=0.001)
    assert not r.passed and r.line == "FAIL: numerical gate" and "max_abs" in (r.details.reason or "")
    assert not compare_embeddings(native, byok, min_cosine=0.9999999999).passed


def test_embeddings_degenerate():
    r = compare_embeddings([0.0, 0.0], [0.0, 0.0])
    assert not r.passed and r.details.reason == "zero-norm embedding"
    r = compare_embeddings([1.0, float("nan")], [1.0, 1.0])
    assert not r.passed and r.details.reason == "non-finite values"


@pytest.mark.parametrize(
    "content,match",
    [
        ("{", "malformed JSON"),
        ('{"vector": [1.0]}', "missing field embedding"),
        ('{"embedding": [[1.0]]}', "flat list of numbers"),
        ('{"embedding": "1.0"}', "flat list of numbers"),
        ('{"embedding": [true]}', "flat list of numbers"),
    ],
)
def test_embeddings_bad_files(tmp_path, capsys, content, match):
    good = tmp_path / "good.json"
    good.write_text('{"embedding": [1.0]}')
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(UserError, match=match):
        compare_embeddings(good, bad)
    assert main(["verify", "embeddings", str(good), str(bad)]) == 2
    assert main(["verify", "embeddings", str(tmp_path / "missing.json"), str(good)]) == 2
    err = capsys.readouterr().err
    assert "mcore: error:" in err and "Traceback" not in err


# ---------------------------------------------------------------- perf: the tutorial's step-4 snippet

BENCH_LINE = (
    "run: prompts=1 warmup=3 iterations=10 generated_tokens_mean={gen} latency_ms_mean=12.5 tokens_per_sec={tps}"
)


def perf_log(path: Path, gen, tps, extra_before=None) -> Path:
    lines = ["mcore: loading bundle", "mcore: warmup 3 done"]
    for g, t in extra_before or []:
        lines.append(BENCH_LINE.format(gen=g, tps=t))
    if tps is not None:
        lines.append(BENCH_LINE.format(gen=gen, tps=tps))
    lines.append("mcore: done")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "native,external,verdict",
    [
        ((64.0, 100.0), (64.0, 99.0), "PASS"),
        ((64.0, 100.0), (64.0, 110.0), "PASS"),
        ((64.0, 100.0), (64.0, 97.0), "FAIL: external/native throughput is 0.9700, below 0.98"),
        ((64.0, 100.0), (63.5, 100.0), "FAIL: generated-token means differ"),
        ((64.0, 0.0), (64.0, 100.0), "FAIL: throughput must be positive"),
    ],
)
def test_step4_snippet_on_synthetic_logs_and_agreement(tmp_path, native, external, verdict):
    a = perf_log(tmp_path / "native.perf.log", *native)
    b = perf_log(tmp_path / "external.perf.log", *external)
    snip = run_snippet(STEP4_PERF_SNIPPET, a, b)
    if verdict == "PASS":
        assert snip.returncode == 0 and "PASS: external/native throughput is" in snip.stdout, snip
    else:
        assert snip.returncode == 1 and verdict in snip.stderr, snip
    # The gate reads the same logs the same way (two pairs of the same logs: no spread, so the interval
    # is the snippet's ratio itself; no warm-up).
    r = perf_gate(f"cat {shlex.quote(str(a))}", f"cat {shlex.quote(str(b))}", pairs=2, min_ratio=0.98, warmup=0)
    assert r.passed == (verdict == "PASS"), r.line
    assert (
        r.details.decision is None or r.details.decision.metric == "throughput"
    )  # the tutorial's lines carry nothing steadier


def test_step4_snippet_uses_last_benchmark_line(tmp_path):
    a = perf_log(tmp_path / "native.perf.log", 64.0, 100.0, extra_before=[(1.0, 1.0)])
    b = perf_log(tmp_path / "external.perf.log", 64.0, 99.5, extra_before=[(64.0, 1000.0)])
    snip = run_snippet(STEP4_PERF_SNIPPET, a, b)
    assert snip.returncode == 0 and "native=100.00 external=99.50 tokens/s" in snip.stdout
    reading = parse_benchmark(b.read_text())
    assert (reading.generated_tokens_mean, reading.throughput) == (64.0, 99.5)


def test_step4_snippet_missing_line(tmp_path):
    a = perf_log(tmp_path / "native.perf.log", 64.0, None)
    b = perf_log(tmp_path / "external.perf.log", 64.0, 100.0)
    snip = run_snippet(STEP4_PERF_SNIPPET, a, b)
    assert snip.returncode == 1 and "benchmark result was not reported" in snip.stderr
    r = perf_gate(f"cat {shlex.quote(str(a))}", f"cat {shlex.quote(str(b))}", pairs=2, min_ratio=0.98, warmup=0)
    assert not r.passed and "reported no benchmark line" in r.line


def test_parse_benchmark():
    assert parse_benchmark("x\nembed: embeddings_per_sec=52.5 latency_ms_mean=19\n").kind == "embeddings"
    assert parse_benchmark("nothing here") is None
    assert parse_benchmark("generated_tokens_mean=1.2.3 tokens_per_sec=5") is None
    r = parse_benchmark("generated_tokens_mean=32 a tokens_per_sec=7\nembeddings_per_sec=9")
    assert (r.kind, r.throughput) == ("tokens", 7.0)


def test_benchmark_line_keeps_the_tutorials_throughput_field():
    # the seed tutorial's own parser (tests/tutorial_snippets.py holds it) must still read the
    # wall-clock tokens/s from a line that also carries device_step_ms
    import re

    line = (
        "generated_tokens_mean=64.00 runs=10 tokens_per_sec=7888.61 ttft_ms_p50=1.805 decode_ms_p50=0.096 "
        "device=cuda engine=compiled device_step_ms=0.03125"
    )
    gen, tps = re.findall(r"generated_tokens_mean=([0-9.]+).*tokens_per_sec=([0-9.]+)", line)[-1]
    assert (gen, tps) == ("64.00", "7888.61")
    r = parse_benchmark(line)
    assert (r.throughput, r.device_step_ms) == (7888.61, 0.03125)
