"""Pilot tests for safe typing and visible focus (issue 30): where the focus starts, what a letter
does after tab left a text field, `/` on the Kernel screen, numeric fields that keep their `-`, a
click in the Graph screen's module tree, and a focused widget that reads in 16 and 256 colours.

Each test presses keys as a user would and checks what happened: the app still running, the text
in a field, the screen shown, the colours on screen.
"""

from __future__ import annotations

import pytest
from rich.color import ColorSystem
from textual.widgets import Button, Input, OptionList, Tree

from workbench.actions import ActionContext
from workbench.app import WorkbenchApp
from workbench.dispatch import run_action
from workbench.session import Session, find_tutorial

from .tui_helpers import no_hf_cache, text_of  # noqa: F401 (autouse fixture)

SIZE = (80, 24)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The qwen-recipe tutorial's capture, run once through the action."""
    wd = tmp_path_factory.mktemp("typing-work")
    ctx = ActionContext(workdir=wd)
    st = Session.load(find_tutorial("qwen-recipe")).steps[0]
    results, error = run_action(ctx, st.action, st.params)
    assert error is None, error
    return ctx.workdir, st.params, results


def show_graph(app: WorkbenchApp, captured) -> None:
    wd, params, results = captured
    app.apply_results("capture_graph", params, dict(results, snapshot=str(wd / results["snapshot"])))


# ------------------------------------------------------------------ where typing goes


