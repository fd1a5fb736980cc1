"""Headless replay: every shipped tutorial replays clean; tampered recordings are caught and named.

The full replays are the required CI check that the tutorials still work end to end (tiny demo
models, 16 tokens, 2 perf pairs). The tamper cases replay short slices of the shipped sessions.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from workbench.replay import replay

from .conftest import REPO
from .test_sessions import SHIPPED, shipped


def slice_session(name: str, indices: list[int], tmp_path: Path, tamper=None) -> Path:
    """A session made of steps `indices` (1-based) of shipped session `name`, optionally tampered."""
    data = shipped(name)
    data["steps"] = [copy.deepcopy(data["steps"][i - 1]) for i in indices]
    if tamper is not None:
        tamper(data["steps"])
    path = tmp_path / f"{name}-slice.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def step_index(name: str, action: str, nth: int = 0, **params) -> int:
    """1-based index of the nth step of `action` in a shipped session whose params match."""
    hits = [
        i
        for i, st in enumerate(shipped(name)["steps"], 1)
        if st["action"] == action and all(st["params"].get(k) == v for k, v in params.items())
    ]
    return hits[nth]


def table_rows(out: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[1:] if re.match(r"^\d+\s", line)]


def diff_rows(out: str) -> list[list[str]]:
    return [r for r in table_rows(out) if len(r) > 2 and r[2] == "DIFF"]


# ---------------------------------------------------------------- the shipped tutorials


@pytest.mark.slow  # minutes each where CUDA is (every pipeline compiles): the GPU box runs them apart
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_session_replays_clean(name, tmp_path, workbench):  # noqa: F811
    res = workbench(
        "replay",
        REPO / "sessions" / f"{name}.json",
        "--headless",
        "--workdir",
        tmp_path / "wd",
        "--trust-libraries",
        ".",
    )
    assert res.code in (0, 1), res.out + res.err
    rows = table_rows(res.out)
    steps = shipped(name)["steps"]
    n = len(steps)
    # steps that need CUDA are skipped, with a note, on a machine without it (and nothing else is)
    skipped = {i for i, st in enumerate(steps, 1) if st.get("requires") == "cuda" and not torch.cuda.is_available()}
    ran = n - len(skipped)
    assert [r[0] for r in rows] == [str(i) for i in range(1, n + 1)]
    assert [r[2] for r in rows] == ["SKIP" if i in skipped else "OK" for i in range(1, n + 1)], rows
    # the headline counts the gate verdicts too; a measured gate may fail on a loaded machine, and
    # then the replay says so and exits 1 (it failed as recorded: exit 0, and the headline says that)
    headline = res.out.strip().splitlines()[-1]
    gates = [st for i, st in enumerate(steps, 1) if st["action"].startswith("gate_") and i not in skipped]
    m = re.search(r"gates (\d+)/(\d+) passed", headline)
    assert (m and int(m.group(2)) == len(gates)) if gates else not m, headline
    all_passed = not gates or m.group(1) == m.group(2)
    assert headline.startswith(f"PASS: {ran}/{ran} steps matched, 0 difference(s)") or (
        not all_passed and headline.startswith(f"FAIL: {ran}/{ran} steps matched") and res.code == 1
    ), headline
    assert (f"{len(skipped)} skipped (they need CUDA" in headline) == bool(skipped), headline
    assert res.code == (0 if all_passed or "as recorded" in headline else 1), headline
    # the artifacts the tutorial talks about were written in the workdir
    wd = tmp_path / "wd"
    assert any(p.suffix == ".bundle" for p in wd.iterdir())
    assert any(p.name.endswith("kernel-bindings.json") for p in wd.iterdir())


def test_a_step_recorded_without_cuda_runs_where_cuda_is_and_its_gate_decides(tmp_path, monkeypatch):
    """A not_run step has nothing to compare: replayed where CUDA is, it must run, and a gate must pass."""
    import workbench.replay as R
    from workbench.session import Session

    for name, tokens in (("same", [1, 2, 3]), ("other", [1, 2, 4])):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"prompt": "p", "tokens": tokens, "text": ""}) + "\n")
    s = Session.new("cuda steps", device="cpu")
    s.record("gate_tokens", {"native": "same.jsonl", "external": "same.jsonl"}, requires="cuda", not_run=True)
    s.record("gate_tokens", {"native": "same.jsonl", "external": "other.jsonl"}, requires="cuda", not_run=True)
    monkeypatch.setattr(R, "cuda_here", lambda device: True)
    rep = replay(s, tmp_path, require_empty=False, keep_going=True)
    assert [o.status for o in rep.outcomes] == ["ok", "ok"] and [o.gate for o in rep.outcomes] == [True, False]
    assert not rep.ok and "gates 1/2 passed" in rep.summary()
    monkeypatch.setattr(R, "cuda_here", lambda device: False)
    rep = replay(s, tmp_path, require_empty=False)
    assert rep.ok and [o.verdict for o in rep.outcomes] == ["SKIP", "SKIP"]
    assert rep.summary().startswith("PASS: 0/0 steps matched") and "2 skipped" in rep.summary()


# ---------------------------------------------------------------- tampered recordings


def test_tampered_fingerprint_is_named(tmp_path, workbench):  # noqa: F811
    def tamper(steps):
        fp = steps[0]["results"]["fingerprint"]
        steps[0]["results"]["fingerprint"] = ("0" if fp[0] != "0" else "1") + fp[1:]

    path = slice_session("qwen-recipe", [1], tmp_path, tamper)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 1, res
    rows = diff_rows(res.out)
    assert len(rows) == 1 and rows[0][:4] == ["1", "capture_graph", "DIFF", "fingerprint"]
    assert res.out.strip().splitlines()[-1].startswith("FAIL: 0/1 steps matched, 1 difference(s)")


def test_tampered_abi_hash_is_named(tmp_path, workbench):  # noqa: F811
    name = "qwen-manual"
    idx = [1, step_index(name, "select_nodes", 1), step_index(name, "write_bindings")]

    def tamper(steps):
        steps[2]["results"]["abi_sha256"] = "f" * 64

    path = slice_session(name, idx, tmp_path, tamper)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 1, res
    rows = diff_rows(res.out)
    assert [r[:4] for r in rows] == [["3", "write_bindings", "DIFF", "abi_sha256"]]
    assert rows[0][4].startswith("ffff")


def test_a_bound_library_other_than_the_recorded_one_is_named(tmp_path, workbench):  # noqa: F811
    """write_bindings pins the DSO it binds (library_sha256, in the manifest and the results); a replay
    whose library has other bytes than the recording's says so. Recordings without it compare as before."""
    name = "qwen-manual"
    idx = [1, step_index(name, "select_nodes", 1), step_index(name, "build_kernel"), step_index(name, "write_bindings")]

    def tamper(steps):
        steps[3]["results"]["library_sha256"] = "0" * 64

    res = workbench("replay", slice_session(name, idx, tmp_path, tamper), "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 1, res
    assert [r[:4] for r in diff_rows(res.out)] == [["4", "write_bindings", "DIFF", "library_sha256"]]
    from mcore import library_sha256

    (entry,) = json.loads((tmp_path / "wd" / "kernel-bindings.json").read_text())["bindings"]
    assert entry["library_sha256"] == library_sha256(tmp_path / "wd" / "kernel.so")
    res = workbench("replay", slice_session(name, idx, tmp_path), "--headless", "--workdir", tmp_path / "wd2")
    assert res.code == 0 and not diff_rows(res.out), res


def test_tampered_token_is_named(tmp_path):
    name = "qwen-recipe"
    native = step_index(name, "build_bundle", recipe=None, graph_patch=None)
    gen = step_index(name, "generate", 0)

    def tamper(steps):
        steps[1]["results"]["tokens"][3] += 1

    path = slice_session(name, [native, gen], tmp_path, tamper)
    seen = []
    report = replay(path, tmp_path / "wd", on_step=lambda i, st, o: seen.append((i, st.action, o is None)))
    assert seen == [
        (1, "build_bundle", True),
        (1, "build_bundle", False),
        (2, "generate", True),
        (2, "generate", False),
    ]
    assert not report.ok
    assert [(i, a, d.field) for i, a, d in report.differences] == [(2, "generate", "tokens[3]")]
    table = report.render_table()
    assert re.search(r"^2\s+generate\s+DIFF\s+tokens\[3\]", table, re.M), table


def test_recorded_error_replays_as_the_same_error(tmp_path, workbench):  # noqa: F811
    name = "qwen-manual"
    rejected = step_index(name, "select_nodes", 0)
    path = slice_session(name, [1, rejected], tmp_path)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 0, res
    rows = table_rows(res.out)
    assert rows[1][:4] == ["2", "select_nodes", "OK", "error"] and "network output" in rows[1][-1]

    def other_text(steps):
        steps[1]["error"] = "some other rejection"

    path = slice_session(name, [1, rejected], tmp_path, other_text)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd2")
    assert res.code == 1
    assert [r[:5] for r in diff_rows(res.out)] == [["2", "select_nodes", "DIFF", "error", "some other rejection"]]


def test_recorded_error_that_now_succeeds_is_a_difference(tmp_path):
    name = "qwen-manual"
    good = step_index(name, "select_nodes", 1)

    def as_error(steps):
        steps[1].update(status="error", error="was rejected when recorded", results={})

    report = replay(slice_session(name, [1, good], tmp_path, as_error), tmp_path / "wd")
    assert not report.ok
    ((i, action, d),) = report.differences
    assert (i, action, d.field, d.expected, d.actual) == (
        2,
        "select_nodes",
        "status",
        "error: was rejected when recorded",
        "ok",
    )


def test_replay_stops_at_the_first_failing_step(tmp_path, workbench):  # noqa: F811
    """Later steps build on a failed one (and a perf gate takes a minute): stop, and say so."""
    name = "qwen-manual"
    good = step_index(name, "select_nodes", 1)

    def break_capture(steps):
        steps[0]["params"]["engine_role"] = "nonsense"

    path = slice_session(name, [1, good], tmp_path, break_capture)
    report = replay(path, tmp_path / "wd")
    assert [o.index for o in report.outcomes] == [1] and not report.ok
    assert "stopped after 1 of 2" in report.summary()
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd2")
    assert res.code == 1 and [r[0] for r in table_rows(res.out)] == ["1"]
    assert "stopped after 1 of 2" in res.out.strip().splitlines()[-1]


def test_a_failed_gate_fails_the_replay_even_when_every_step_matched(tmp_path, monkeypatch, workbench):  # noqa: F811
    """The perf gate is measured, never compared: its FAIL must still reach the headline and the exit code."""
    import dataclasses
    import functools

    from workbench.registry import REGISTRY

    real = REGISTRY["gate_perf"].fn

    @functools.wraps(real)
    def failing_gate(ctx, **params):
        return {
            "passed": False,
            "ratio": 0.5,
            "native": 40.0,
            "external": 20.0,
            "unit": "tokens/s",
            "line": "FAIL: external/native throughput median ratio 0.5000 is below 0.98",
            "info": [],
            "samples": {"native": [40.0], "external": [20.0]},
        }

    path = slice_session("qwen-recipe", [step_index("qwen-recipe", "gate_perf")], tmp_path)
    monkeypatch.setitem(REGISTRY, "gate_perf", dataclasses.replace(REGISTRY["gate_perf"], fn=failing_gate))
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd", "--trust-libraries", ".")
    headline = res.out.strip().splitlines()[-1]
    assert res.code == 1, res
    assert headline.startswith("FAIL: 1/1 steps matched, 0 difference(s), gates 0/1 passed (step 1 gate_perf failed)")

    def recorded_failing(steps):
        steps[0]["results"]["passed"] = False

    path = slice_session("qwen-recipe", [step_index("qwen-recipe", "gate_perf")], tmp_path, recorded_failing)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd2", "--trust-libraries", ".")
    assert res.code == 0, res
    assert "gates 0/1 passed (step 1 gate_perf failed, as recorded)" in res.out.strip().splitlines()[-1]


def test_keep_going_reports_every_step(tmp_path):
    """--keep-going: every difference is reported, later steps still run after one fails."""
    name = "qwen-manual"
    good = step_index(name, "select_nodes", 1)

    def break_capture(steps):
        steps[0]["params"]["engine_role"] = "nonsense"  # capture now fails with a one-line error

    report = replay(slice_session(name, [1, good], tmp_path, break_capture), tmp_path / "wd", keep_going=True)
    assert [o.status for o in report.outcomes] == ["error", "error"]
    fields = [(i, d.field) for i, _, d in report.differences]
    assert fields == [(1, "status"), (2, "status")]
    assert "engine role 'nonsense'" in report.differences[0][2].actual
    assert "FAIL: 0/2 steps matched, 2 difference(s)" in report.summary()
