"""Headless replay: every shipped tutorial replays clean; tampered recordings are caught and named.

The full replays are the required CI check that the tutorials still work end to end (tiny demo
models, 16 tokens; the perf gate at the fewest pairs `--pairs auto` takes, see `short_perf`). The
tamper cases replay short slices of the shipped sessions.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from workbench.replay import replay

from .conftest import needs_cute
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


def _shipped_params() -> list:
    """qwen-attention's perf gate needs CUDA and was recorded not run, so where CUDA is it has to
    PROMOTE: a timing check, run alone (under pytest -n 16 on the H200 it read INCONCLUSIVE)."""
    return [pytest.param(n, marks=pytest.mark.timing) if n == "qwen-attention" else n for n in SHIPPED]


def short_perf(name: str, tmp_path: Path) -> Path:
    """The shipped session, its perf gate still `pairs auto` but stopping at the fewest pairs that rule
    takes (`max_pairs` 3, where the recording allows 6) and without the warm-up runs: 6 fresh `mcore`
    processes instead of up to 14 (each pays its start-up; on CI's 2 cores that was a minute a
    replay). A measured verdict is never compared beyond its word, which the test already lets differ,
    so this changes the numbers only, not what is exercised (as the TUI tutorials' `shorten_perf`).
    qwen-attention replays as recorded: where CUDA is, its perf gate must PROMOTE (a timing check)."""
    data = shipped(name)
    if name != "qwen-attention":
        for st in data["steps"]:
            if st["action"] == "gate_perf":
                assert st["params"]["pairs"] == "auto", st["params"]
                st["params"].update(max_pairs=3, warmup=0)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.slow  # minutes each where CUDA is (every pipeline compiles): the GPU box runs them apart
@pytest.mark.long
@pytest.mark.parametrize("name", _shipped_params())
def test_shipped_session_replays_clean(name, tmp_path, workbench):  # noqa: F811
    res = workbench(
        "replay",
        short_perf(name, tmp_path),
        "--headless",
        "--workdir",
        tmp_path / "wd",
        "--trust-libraries",
        ".",
    )
    assert res.code in (0, 1, 3), res.out + res.err
    rows = table_rows(res.out)
    steps = shipped(name)["steps"]
    n = len(steps)
    # steps that need CUDA are skipped, with a note, on a machine without it (and nothing else is)
    skipped = {i for i, st in enumerate(steps, 1) if st.get("requires") == "cuda" and not torch.cuda.is_available()}
    ran = n - len(skipped)
    assert sorted({int(r[0]) for r in rows}) == list(range(1, n + 1))
    # every step matches; the perf gate's verdict is measured, so on a loaded machine it may differ
    # from the recording, and then the replay must say so: a DIFF on that step's verdict, exit 1
    perf = {i for i, st in enumerate(steps, 1) if st["action"] == "gate_perf" and i not in skipped}
    verdict_diffs = [r for r in rows if r[2] == "DIFF"]
    assert len(verdict_diffs) <= 1 and all(int(r[0]) in perf and r[3] == "verdict" for r in verdict_diffs), rows
    diffed = {int(r[0]) for r in verdict_diffs}
    assert [r[2] for r in rows] == [
        "SKIP" if i in skipped else "DIFF" if i in diffed else "OK" for i in range(1, n + 1)
    ]
    headline = res.out.strip().splitlines()[-1]
    gates = [st for i, st in enumerate(steps, 1) if st["action"].startswith("gate_") and i not in skipped]
    m = re.search(r"gates (\d+)/(\d+) passed", headline)
    assert (m and int(m.group(2)) == len(gates)) if gates else not m, headline
    all_passed = not gates or m.group(1) == m.group(2)
    if verdict_diffs:
        assert headline.startswith(f"FAIL: {ran - 1}/{ran} steps matched, 1 difference(s)"), headline
        assert "verdict changed" in headline and res.code == 1
    elif all_passed:
        assert headline.startswith(f"PASS: {ran}/{ran} steps matched, 0 difference(s)") and res.code == 0, headline
    else:  # a gate that did not pass, as recorded (the perf gate INCONCLUSIVE or REJECT again)
        assert headline.startswith(f"REPRODUCED: {ran}/{ran} steps matched") and res.code == 3, headline
    assert (f"{len(skipped)} skipped (they need CUDA" in headline) == bool(skipped), headline
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
    # the kernel too: write_bindings refuses a library that does not exist
    idx = [1, step_index(name, "select_nodes", 1), step_index(name, "build_kernel"), step_index(name, "write_bindings")]

    def tamper(steps):
        steps[3]["results"]["abi_sha256"] = "f" * 64

    path = slice_session(name, idx, tmp_path, tamper)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 1, res
    rows = diff_rows(res.out)
    assert [r[:4] for r in rows] == [["4", "write_bindings", "DIFF", "abi_sha256"]]
    assert rows[0][4].startswith("ffff")


def test_a_bound_library_other_than_the_recorded_one_is_named(tmp_path, workbench):  # noqa: F811
    """write_bindings pins the DSO it binds (library_sha256, in the manifest and the results). A library
    the replay did not build itself is held to the recording: other bytes are a difference."""
    from mcore import library_sha256

    name = "qwen-manual"
    idx = [1, step_index(name, "select_nodes", 1), step_index(name, "build_kernel"), step_index(name, "write_bindings")]
    res = workbench("replay", slice_session(name, idx, tmp_path), "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 0 and not diff_rows(res.out), res
    (entry,) = json.loads((tmp_path / "wd" / "kernel-bindings.json").read_text())["bindings"]
    assert entry["library_sha256"] == library_sha256(tmp_path / "wd" / "kernel.so")
    # the same steps but the build, recorded with the hash of what was built (as a recording made now
    # holds it): the library is already in the workdir, once as built, once altered
    built = (tmp_path / "wd" / "kernel.so").read_bytes()

    def pin(steps):
        steps[-1]["results"]["library_sha256"] = entry["library_sha256"]

    no_build = slice_session(name, [i for i in idx if i != step_index(name, "build_kernel")], tmp_path, pin)
    for folder, data, diffs in (("same", built, []), ("altered", built + b"\0", ["library_sha256"])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "kernel.so").write_bytes(data)
        rep = replay(no_build, tmp_path / folder, require_empty=False, trust_libraries=".")
        assert [d.field for o in rep.outcomes for d in o.differences] == diffs, folder


def test_a_library_built_in_the_replay_is_held_to_what_its_build_reported():
    """qwen-attention exports its DSO in the session. A compiled DSO's bytes differ by machine (the CuTe
    DSL compiles for the GPU it sees; a fresh checkout's export differed on the same CPU), so the
    bindings are held to the sha256 the export reported in this replay, not to the recording's."""
    from workbench.replay import built_here, compare_step
    from workbench.session import Session, find_tutorial

    s = Session.load(find_tutorial("qwen-attention"))
    actions = [st.action for st in s.steps]
    export, bind = actions.index("export_kernel"), actions.index("write_bindings")
    assert s.steps[export].params["output"] == s.steps[bind].params["library"]
    other = {**s.steps[bind].results, "library_sha256": "1" * 64}  # not the recording's bytes
    for exported, fields in (("1" * 64, []), ("2" * 64, ["library_sha256"]), (None, [])):
        now = {export: {**s.steps[export].results, "library_sha256": exported}}
        diffs = compare_step(s.steps[bind], "ok", other, None, expected=built_here(s, bind, now))
        assert [d.field for d in diffs] == fields, exported
    # the ABI hash is held to the recording whatever was built
    now = {export: {**s.steps[export].results, "library_sha256": "1" * 64}}
    diffs = compare_step(
        s.steps[bind], "ok", {**other, "abi_sha256": "f" * 64}, None, expected=built_here(s, bind, now)
    )
    assert [d.field for d in diffs] == ["abi_sha256"]


@pytest.mark.slow
@needs_cute
def test_a_session_whose_kernel_compiles_for_another_target_replays_clean(tmp_path, monkeypatch):
    """What a GPU box does to qwen-attention (recorded without a GPU, for sm_90a): its export compiles
    for the target there, so the bound DSO's bytes are not the recording's. Here the target is set to
    sm_90 instead, over the steps before the CUDA ones: before the fix the replay stopped at
    write_bindings on library_sha256."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90")
    rep = replay(slice_session("qwen-attention", list(range(1, 7)), tmp_path), tmp_path / "wd", trust_libraries=".")
    assert rep.ok and [o.status for o in rep.outcomes] == ["ok"] * 6, rep.summary()
    assert not any(o.differences for o in rep.outcomes)
    assert [o.action for o in rep.outcomes][3:5] == ["export_kernel", "write_bindings"]
    assert rep.outcomes[3].results["arch"] == "sm_90"


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


def _perf_gate_saying(verdict: str):
    """A stand-in for the perf gate (which takes minutes) that returns `verdict` with the new results."""
    import functools

    from workbench.registry import REGISTRY
    from workbench.results import PerfGated

    real = REGISTRY["gate_perf"].fn

    @functools.wraps(real)
    def gate(ctx, **params):
        return PerfGated.from_dict(
            {
                "passed": verdict == "PROMOTE",
                "verdict": verdict,
                "line": f"{verdict}: external/native fastest-step ratio 0.5000, 95% interval [0.4, 0.6] ...",
                "info": [],
                "ratio": 0.5,
                "interval": {"low": 0.4, "high": 0.6, "confidence": 0.95, "t": 4.3, "sd_log": 0.1},
                "samples": {"native": [40.0], "external": [20.0]},
            }
        )

    return gate


def _perf_slice(tmp_path: Path, recorded: dict | None) -> Path:
    """The qwen-recipe session's perf gate step alone, its recorded results replaced by `recorded`."""

    def tamper(steps):
        if recorded is not None:
            steps[0]["results"] = recorded

    return slice_session("qwen-recipe", [step_index("qwen-recipe", "gate_perf")], tmp_path, tamper)


OLD_PASS = {"passed": True, "line": "PASS: external/native throughput median ratio 0.9883 (...)", "info": []}
OLD_FAIL = {"passed": False, "line": "FAIL: external/native throughput median ratio 0.5000 is below 0.98", "info": []}


@pytest.mark.parametrize(
    "recorded,now,code,headline,diff",
    [
        # a recording from before verdicts were recorded: PASS by the median rule reads as PROMOTE
        (OLD_PASS, "PROMOTE", 0, "PASS: 1/1 steps matched, 0 difference(s), gates 1/1 passed", None),
        (OLD_PASS, "REJECT", 1, "FAIL: 0/1 steps matched, 1 difference(s), gates 0/1 passed "
         "(step 1 gate_perf verdict changed PROMOTE -> REJECT)", ("PROMOTE", "REJECT")),
        # the same failure again: reproduced, never PASS
        (OLD_FAIL, "REJECT", 3, "REPRODUCED: 1/1 steps matched, 0 difference(s), gates 0/1 passed "
         "(step 1 gate_perf REJECT: reproduced a recorded failure)", None),
        ({**OLD_FAIL, "verdict": "REJECT"}, "PROMOTE", 1, "FAIL: 0/1 steps matched, 1 difference(s), gates 1/1 passed "
         "(step 1 gate_perf verdict changed REJECT -> PROMOTE)", ("REJECT", "PROMOTE")),
        ({**OLD_PASS, "verdict": "PROMOTE"}, "INCONCLUSIVE", 1, "FAIL: 0/1 steps matched, 1 difference(s), "
         "gates 0/1 passed (step 1 gate_perf verdict changed PROMOTE -> INCONCLUSIVE)", ("PROMOTE", "INCONCLUSIVE")),
        ({"passed": False, "verdict": "INCONCLUSIVE", "line": "INCONCLUSIVE: ...", "info": []}, "INCONCLUSIVE", 3,
         "REPRODUCED: 1/1 steps matched, 0 difference(s), gates 0/1 passed "
         "(step 1 gate_perf INCONCLUSIVE, as recorded)", None),
    ],
)  # fmt: skip
def test_replay_compares_gate_verdicts(recorded, now, code, headline, diff, tmp_path, monkeypatch, workbench):  # noqa: F811
    """A changed verdict is a difference (table, headline, exit code); a reproduced recorded failure
    is said so and exits 3, never PASS."""
    import dataclasses

    from workbench.registry import REGISTRY

    monkeypatch.setitem(REGISTRY, "gate_perf", dataclasses.replace(REGISTRY["gate_perf"], fn=_perf_gate_saying(now)))
    path = _perf_slice(tmp_path, recorded)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd", "--trust-libraries", ".")
    assert res.code == code, res
    assert res.out.strip().splitlines()[-1].startswith(headline), res.out
    rows = table_rows(res.out)
    if diff is None:
        assert rows[0][2:5] == ["OK", "verdict", recorded.get("verdict", "PROMOTE" if recorded["passed"] else "REJECT")]
        assert (": reproduced a recorded failure" in rows[0][-1]) == (code == 3 and now != "INCONCLUSIVE")
    else:
        assert diff_rows(res.out) == [["1", "gate_perf", "DIFF", "verdict", *diff]]


def test_a_reproduced_correctness_failure_is_not_a_pass(tmp_path):
    """Any gate, not only perf: a token gate that failed when recorded and fails again is REPRODUCED
    (exit 3); one whose tokens now agree is a changed verdict (exit 1)."""
    from workbench.session import Session

    for name, tokens in (("native", [1, 2, 3]), ("external", [1, 2, 4])):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"prompt": "p", "tokens": tokens, "text": ""}) + "\n")
    s = Session.new("tokens differ", device="cpu")
    s.record(
        "gate_tokens",
        {"native": "native.jsonl", "external": "external.jsonl"},
        {"passed": False, "verdict": "FAIL", "line": "FAIL: record 1 differs", "info": []},
    )
    rep = replay(s, tmp_path, require_empty=False)
    assert rep.ok and rep.word == "REPRODUCED" and rep.exit_code == 3
    assert "gates 0/1 passed (step 1 gate_tokens FAIL: reproduced a recorded failure)" in rep.summary()
    assert rep.summary().startswith("REPRODUCED: 1/1 steps matched, 0 difference(s)")
    (tmp_path / "external.jsonl").write_text((tmp_path / "native.jsonl").read_text())
    rep = replay(s, tmp_path, require_empty=False)
    assert not rep.ok and rep.exit_code == 1
    assert [(d.field, d.expected, d.actual) for _, _, d in rep.differences] == [("verdict", "FAIL", "PASS")]
    assert "step 1 gate_tokens verdict changed FAIL -> PASS" in rep.summary()


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


