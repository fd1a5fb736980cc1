"""Pilot tests for key handling and the conventions of well-liked terminal apps (issue 12).

Each test presses keys as a user would and checks what happened, not which method ran:
the screen shown, the widget with focus, the step index of the guide, the files written.
A captured decode graph is shared by the tests that need one (captured once, applied to
each app through the same apply_results the UI uses).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.command import CommandPalette
from textual.widgets import DataTable, Input, Tree

from workbench.actions import ActionContext
from workbench.app import WorkbenchApp
from workbench.dispatch import run_action
from workbench.screens.dialogs import ConfirmQuit, PathPrompt, SummaryModal, TrustModal
from workbench.session import Session, find_tutorial

from .tui_helpers import no_hf_cache, text_of  # noqa: F401 (autouse fixture)

SIZE = (80, 24)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The qwen-recipe tutorial's first two steps (capture, recipes), run once through the actions."""
    wd = tmp_path_factory.mktemp("keys-work")
    ctx = ActionContext(workdir=wd)
    steps = []
    for st in Session.load(find_tutorial("qwen-recipe")).steps[:2]:
        results, error = run_action(ctx, st.action, st.params)
        assert error is None, error
        steps.append((st.action, st.params, results))
    return ctx.workdir, steps


def load(app: WorkbenchApp, steps, wd: Path) -> None:
    """Show the captured results in `app` (its own work folder: the snapshot by absolute path)."""
    for action, params, results in steps:
        if "snapshot" in results:
            results = dict(results, snapshot=str(wd / results["snapshot"]))
        app.apply_results(action, params, results)


