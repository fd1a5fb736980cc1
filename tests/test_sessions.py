"""Workbench sessions: round trip, strict validation (one-line errors, exit 2), the shipped tutorials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcore.common.errors import UserError
from workbench.actions import ActionContext
from workbench.dispatch import action_params, run_action
from workbench.registry import GATES, REGISTRY
from workbench.session import SESSION_KIND, Session, list_tutorials

from .conftest import REPO, CliResult, assert_user_error, repo_env

SESSIONS = REPO / "sessions"
SHIPPED = ("qwen-recipe", "qwen-attention", "qwen-manual", "distilbert-residual")


def sample_session() -> Session:
    s = Session.new("a test session", device="cpu")
    s.record(
        "capture_graph",
        {"build_args": {"model": "demo:qwen3-tiny"}, "engine_role": "decode", "snapshot": "decode.graph.json"},
        {"fingerprint": "ab" * 32, "nodes": 3, "tensors": 4, "recipes": 0, "snapshot": "decode.graph.json"},
        guide={"title": "Capture", "text": "Capture the graph."},
    )
    s.record(
        "select_nodes",
        {"snapshot": "decode.graph.json", "node_ids": ["node:1"], "binding_id": "k@1", "receipt": "r.json"},
        error=UserError("node:1 is a shape op; leave it out"),
    )
    return s


def shipped(name: str) -> dict:
    return json.loads((SESSIONS / f"{name}.json").read_text(encoding="utf-8"))


def write(tmp_path: Path, data, name: str = "s.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return p


# ---------------------------------------------------------------- model


def test_round_trip(tmp_path):
    s = sample_session()
    path = s.save(tmp_path / "session.json")
    loaded = Session.load(path)
    assert loaded.to_dict() == s.to_dict()
    assert loaded.steps[1].status == "error" and loaded.steps[1].error == "node:1 is a shape op; leave it out"
    assert loaded.steps[0].guide == {"title": "Capture", "text": "Capture the graph."}
    h = loaded.header
    assert h["title"] == "a test session" and h["guided"] is False and h["machine"]["device"] == "cpu"
    assert {"mcore", "torch", "python"} <= set(h["tool_versions"])
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"]  # no temp file left behind


def test_save_is_atomic_and_validated(tmp_path):
    s = sample_session()
    target = s.save(tmp_path / "session.json")
    before = target.read_bytes()
    s.steps[0].action = "no_such_action"
    with pytest.raises(UserError, match="unknown action"):
        s.save(target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json"]


def test_record_rejects_bad_steps():
    s = Session.new("t", device="cpu")
    with pytest.raises(UserError, match="unknown action"):
        s.record("frobnicate", {}, {})
    with pytest.raises(UserError, match="missing field.*engine_role"):
        s.record("capture_graph", {"build_args": {}, "snapshot": "x"}, {})
    with pytest.raises(UserError, match="unknown field.*colour"):
        s.record("embed", {"bundle": "b", "prompt": "p", "colour": "red"}, {})
    with pytest.raises(UserError, match="non-finite"):
        s.record(
            "gate_perf",
            {"native_bundle": "a", "external_bundle": "b", "kernel_bindings": None, "prompt": "p"},
            {"ratio": float("nan")},
        )
    assert len(s) == 0


def test_every_action_has_stable_keys_and_a_workdir_relative_signature():
    for name in REGISTRY:
        req, opt = action_params(name)
        assert not set(req) & set(opt)
    # a gate's verdict is compared (DESIGN.md contract 11); the perf gate's measurements are not
    assert REGISTRY["gate_perf"].stable_keys == ("verdict",)
    assert all(REGISTRY[g].stable_keys[0] == "verdict" for g in GATES)


def test_a_recorded_verdict_must_be_a_verdict_word():
    s = Session.new("t", device="cpu")
    with pytest.raises(UserError, match="results.verdict 'MAYBE' must be one of PASS, FAIL, PROMOTE"):
        s.record("gate_tokens", {"native": "a", "external": "b"}, {"passed": False, "verdict": "MAYBE"})
    s.record("gate_tokens", {"native": "a", "external": "b"}, {"passed": False, "verdict": "FAIL"})
    assert len(s) == 1


def test_action_paths_are_workdir_relative(tmp_path):
    ctx = ActionContext(workdir=tmp_path / "wd")
    assert ctx.path("a/b.json") == (tmp_path / "wd" / "a" / "b.json").resolve()
    assert ctx.rel(ctx.workdir / "x.bundle") == "x.bundle"
    results, error = run_action(ctx, "list_recipes", {"snapshot": "missing.graph.json"})
    assert results is None and error.startswith("missing.graph.json: graph snapshot not found")
    assert str(tmp_path) not in error


# ---------------------------------------------------------------- strict validation through the CLI


def _bad(name: str, mutate) -> dict:
    data = sample_session().to_dict()
    mutate(data)
    return data


BAD = {
    "missing header field": (lambda d: d["header"].pop("title"), ["header", "title"]),
    "unknown top-level field": (lambda d: d.update(extra=1), ["unknown field", "extra"]),
    "unknown step field": (lambda d: d["steps"][0].update(colour="red"), ["step 1", "colour"]),
    "missing step field": (lambda d: d["steps"][1].pop("status"), ["step 2", "status"]),
    "bad action name": (lambda d: d["steps"][1].update(action="select_everything"), ["step 2", "select_everything"]),
    "unknown param": (lambda d: d["steps"][0]["params"].update(layout="split"), ["step 1", "capture_graph", "layout"]),
    "missing param": (lambda d: d["steps"][0]["params"].pop("engine_role"), ["step 1", "engine_role"]),
    "wrong schema": (lambda d: d.update(schema_version=2), ["schema_version 2"]),
    "wrong kind": (lambda d: d.update(kind="mcore.graph_snapshot"), ["kind", SESSION_KIND]),
    "bad status": (lambda d: d["steps"][0].update(status="done"), ["step 1", "status"]),
    "error without text": (lambda d: d["steps"][1].update(error=None), ["step 2", "error"]),
    "ok with error text": (lambda d: d["steps"][0].update(error="boom"), ["step 1", "error must be null"]),
    "bad guide": (lambda d: d["steps"][0]["guide"].pop("text"), ["step 1", "guide", "text"]),
    "bad requirement": (lambda d: d["steps"][0].update(requires="tpu"), ["step 1", "requires 'tpu'", "cuda"]),
    "not_run without a requirement": (
        lambda d: d["steps"][0].update(status="not_run", error="no GPU", results={}),
        ["step 1", "not_run"],
    ),
    "steps not a list": (lambda d: d.update(steps={}), ["steps"]),
    "guided not bool": (lambda d: d["header"].update(guided="yes"), ["header.guided"]),
    # a step recorded ok holds params the tool parsed: other types or build args mean an edited file, named
    # when the file is read rather than after the steps before it ran
    "param of another type": (
        lambda d: d["steps"][0]["params"].update(engine_role=True),
        ["step 1 (capture_graph): params: field engine_role must be a string, got True"],
    ),
    "build_args not an object": (
        lambda d: d["steps"][0]["params"].update(build_args=None),
        ["step 1", "field build_args must be a JSON object, got None"],
    ),
    "build_args without a model": (
        lambda d: d["steps"][0]["params"].update(build_args={"precision": "bf16"}),
        ["step 1", "build_args must name a model"],
    ),
    "build_args that mcore build refuses": (
        lambda d: d["steps"][0]["params"]["build_args"].update(seed=True),
        ["step 1", "seed must be an integer, got True"],
    ),
}


def test_a_step_recorded_as_an_error_keeps_the_params_it_failed_on(tmp_path):
    """What a user typed wrong is recorded with the error it gave; the file loads and replays it."""
    s = Session.new("typed wrong", device="cpu")
    bad = {"build_args": {"model": "demo:qwen3-tiny", "weights": "x"}, "engine_role": "decode", "snapshot": "d.json"}
    s.record("capture_graph", bad, error=UserError("--weights 'x' is not supported; use one of checkpoint, random"))
    s.record("generate", {"bundle": "n.bundle", "prompt": "hi", "max_new_tokens": "4"}, error=UserError("boom"))
    path = s.save(tmp_path / "s.json")
    assert [st.params for st in Session.load(path).steps] == [bad, s.steps[1].params]
    recipe = {"build_args": {"model": "demo:qwen3-tiny"}, "output": "s.bundle", "recipe": ["qwen.x@1", 3]}
    with pytest.raises(UserError, match=r"field recipe must be a JSON list of strings or null, got \['qwen.x@1', 3\]"):
        s.record("build_bundle", recipe, {"bundle": "s.bundle"})
    with pytest.raises(UserError, match="field max_new_tokens must be an integer, got True"):
        s.record(
            "generate", {"bundle": "n.bundle", "prompt": "hi", "max_new_tokens": True}, {"tokens": [1], "text": "a"}
        )


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_session_is_one_line_exit_2(case, tmp_path, workbench):
    mutate, fragments = BAD[case]
    path = write(tmp_path, _bad(case, mutate))
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert_user_error(res, str(path), *fragments)
    assert not (tmp_path / "wd").exists()  # nothing ran


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("{not json", "malformed JSON"),
        ("[]", "expected a JSON object"),
        (
            '{"schema_version": 1, "kind": "mcore.workbench_session", "header": {}, "steps": [], "x": NaN}',
            "malformed JSON",
        ),
    ],
)
def test_malformed_file_is_one_line_exit_2(content, fragment, tmp_path, workbench):
    path = write(tmp_path, content)
    assert_user_error(workbench("replay", path, "--headless"), fragment)


def test_missing_file_and_bad_usage(tmp_path, workbench):
    assert_user_error(workbench("replay", tmp_path / "nope.json", "--headless"), "nope.json", "not found")
    assert_user_error(workbench("tutorial", "no-such-tutorial"), "no-such-tutorial", "qwen-recipe")
    res = workbench("replay")
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert res.err.startswith("workbench replay: error: the following arguments are required: file")
    res = workbench("frobnicate")
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["replay", "tutorial"])
def test_subcommand_help_names_the_subcommand_alone(workbench, command):
    # not the top-level usage (three alternatives) glued in front of the subcommand's
    res = workbench(command, "--help")
    assert res.code == 0 and res.out.startswith(f"usage: workbench {command} [-h]"), res.out


def test_nonempty_workdir_is_refused(tmp_path, workbench):
    path = sample_session().save(tmp_path / "s.json")
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "old.bundle").write_text("x")
    assert_user_error(workbench("replay", path, "--headless", "--workdir", wd), "new or empty folder")
    # the TUI refuses it the same way, before any screen opens, and writes nothing there
    assert_user_error(workbench("replay", path, "--workdir", wd), "new or empty folder")
    assert [p.name for p in wd.iterdir()] == ["old.bundle"]


@pytest.mark.asyncio
async def test_tui_replay_into_a_used_folder_is_refused(tmp_path):
    from workbench.app import WorkbenchApp

    path = sample_session().save(tmp_path / "s.json")
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "old.bundle").write_text("x")
    app = WorkbenchApp(replay=str(path), workdir=str(wd))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.1)
        assert app.guide is None and "new or empty folder" in (app.startup_error or "")


def test_cli_process_has_no_traceback(tmp_path):
    path = write(tmp_path, _bad("x", lambda d: d["steps"][0].update(action="nope")))
    r = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "replay", str(path), "--headless"],
        capture_output=True,
        text=True,
        env=repo_env(),
    )
    assert_user_error(CliResult(r.returncode, r.stdout, r.stderr), "step 1", "nope")


def test_tui_commands_open_the_app(tmp_path, workbench, monkeypatch):
    import workbench.app as app

    calls = []
    monkeypatch.setattr(app, "run_app", lambda **kw: calls.append(kw) or 0)
    path = sample_session().save(tmp_path / "s.json")
    assert workbench().code == 0
    assert workbench("tutorial").code == 0
    assert workbench("tutorial", "qwen-manual", "--workdir", tmp_path / "w").code == 0
    assert workbench("replay", path).code == 0
    assert calls == [
        {},
        {"tutorial": "qwen-recipe"},
        {"tutorial": "qwen-manual", "workdir": str(tmp_path / "w")},
        {"replay": str(path)},
    ]
    assert_user_error(workbench("tutorial", "qwen-recipe", "--list"), "not both")


# ---------------------------------------------------------------- shipped tutorials


def test_tutorial_list(workbench):
    res = workbench("tutorial", "--list")
    assert res.code == 0, res
    lines = res.out.strip().splitlines()
    assert lines[0].split() == ["NAME", "TITLE"]
    assert [l.split()[0] for l in lines[1 : 1 + len(SHIPPED)]] == list(SHIPPED)
    titles = {n: t for n, t, _ in list_tutorials()}
    for name in SHIPPED:
        assert titles[name] == shipped(name)["header"]["title"]
        assert titles[name] in res.out


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_session_is_a_guided_recorded_tutorial(name):
    s = Session.load(SESSIONS / f"{name}.json")
    assert s.guided and s.header["name"] == name
    assert all(st.guide and st.guide["title"] and len(st.guide["text"]) > 40 for st in s.steps)
    assert all(
        st.status == ("not_run" if st.requires and st.status == "not_run" else "ok")
        for st in s.steps
        if st.action != "select_nodes"
    )
    for st in s.steps:  # portable: no absolute paths recorded in params
        for v in st.params.values():
            assert not (isinstance(v, str) and os.path.isabs(v)), (st.action, v)
        if st.status == "ok":
            assert set(REGISTRY[st.action].stable_keys) <= set(st.results), st.action
    actions = [st.action for st in s.steps]
    gates = {
        "qwen-recipe": ["gate_tokens", "gate_perf"],
        "qwen-manual": ["gate_tokens"],
        "qwen-attention": ["gate_logits", "gate_perf"],
        "distilbert-residual": ["gate_embeddings", "gate_perf"],
    }[name]
    for g in gates:
        assert g in actions
        gate = s.steps[actions.index(g)]
        if g != "gate_perf" and gate.status == "ok":
            assert gate.results["passed"] is True and gate.results["verdict"] == "PASS"
        if g == "gate_perf" and gate.status == "ok":  # measured: any verdict, with its pairs, interval and rule
            assert gate.results["verdict"] in ("PROMOTE", "REJECT", "INCONCLUSIVE")
            assert gate.params["pairs"] == "auto" and len(gate.results["pairs"]) >= 3
            assert {"low", "high", "confidence"} <= set(gate.results["interval"]) and gate.results["rule"]
    if name == "qwen-attention":  # what runs only on a GPU says so; the rest was recorded here
        assert [st.action for st in s.steps if st.requires == "cuda"] == [
            "generate",
            "generate",
            "gate_logits",
            "gate_perf",
        ]


def test_manual_tutorial_takes_node_ids_from_the_capture():
    recipe = shipped("qwen-recipe")
    manual = shipped("qwen-manual")
    recipe_rows = next(st for st in recipe["steps"] if st["action"] == "list_recipes")["results"]["recipes"]
    logits = next(r for r in recipe_rows if r["id"] == "qwen.decode_logits_copy@1")
    selects = [st for st in manual["steps"] if st["action"] == "select_nodes"]
    assert selects[0]["status"] == "error" and "network output" in selects[0]["error"]
    assert selects[1]["status"] == "ok" and selects[1]["params"]["node_ids"] == logits["node_ids"]
    # same call contract as the recipe, so the same ABI hash
    slot = next(st for st in recipe["steps"] if st["action"] == "build_bundle")["results"]["kernel_slots"][0]
    assert selects[1]["results"]["abi_sha256"] == slot["abi_sha256"]


def test_python_dash_m_workbench_runs_the_cli():
    """`python -m workbench` works from a checkout without an install (the GPU box runs it so)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "workbench", "tutorial", "--list"], capture_output=True, text=True)
    assert r.returncode == 0 and "qwen-attention" in r.stdout, r.stderr
