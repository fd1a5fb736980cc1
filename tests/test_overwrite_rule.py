"""One overwrite rule for every output (issue 30): mcore.check_overwrite. The CLI replaces an
existing file only with --force (re-capturing the same graph to its snapshot loses nothing and is
allowed, as the tutorial does it); a workbench action only with `overwrite: true`, which the TUI
passes after asking; a session is never saved over one of its own artifacts; nothing is ever
written over a link or a device."""

from __future__ import annotations

import json
import os

import pytest

from mcore.common.errors import UserError
from mcore.common.fileio import check_overwrite
from workbench.actions import ActionContext
from workbench.app import WorkbenchApp
from workbench.dispatch import run_action
from workbench.registry import REGISTRY
from workbench.screens.dialogs import ConfirmOverwrite, ConfirmReplaceSession, PathPrompt
from workbench.session import Session, find_tutorial

from .conftest import assert_user_error
from .tui_helpers import no_hf_cache, text_of  # noqa: F401 (autouse fixture)

TINY = ["demo:qwen3-tiny", "--precision", "fp32", "--max-cache-length", "64"]
RECIPE = ["qwen.decode_logits_copy@1", "decoder.logits_zero_bias"]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    st = Session.load(find_tutorial("qwen-recipe")).steps[0]
    ctx = ActionContext(workdir=tmp_path_factory.mktemp("overwrite"))
    results, error = run_action(ctx, st.action, st.params)
    assert error is None, error
    return ctx.workdir / results["snapshot"]