async def idle(app, pilot, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    await pilot.pause(0.05)
    while app.busy and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.pause(0.05)


# ------------------------------------------------------------------ item 1: keys that fired where they should not


@pytest.mark.asyncio
async def test_graph_search_enter_then_n_steps_through_matches_not_the_tutorial(captured, tmp_path):
    wd, steps = captured
    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        load(app, steps, wd)
        await pilot.press("f2")
        await pilot.pause(0.1)
        graph = app.screen
        await pilot.press("slash", *"*decode_attention*", "enter")
        await pilot.pause(0.1)
        rows = list(graph._rows)
        assert len(rows) >= 2
        assert isinstance(app.focused, DataTable)
        first = graph.current
        await pilot.press("n")
        await pilot.pause(0.1)
        assert app.guide.index == 0 and app.busy is None and app.session is None  # no tutorial step ran
        assert graph.current == rows[1] != first
        await pilot.press("N")
        assert graph.current == first
        # esc ends the search: n is the next tutorial step again
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert graph.pattern == "" and len(graph._rows) == len(app.state.snapshot.nodes)
        assert app.screen.check_action("next_match", (1,)) is False


@pytest.mark.asyncio
async def test_trust_dialog_n_is_not_decline(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    answers = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        app.push_screen(TrustModal("kernel.so", "kernel-bindings.json"), answers.append)
        await pilot.pause(0.1)
        await pilot.press("n")  # the guide's "next step" key: must not answer "do not load"
        await pilot.pause(0.1)
        assert isinstance(app.screen, TrustModal) and answers == []
        assert "press y to load" in text_of(app, "#trust-hint")
        await pilot.press("y")
        await pilot.pause(0.1)
        assert answers == [True]
        app.push_screen(TrustModal("kernel.so", "kernel-bindings.json"), answers.append)
        await pilot.pause(0.1)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert answers == [True, False]


@pytest.mark.asyncio
async def test_kernel_dso_field_enter_uses_it_and_esc_tab_and_f_keys_leave_it(tmp_path):
    (tmp_path / "mine.so").write_bytes(b"\0")
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("f4")
        await pilot.pause(0.1)
        field = app.screen.query_one("#dso-path", Input)
        await pilot.click("#dso-path")
        assert app.focused is field
        await pilot.press(*"mine.so", "enter")  # enter = use this path (l cannot be typed as a key here)
        await pilot.pause(0.1)
        assert app.state.library == "mine.so" and app.focused is not field
        field.focus()
        await pilot.press("tab")
        assert app.focused is not field
        field.focus()
        await pilot.press("escape")
        assert app.focused is not field
        await pilot.press("w")  # reachable now: it asks for a receipt first
        await pilot.pause(0.1)
        assert "no receipt yet" in text_of(app, "#error")
        field.focus()
        await pilot.press("f3", "f4")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "kernel" and not isinstance(app.focused, Input)
        assert field.value == "mine.so"  # no letters typed into the field by keys meant as actions


# ------------------------------------------------------------------ item 2: conventions


@pytest.mark.asyncio
async def test_q_quits_at_once_without_unsaved_steps(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("escape")  # free mode starts in the model field, where q is a letter
        await pilot.press("q")
        await pilot.pause(0.1)
        assert not app.is_running


@pytest.mark.asyncio
async def test_quit_with_unsaved_steps_asks_first(captured, tmp_path):
    wd, steps = captured
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        app.perform("list_recipes", {"snapshot": str(wd / "decode.graph.json")})
        await idle(app, pilot)
        assert app.unsaved_steps == 1
        await pilot.press("ctrl+q")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ConfirmQuit) and app.is_running
        await pilot.press("escape")  # stay
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmQuit) and app.is_running
        await pilot.press("f6")  # letters in a field are text, not quit
        await pilot.click("#prompt")
        app.screen.query_one("#prompt", Input).value = ""
        await pilot.press("q")
        assert app.is_running and app.screen.query_one("#prompt", Input).value == "q"
        await pilot.press("escape")
        await pilot.press("q", "s")  # save first: the path prompt, then quit
        await pilot.pause(0.1)
        app.screen.query_one("#prompt-input", Input).value = "mine.json"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert not app.is_running
    assert [s.action for s in Session.load(tmp_path / "mine.json").steps] == ["list_recipes"]


@pytest.mark.asyncio
async def test_escape_leaves_fields_and_never_switches_screens(tmp_path):
    """Esc closes (a field, the error, a search) and never navigates: after it the next letter acts on
    the screen the user is looking at. alt+left goes back."""
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("f3", "f6")
        await pilot.pause(0.1)
        await pilot.click("#prompt")
        assert isinstance(app.focused, Input)
        await pilot.press("escape")  # leaves the field, stays on the screen
        assert app.screen.SCREEN_NAME == "verify" and not isinstance(app.focused, Input)
        await pilot.press("escape", "escape")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "verify"
        assert "esc: nothing to close here" in text_of(app, "#status") and "alt+left goes back" in text_of(
            app, "#status"
        )
        await pilot.press("c")  # acts here: the Verify screen's correctness gate asks for its bundles
        await pilot.pause(0.1)
        assert "first build" in text_of(app, "#error")
        await pilot.press("escape", "alt+left")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "region"
        await pilot.press("alt+left")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "model"


@pytest.mark.asyncio
async def test_ctrl_p_palette_lists_screens_and_runs_actions(tmp_path):
    from workbench.commands import palette_entries

    labels = [e[0] for e in palette_entries()]
    for name in ("Model", "Graph", "Region", "Kernel", "Build", "Verify"):
        assert f"Go to {name}" in labels
    assert "Verify: performance" in labels and "Kernel: stub" in labels and "Quit" in labels
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"build native", "enter")
        await pilot.pause(0.3)
        # the palette switched to the Build screen and ran its action there
        assert app.screen.SCREEN_NAME == "build"
        assert app.busy == "build_bundle" or app.last_outcome is not None
        await pilot.press("x")
        await idle(app, pilot)


@pytest.mark.asyncio
async def test_the_summary_save_key_saves_the_session(tmp_path):
    """ctrl+s in the end-of-tutorial summary closes it and saves as the app's ctrl+s does (the dialog
    asks the app with a message: workbench.messages.SaveSession)."""
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        app.push_screen(SummaryModal(app))
        await pilot.pause(0.1)
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert isinstance(app.screen, PathPrompt)
        app.screen.query_one("#prompt-input", Input).value = "from-summary.json"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, (PathPrompt, SummaryModal))
    assert Session.load(tmp_path / "from-summary.json").steps == []


@pytest.mark.asyncio
async def test_clicking_a_tab_switches_screens(tmp_path):
    from workbench.screens.base import nav_labels

    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        x = sum(len(label) for _, label in nav_labels()[:4]) + 2  # inside " F5 Build "
        await pilot.click("#navbar", offset=(x, 0))
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "build"


@pytest.mark.asyncio
async def test_too_small_terminal_says_so(tmp_path):
    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path))
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause(0.1)
        assert app.screen.query_one("#too-small").display
        assert "terminal too small: the workbench needs 80x24" in text_of(app, "#too-small")
        assert not app.screen.query_one("#main").display and not app.screen.query_one("#stepbar").display
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.1)
        assert not app.screen.query_one("#too-small").display and app.screen.query_one("#main").display