@pytest.mark.asyncio
async def test_free_mode_starts_in_the_model_field_so_typing_a_name_never_quits(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        spec = app.screen.query_one("#model-spec", Input)
        assert app.focused is spec
        await pilot.press(*"qwen")
        await pilot.pause(0.1)
        assert app.is_running and spec.value == "qwen"  # the prefilled name was selected: typing replaced it
        assert "enter, then c captures" in text_of(app, "#args-status") or app.screen.args_error
        await pilot.press("enter")  # done typing: the list takes the focus and letters are keys again
        assert isinstance(app.focused, OptionList)


@pytest.mark.asyncio
async def test_a_tutorial_starts_with_no_field_focused_so_n_is_the_next_step(tmp_path):
    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        assert not isinstance(app.focused, Input)


@pytest.mark.asyncio
async def test_letters_after_tab_left_the_field_are_not_commands(tmp_path):
    """A mis-tab while typing (the model field to its list, the DSO field to its buttons) must not
    turn the rest of the word into commands: q would quit, e would run the exporter."""
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        await pilot.press(*"demo:", "tab", *"qwen")
        await pilot.pause(0.1)
        assert app.is_running and not isinstance(app.focused, Input)
        assert "was not run as a key" in text_of(app, "#status") and "model-spec" in text_of(app, "#status")
        await pilot.press("escape")  # typing ends: letters are keys again
        await pilot.press("f4")
        await pilot.pause(0.1)
        await pilot.press("slash", *"tmp", "tab", *"k.so")
        await pilot.pause(0.1)
        assert isinstance(app.focused, Button)  # the key buttons' row: tab went there
        assert app.busy is None and app.last_error is None  # e, s, ... did nothing
        assert app.screen.query_one("#dso-path", Input).value == "/tmp"
        await pilot.press("shift+tab", *"/k.so")  # back in the field, the typing goes on
        assert app.screen.query_one("#dso-path", Input).value == "/tmp/k.so"
        await pilot.press("escape", "e")  # a key again: the exporter asks for its stub first
        await pilot.pause(0.1)
        assert "no stub yet" in text_of(app, "#error")


@pytest.mark.asyncio
async def test_slash_on_the_kernel_screen_focuses_the_dso_field_and_keeps_the_slash(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        await pilot.press("f4")
        await pilot.pause(0.1)
        await pilot.press("slash", *"tmp/k.so")
        field = app.screen.query_one("#dso-path", Input)
        assert app.focused is field and field.value == "/tmp/k.so"
        await pilot.press("enter")  # uses it: no such file, said so
        await pilot.pause(0.1)
        assert "/tmp/k.so: no such file" in text_of(app, "#error")


# ------------------------------------------------------------------ numbers keep their sign


@pytest.mark.asyncio
async def test_numeric_fields_refuse_a_negative_number_instead_of_dropping_the_minus(captured, tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        await pilot.click("#arg-cache")
        app.screen.query_one("#arg-cache", Input).value = ""
        await pilot.press(*"-1")
        await pilot.pause(0.2)
        assert app.screen.query_one("#arg-cache", Input).value == "-1"
        assert "--max-cache-length -1 must be a positive whole number" in text_of(app, "#args-status")
        show_graph(app, captured)
        await pilot.press("f3")
        await pilot.pause(0.2)
        app.screen.query_one("#recipes").focus()
        await pilot.press("enter")  # a recipe instance: valid until the workspace turns negative
        await pilot.pause(0.1)
        await pilot.click("#workspace")
        app.screen.query_one("#workspace", Input).value = ""
        await pilot.press(*"-5")
        await pilot.pause(0.2)
        assert app.screen.query_one("#workspace", Input).value == "-5"
        assert "workspace bytes -5 is negative" in text_of(app, "#region-check")
        await pilot.press("escape", "f6")
        await pilot.pause(0.1)
        await pilot.click("#max-new-tokens")
        app.screen.query_one("#max-new-tokens", Input).value = ""
        await pilot.press(*"-3")
        assert app.screen.query_one("#max-new-tokens", Input).value == "-3"


# ------------------------------------------------------------------ the module tree takes clicks


@pytest.mark.asyncio
async def test_clicking_a_module_in_the_graph_tree_shows_it(captured, tmp_path):
    """Textual runs a tree click's action with `namespaces`; the app's run_action must take it."""
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        show_graph(app, captured)
        await pilot.press("f2")
        await pilot.pause(0.2)
        graph = app.screen
        tree = graph.query_one("#module-tree", Tree)
        target = graph._tree_nodes["decoder.layers"]
        await pilot.click("#module-tree", offset=(tree.region.width // 2, target.line - tree.scroll_offset.y))
        await pilot.pause(0.2)
        assert app.is_running and app.last_error is None
        assert graph.scope == "decoder.layers" and tree.cursor_node is target


# ------------------------------------------------------------------ focus you can see


def _cell_colors(app, widget) -> tuple:
    """(foreground, background) on screen at the widget's first cell, ignoring the reverse attribute
    (some terminals and tmux captures drop it: focus must show as a change of colour)."""
    strips = app.screen._compositor.render_strips()
    x, y = widget.region.x + 1, widget.region.y
    pos = 0
    for seg in list(strips[y]):
        if pos + len(seg.text) > x:
            return seg.style.color, seg.style.bgcolor
        pos += len(seg.text)
    raise AssertionError("no cell")


def _rgb(color, system: ColorSystem, theme) -> tuple[int, int, int]:
    """A colour as a terminal of `system` colours shows it (default/ANSI colours through the theme)."""
    if color is None or color.is_default:
        return (0, 0, 0)
    c = color.downgrade(system) if system != ColorSystem.TRUECOLOR else color
    t = c.get_truecolor(theme)
    return (t.red, t.green, t.blue)


def _contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """The WCAG contrast ratio of two colours (1 = the same, 21 = black on white)."""

    def lum(rgb: tuple[int, int, int]) -> float:
        lin = [(v / 255) / 12.92 if v <= 10 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.asyncio
@pytest.mark.parametrize("ansi", [False, True], ids=["256-colour", "16-colour"])
async def test_a_focused_button_and_field_are_obvious(tmp_path, ansi):
    from rich.terminal_theme import MONOKAI

    app = WorkbenchApp(workdir=str(tmp_path), ansi=ansi)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        await pilot.press("f4")
        await pilot.pause(0.1)
        buttons = list(app.screen.query(Button))
        buttons[1].focus()
        await pilot.pause(0.1)
        # the 16-colour theme in a 16-colour terminal; the default theme rounded to the 256-colour palette
        system = ColorSystem.STANDARD if ansi else ColorSystem.EIGHT_BIT
        focused = _rgb(_cell_colors(app, buttons[1])[1], system, MONOKAI)
        plain = _rgb(_cell_colors(app, buttons[0])[1], system, MONOKAI)
        assert _contrast(focused, plain) > 3, (focused, plain)  # was 234 against 235
        label = _rgb(_cell_colors(app, buttons[1])[0], system, MONOKAI)
        assert _contrast(label, focused) > 4, (label, focused)  # and its label stays readable
        field = app.screen.query_one("#dso-path", Input)
        before = _rgb(_cell_colors(app, field)[1], system, MONOKAI)
        field.focus()
        await pilot.pause(0.1)
        after = _rgb(_cell_colors(app, field)[1], system, MONOKAI)
        assert _contrast(after, before) > 1.5, (after, before)