def test_the_tui_replay_summary_says_what_the_headline_says(tmp_path):
    """The TUI's replay summary (screens/dialogs.replay_verdict) and the headless headline agree: a
    reproduced recorded failure is REPRODUCED with its note, a changed verdict is FAIL."""
    from workbench.screens.dialogs import replay_verdict
    from workbench.screens.guide import GuideState
    from workbench.session import Session

    s = Session.new("gates", device="cpu")
    s.record("gate_tokens", {"native": "a", "external": "b"}, {"passed": False, "verdict": "FAIL", "line": "FAIL: x"})
    s.record("gate_perf", {**PERF_PARAMS}, {"passed": True, "verdict": "PROMOTE", "line": "PROMOTE: x"})
    g = GuideState(s, mode="replay")
    g.finish(0, {"passed": False, "verdict": "FAIL", "line": "FAIL: x"}, None, "ok")
    g.finish(1, {"passed": True, "verdict": "PROMOTE", "line": "PROMOTE: y"}, None, "ok")
    assert replay_verdict(g) == ("REPRODUCED", ["step 1 gate_tokens FAIL: reproduced a recorded failure"])
    g = GuideState(s, mode="replay")
    g.finish(0, {"passed": False, "verdict": "FAIL", "line": "FAIL: x"}, None, "ok")
    g.finish(1, {"passed": False, "verdict": "INCONCLUSIVE", "line": "INCONCLUSIVE: y"}, None, "ok")
    word, notes = replay_verdict(g)
    assert word == "FAIL" and notes[1] == "step 2 gate_perf verdict changed PROMOTE -> INCONCLUSIVE"
    assert g.outcomes[1].diffs == [("verdict", "PROMOTE", "INCONCLUSIVE")]