def test_the_rule(tmp_path):
    f = tmp_path / "out.json"
    assert check_overwrite(f, False) == f  # nothing there yet
    f.write_text("keep")
    with pytest.raises(UserError, match="already exists; choose a new path or pass --force"):
        check_overwrite(f, False)
    assert check_overwrite(f, True) == f
    os.symlink(f, tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo")
    for p in (tmp_path / "link.json", tmp_path / "fifo"):
        with pytest.raises(UserError, match="refusing to write over it"):
            check_overwrite(p, True)  # not even with --force


def test_cli_outputs_need_force_to_replace_a_file(tmp_path, mcore, snapshot):
    taken = tmp_path / "taken"
    taken.write_text("keep")
    cases = [
        ("run", "no.bundle", "--prompt", "x", "--output", taken),
        ("build", *TINY, "-o", taken),
        ("graph", "select", snapshot, "--recipe", *RECIPE, "-o", taken),
        ("profile", "no.bundle", "-o", taken),
        ("graph", "inspect", "--engine-role", "decode", "--snapshot", taken, *TINY),  # no snapshot: before capture
    ]
    for args in cases:
        r = mcore(*args)
        assert_user_error(r, f"{taken} already exists", "--force")
        assert "[" not in r.err, args  # refused before any work: no progress line (a graph captured, then refused)
        assert taken.read_text() == "keep", args
    r = mcore("graph", "select", snapshot, "--recipe", *RECIPE, "-o", taken, "--force")
    assert r.code == 0 and json.loads(taken.read_text())["binding_id"] == RECIPE[0]


def test_a_recapture_of_the_same_graph_is_no_replacement_another_is(tmp_path, mcore):
    snap = tmp_path / "decode.graph.json"
    args = ("graph", "inspect", "--engine-role", "decode", "--snapshot", snap, *TINY)
    assert mcore(*args).code == 0
    first = snap.read_text()
    assert mcore(*args).code == 0 and snap.read_text() == first  # the tutorial captures it twice
    other = ("graph", "inspect", "--engine-role", "prefill", "--snapshot", snap, *TINY)
    assert_user_error(mcore(*other), "already exists", "--force")
    assert snap.read_text() == first
    assert mcore(*other, "--force").code == 0 and json.loads(snap.read_text())["metadata"]["engine_role"] == "prefill"


def test_export_replaces_only_with_force_and_only_once_it_succeeded(tmp_path, mcore):
    (tmp_path / "r.selection.json").write_text("{}")
    script = tmp_path / "export_fake.py"
    script.write_text(
        "import argparse\na = argparse.ArgumentParser(); a.add_argument('--selection'); a.add_argument('--output')\n"
        "a.add_argument('--snapshot'); ns = a.parse_args()\nopen(ns.output, 'wb').write(b'new')\n"
    )
    out = tmp_path / "k.so"
    out.write_bytes(b"old")
    base = ("kernel", "export", script, "--selection", tmp_path / "r.selection.json", "-o", out)
    assert_user_error(mcore(*base), "already exists", "--force")
    assert out.read_bytes() == b"old"
    assert mcore(*base, "--force").code == 0 and out.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export_fake.py", "k.so", "r.selection.json"]


def test_actions_refuse_an_existing_output_unless_told(tmp_path):
    ctx = ActionContext(workdir=tmp_path)
    (tmp_path / "native.jsonl").write_text("keep\n")
    params = {"bundle": "x.bundle", "prompt": "hi", "max_new_tokens": 2, "output": "native.jsonl"}
    results, error = run_action(ctx, "generate", params)
    assert results is None and "native.jsonl already exists" in error and "overwrite: true" in error
    assert (tmp_path / "native.jsonl").read_text() == "keep\n"
    # told to: the check passes, and the next one (the missing bundle) speaks
    _, error = run_action(ctx, "generate", dict(params, overwrite=True))
    assert "x.bundle" in error


def test_every_action_that_writes_names_its_outputs_and_takes_overwrite():
    import inspect

    for name, spec in REGISTRY.items():
        assert set(spec.output_params) <= set(spec.path_params), name
        if spec.output_params:
            assert "overwrite" in inspect.signature(spec.fn).parameters, name


def test_write_bindings_refuses_a_library_that_does_not_exist(tmp_path, snapshot):
    ctx = ActionContext(workdir=tmp_path)
    receipt = tmp_path / "r.json"
    _, error = run_action(ctx, "select_recipe", _select(snapshot, "r.json"))
    assert error is None
    _, error = run_action(ctx, "write_bindings", {"receipt": str(receipt), "library": "gone.so", "manifest": "kb.json"})
    assert "library gone.so: no such file" in error and not (tmp_path / "kb.json").exists()


def _select(snapshot, receipt: str) -> dict:
    return {"snapshot": str(snapshot), "recipe_id": RECIPE[0], "instance": RECIPE[1], "receipt": receipt}


# ------------------------------------------------------------------ the TUI asks


async def _settle(app, pilot) -> None:
    await pilot.pause(0.1)
    while app.busy:
        await pilot.pause(0.05)
    await pilot.pause(0.1)


@pytest.mark.asyncio
async def test_the_tui_asks_before_a_step_replaces_a_file(tmp_path, snapshot):
    (tmp_path / "r.json").write_text("old")
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        app.perform("select_recipe", _select(snapshot, "r.json"))
        await pilot.pause(0.1)
        assert isinstance(app.screen, ConfirmOverwrite) and "r.json" in str(app.screen.paths)
        await pilot.press("escape")  # keep it: the step does not run
        await _settle(app, pilot)
        assert (tmp_path / "r.json").read_text() == "old" and app.session is None
        assert "kept as it is" in text_of(app, "#status")
        app.perform("select_recipe", _select(snapshot, "r.json"))
        await pilot.pause(0.1)
        await pilot.press("y")
        await _settle(app, pilot)
        assert json.loads((tmp_path / "r.json").read_text())["binding_id"] == RECIPE[0]
        assert app.session.steps[-1].params["overwrite"] is True  # recorded as it ran


@pytest.mark.asyncio
async def test_ctrl_s_never_saves_over_the_sessions_artifacts_and_asks_over_other_files(tmp_path, snapshot):
    (tmp_path / "other.json").write_text("keep")
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        app.perform("select_recipe", _select(snapshot, "r.json"))
        await _settle(app, pilot)
        receipt = (tmp_path / "r.json").read_text()

        async def save_as(name: str) -> None:
            await pilot.press("escape", "ctrl+s")  # escape: out of the model field first
            await pilot.pause(0.1)
            assert isinstance(app.screen, PathPrompt)
            app.screen.query_one("#prompt-input").value = name
            await pilot.press("enter")
            await pilot.pause(0.1)

        await save_as("r.json")
        assert "is an artifact of this session (step 1 (select_recipe)" in text_of(app, "#error")
        assert (tmp_path / "r.json").read_text() == receipt
        await save_as("other.json")
        assert isinstance(app.screen, ConfirmOverwrite)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert (tmp_path / "other.json").read_text() == "keep" and app.unsaved_steps == 1
        await save_as("other.json")
        await pilot.press("y")
        await pilot.pause(0.1)
        assert [s.action for s in Session.load(tmp_path / "other.json").steps] == ["select_recipe"]
        await save_as("other.json")  # its own file again: a save, no question
        assert not isinstance(app.screen, ConfirmOverwrite) and app.unsaved_steps == 0


@pytest.mark.asyncio
async def test_ctrl_o_asks_before_replacing_a_session_with_unsaved_steps(tmp_path, snapshot):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        app.perform("select_recipe", _select(snapshot, "r.json"))
        await _settle(app, pilot)
        await pilot.press("escape", "ctrl+o")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ConfirmReplaceSession)
        await pilot.press("escape")  # stay
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmReplaceSession) and len(app.session) == 1 and app.guide is None
        await pilot.press("ctrl+o", "o")  # open it anyway: the path prompt
        await pilot.pause(0.1)
        assert isinstance(app.screen, PathPrompt)