@pytest.mark.asyncio
async def test_keys_behind_the_too_small_notice_reach_no_hidden_widget(tmp_path):
    """Below 80x24 the content is hidden behind the notice but keeps the focus: letters went into the
    hidden model field and PageDown on the kernel list (no lines laid out) logged a KeyError as a bug.
    Now only the notice's keys act (q quits, x cancels); at 80x24 again everything works as before."""
    from textual.widgets import Input

    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause(0.1)
        field = app.screen.query_one("#model-spec", Input)
        before = field.value
        assert app.focused is field  # the model field has the focus at launch
        await pilot.press("z", "z", "enter", "pagedown", "f4", "pagedown", "pageup", "enter", "n")
        await pilot.pause(0.1)
        assert field.value == before and app.screen.SCREEN_NAME == "model" and app.busy is None
        assert not (tmp_path / "workbench-errors.log").exists()
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.1)
        await pilot.press("f4")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "kernel"
        app.screen.query_one("#kernel-list").focus()
        await pilot.press("pagedown", "pageup")
        await pilot.resize_terminal(60, 20)
        await pilot.pause(0.1)
        await pilot.press("pagedown", "q")
        await pilot.pause(0.1)
    assert app.return_code == 0  # q quit from behind the notice (no unsaved steps)
    assert not (tmp_path / "workbench-errors.log").exists()


@pytest.mark.asyncio
async def test_footer_keeps_help_visible_at_80_columns(captured, tmp_path):
    from textual.widgets._footer import FooterKey

    wd, steps = captured
    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        load(app, steps, wd)
        for key in ("f1", "f2", "f3", "f4", "f5", "f6"):
            await pilot.press(key)
            await pilot.pause(0.1)
            keys = [k for k in app.screen.query(FooterKey) if k.key == "question_mark"]
            assert keys and keys[0].region.right <= SIZE[0], key


# ------------------------------------------------------------------ items 3-5: layout, notices, graph finding


@pytest.mark.asyncio
async def test_step_notices_go_to_the_status_line_not_toasts(captured, tmp_path):
    wd, steps = captured
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        load(app, steps, wd)
        await pilot.press("f2")
        await pilot.pause(0.1)
        for _ in range(3):  # three marks: one line, no stack of toasts
            await pilot.press("space", "down")
        app.perform("list_recipes", {"snapshot": str(wd / "decode.graph.json")})
        await idle(app, pilot)
        assert len(app._notifications) == 0
        assert "list recipes: done" in text_of(app, "#status")
        app.perform("gate_tokens", {"native": "missing.jsonl", "external": "missing.jsonl"})
        await idle(app, pilot)
        assert "failed" in text_of(app, "#status") and "token records not found" in text_of(app, "#error")
        await pilot.press("escape")
        assert text_of(app, "#error") == "" and len(app._notifications) == 0


@pytest.mark.asyncio
async def test_guide_is_a_step_bar_at_80x24_and_g_expands_it(tmp_path):
    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        assert not app.screen.query_one("#guide").display
        bar = text_of(app, "#stepbar")
        assert "1/10" in bar and "Capture the decode graph" in bar
        await pilot.press("g")
        await pilot.pause(0.1)
        assert app.screen.query_one("#guide").display and not app.screen.query_one("#stepbar").display
        await pilot.resize_terminal(120, 40)
        await pilot.press("g")
        await pilot.pause(0.1)
        assert not app.screen.query_one("#guide").display


@pytest.mark.asyncio
async def test_graph_tree_keys_and_search(captured, tmp_path):
    wd, steps = captured
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        load(app, steps, wd)
        await pilot.press("f2")
        await pilot.pause(0.1)
        graph = app.screen
        tree = graph.query_one("#module-tree", Tree)
        tree.focus()
        tree.move_cursor(tree.root)
        await pilot.press("enter")  # the root: shows the whole graph and never folds the tree away
        await pilot.pause(0.1)
        assert tree.root.is_expanded and tree.root.children[0].is_expanded
        layers = graph._tree_nodes["decoder.layers"]
        assert not layers.is_expanded
        tree.move_cursor(layers)
        await pilot.press("right")
        assert layers.is_expanded
        await pilot.press("left")
        assert not layers.is_expanded
        # the tree is searchable: n jumps to the next module whose path matches
        await pilot.press("slash", *"self_attn", "escape")
        assert graph.searching and not isinstance(app.focused, Input)
        tree.focus()
        await pilot.press("n")
        await pilot.pause(0.1)
        assert "self_attn" in tree.cursor_node.data and tree.cursor_node.data.startswith("decoder.layers.0")
        await pilot.press("n")
        await pilot.pause(0.1)
        assert tree.cursor_node.data.startswith("decoder.layers.1")
        # enter on a branch shows it; a search is not silently combined with it
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert graph.pattern == "" and graph.scope == tree.cursor_node.data
        await pilot.press("slash", *"logits")
        await pilot.pause(0.1)
        assert graph.scope == "" and all(
            "logits" in " ".join((n.name, n.module_path, graph.recipes.get(n.id, ""))).lower()
            for n in app.state.snapshot.nodes
            if n.id in graph._rows
        )