PERF_PARAMS = {"native_bundle": "n", "external_bundle": "e", "kernel_bindings": None, "prompt": "p", "pairs": "auto"}


def test_the_verify_screen_verdict_follows_both_gates():
    from workbench.results import PerfGated, TokensGated
    from workbench.screens.verify import verdict
    from workbench.state import Applied

    def gate(cls, **results):
        return Applied("gate", {}, cls.from_dict(results))

    ok = gate(TokensGated, passed=True, line="PASS: tokens identical")
    iv = {"low": 0.93, "high": 1.03, "confidence": 0.95}

    def perf(**results):
        return gate(PerfGated, **results)

    assert verdict(ok, perf(passed=False, verdict="INCONCLUSIVE", interval=iv, min_ratio=0.98)) == (
        "INCONCLUSIVE",
        "cannot tell: the interval straddles 0.98 (correctness passed)",
    )
    assert verdict(ok, perf(passed=False, verdict="REJECT", interval={**iv, "high": 0.95}, min_ratio=0.98))[1] == (
        "performance: 95% interval [0.9300, 0.9500] is below 0.98"
    )
    failed = gate(TokensGated, passed=False, line="FAIL: x")
    assert verdict(failed, perf(passed=True, verdict="PROMOTE"))[0] == "REJECT"
    assert verdict(ok, perf(passed=True, verdict="PROMOTE", ratio=0.99))[0] == "PROMOTE"
    # a recording from before verdicts: its `passed` decides (the median rule's PASS reads as PROMOTE)
    old = perf(passed=False, line="FAIL: external/native throughput median ratio 0.5 is below")
    assert verdict(ok, old)[0] == "REJECT"
    assert verdict(ok, None)[0] == "PENDING"
