"""One gate implementation (mcore/verify/gates.py) for the CLI (`mcore verify ...`), the workbench's gate
actions and the kernel watch: the same options with the same defaults, and both callers hand the
gate what the user asked for (the drift this replaced: the TUI's actions dropped `engine=`,
`min_cosine` and `max_abs`)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from mcore.cli.main import main, make_parser
from mcore.verify import gates as G
from mcore.verify.details import LogitsDetails, PerfDetails, ReferenceDetails
from mcore.verify.verdicts import GateResult
from workbench import actions
from workbench.actions import ActionContext

# action -> (gate class, the action's param name for each gate field it renames, fields from the context)
ACTION_GATES = {
    "gate_tokens": (G.TokensGate, {}, set()),
    "gate_embeddings": (G.EmbeddingsGate, {}, set()),
    "verify_reference": (G.ReferenceGate, {}, {"device"}),
    "gate_logits": (G.LogitsGate, {"native": "native_bundle", "external": "external_bundle"}, {"device"}),
}
# gate verb -> the gate class whose options its flags set, and the least argv that parses
CLI_GATES = {
    "embeddings": (G.EmbeddingsGate, ["a.json", "b.json"]),
    "reference": (G.ReferenceGate, ["x.bundle", "--checkpoint", "c", "--prompt", "p"]),
    "logits": (G.LogitsGate, ["n.bundle", "e.bundle", "--prompt", "p"]),
    "perf": (G.PerfOptions, ["--native", "true", "--external", "true"]),
}


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize("action", list(ACTION_GATES))
def test_every_gate_option_is_a_param_of_the_action_with_the_same_default(action):
    cls, renamed, from_ctx = ACTION_GATES[action]
    params = inspect.signature(getattr(actions, action)).parameters
    for f in dataclasses.fields(cls):
        if f.name in from_ctx:
            continue
        name = renamed.get(f.name, f.name)
        assert name in params, f"{action} lacks the gate's option {f.name}"
        if f.default is not dataclasses.MISSING:
            assert params[name].default == f.default, (action, name)


def test_the_perf_action_takes_every_perf_option_with_the_same_default():
    params = inspect.signature(actions.gate_perf).parameters
    for name, default in _defaults(G.PerfOptions).items():
        assert params[name].default == default, name
    assert "engine" in params  # the arms run on the engine the rest of the check used


@pytest.mark.parametrize("verb", list(CLI_GATES))
def test_the_cli_flags_default_to_the_gate_defaults(verb):
    cls, argv = CLI_GATES[verb]
    ns = make_parser().parse_args(["verify", verb, *argv])
    for name, default in _defaults(cls).items():
        if hasattr(ns, name):
            value = getattr(ns, name)
            assert (int(value) if name == "pairs" else value) == default, (verb, name)


# what each stand-in gate reports: nothing measured
STAND_IN_DETAILS = {
    G.ReferenceGate: ReferenceDetails(prompt_tokens=0),
    G.LogitsGate: LogitsDetails((), 0.0, None, (), 0.0, "torch", "cpu"),
    G.PerfGate: PerfDetails(0, 3, 1, 0.98, 0.95, (), (), (), (), "PASS"),
}


def _capture(monkeypatch, cls) -> list:
    """Replace `cls.run` with one that records the gate it was asked to run and passes."""
    seen: list = []

    def run(self, hooks=G.NO_HOOKS):
        seen.append(self)
        return GateResult(True, "PASS: stand-in", STAND_IN_DETAILS[cls])

    monkeypatch.setattr(cls, "run", run)
    return seen


def test_cli_and_action_build_the_same_reference_gate(monkeypatch, tmp_path: Path):
    tmp_path = tmp_path.resolve()
    seen = _capture(monkeypatch, G.ReferenceGate)
    bundle = str(tmp_path / "x.bundle")
    argv = ["verify", "reference", bundle, "--checkpoint", "demo:qwen3-tiny", "--prompt", "hi"]
    assert main([*argv, "--min-cosine", "0.5", "--max-abs", "0.25", "--max-rel", "0.125", "--chat"]) == 0
    ctx = ActionContext(workdir=tmp_path)
    actions.verify_reference(
        ctx, "x.bundle", "demo:qwen3-tiny", "hi", chat=True, min_cosine=0.5, max_abs=0.25, max_rel=0.125
    )
    cli, tui = seen
    assert cli == tui and (tui.min_cosine, tui.max_abs, tui.max_rel) == (0.5, 0.25, 0.125)


def test_cli_and_action_build_the_same_logits_gate(monkeypatch, tmp_path: Path):
    tmp_path = tmp_path.resolve()
    seen = _capture(monkeypatch, G.LogitsGate)
    n, e = str(tmp_path / "n.bundle"), str(tmp_path / "e.bundle")
    assert main(["verify", "logits", n, e, "--prompt", "hi", "--max-abs", "0.5", "--engine", "torch"]) == 0
    actions.gate_logits(ActionContext(workdir=tmp_path), "n.bundle", "e.bundle", "hi", max_abs=0.5, engine="torch")
    cli, tui = seen
    assert cli == tui and tui.engine == "torch" and tui.max_abs == 0.5


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    from mcore import BuildArgs, build_bundle

    d = tmp_path_factory.mktemp("gates")
    return build_bundle(
        BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64), d / "q.bundle"
    ).bundle_path


def test_the_perf_action_runs_its_arms_on_the_engine_asked_for(monkeypatch, tiny_bundle):
    """gate_perf builds both benchmark commands through the gate (BenchArms): `engine` reaches them."""
    seen = _capture(monkeypatch, G.PerfGate)
    ctx = ActionContext(workdir=tiny_bundle.parent)
    b = tiny_bundle.name
    actions.gate_perf(ctx, b, b, None, "hi", max_new_tokens=2, pairs=3, engine="torch", metric="min-step")
    (gate,) = seen
    assert "--engine torch" in gate.native and "--engine torch" in gate.external
    assert gate.options == G.PerfOptions(pairs=3, metric="min-step")