@pytest.mark.asyncio
async def test_graph_search_without_results_clears_the_details(captured, tmp_path):
    wd, steps = captured
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        load(app, steps, wd)
        await pilot.press("f2", "slash", *"no-such-thing")
        await pilot.pause(0.1)
        graph = app.screen
        assert graph._rows == [] and graph.current is None
        assert "no node matches 'no-such-thing'" in text_of(app, "#node-head")
        assert graph.query_one("#edges").option_count == 0


@pytest.mark.asyncio
async def test_layer_1_decode_attention_in_a_few_keys_with_its_recipe_in_full(captured, tmp_path):
    wd, steps = captured
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        load(app, steps, wd)
        await pilot.press("f2", "slash", *"decode_attention")  # words, not an exact glob: both layers
        await pilot.pause(0.1)
        graph = app.screen
        assert {graph.recipes.get(r) for r in graph._rows} == {
            "decoder.layers.0.decode_attention",
            "decoder.layers.1.decode_attention",
        }
        await pilot.press("escape", "escape")
        await pilot.press("slash", *"layers.1 attention", "enter")  # layer 1: one search and enter
        await pilot.pause(0.1)
        graph = app.screen
        assert graph.recipes.get(graph.current) == "decoder.layers.1.decode_attention"
        table = graph.query_one("#nodes", DataTable)
        col = next(c for c in table.columns.values() if c.key.value == "recipe")
        assert col.get_render_width(table) >= len("decoder.layers.1.decode_attention")
        # the whole recipe instance is on screen at 80 columns: the results take the tree's width
        keys = [c.key.value for c in table.ordered_columns]
        widths = [c.get_render_width(table) for c in table.ordered_columns]
        assert sum(widths[: keys.index("recipe") + 1]) <= table.size.width
        assert not graph.query_one("#module-tree").display


# ------------------------------------------------------------------ item 8: guidance


@pytest.mark.asyncio
async def test_capture_pressed_while_the_model_is_checked_is_queued(tmp_path, monkeypatch):
    """A cold cache makes the first model check slow: c then waits for it instead of refusing."""
    import threading

    import mcore.graph.capture as capture_mod

    real = capture_mod.resolve
    checked = threading.Event()  # the model check waits for it: "slow" until the test says so

    def slow_resolve(args):
        checked.wait(30)
        return real(args)

    monkeypatch.setattr(capture_mod, "resolve", slow_resolve)
    # the capture itself waits until the test has seen it running (a process that captured this graph
    # before copies it in milliseconds)
    real_captured_from, seen_running = capture_mod.captured_from, threading.Event()

    def slow_captured_from(*a, **k):
        seen_running.wait(30)
        return real_captured_from(*a, **k)

    monkeypatch.setattr(capture_mod, "captured_from", slow_captured_from)
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        try:
            await pilot.pause(0.05)
            assert app.screen.family is None  # still checking
            await pilot.press("enter", "c")  # enter: done with the model field, so c is a key
            await pilot.pause(0.05)
            assert "capture starts as soon as it is ready" in text_of(app, "#status") and not app.last_error
        finally:
            checked.set()
        deadline = time.monotonic() + 30
        while app.busy != "capture_graph" and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert app.busy == "capture_graph"
        await pilot.press("f2")  # while it runs, the Graph screen says so instead of "No graph yet"
        await pilot.pause(0.05)
        assert "Capturing the graph" in text_of(app, "#graph-empty")
        seen_running.set()
        await idle(app, pilot)
        assert app.state.snapshot is not None and app.screen.SCREEN_NAME == "graph"


def test_free_mode_uses_the_tutorial_build_args_in_a_fresh_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = WorkbenchApp(), WorkbenchApp()
    assert a.state.workdir != b.state.workdir  # never silently the same folder as last time
    assert a.state.workdir.parent == (tmp_path / "artifacts").resolve()
    tutorial = next(s for s in Session.load(find_tutorial("qwen-recipe")).steps if s.action == "capture_graph")
    for k, v in a.state.build_args.items():
        assert tutorial.params["build_args"][k] == v, k
