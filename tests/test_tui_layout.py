"""Layout that uses the room (issue 30): the Graph screen's module tree takes a share of the width
that grows with the terminal, `<` and `>` narrow and widen it, deep module names keep their tail
instead of vanishing, lists grow with the height, and the guide panel folds away below a width."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Tree

from workbench.actions import ActionContext
from workbench.app import WorkbenchApp
from workbench.dispatch import run_action
from workbench.layout import tail, tree_width
from workbench.screens.base import ROOMY_WIDTH
from workbench.session import Session, find_tutorial

from .tui_helpers import no_hf_cache  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    wd = tmp_path_factory.mktemp("layout-work")
    st = Session.load(find_tutorial("qwen-recipe")).steps[0]
    results, error = run_action(ActionContext(workdir=wd), st.action, st.params)
    assert error is None, error
    return st.params, dict(results, snapshot=str(wd / results["snapshot"]))


async def graph_at(app, pilot, captured) -> Tree:
    app.apply_results("capture_graph", *captured)
    await pilot.press("escape", "f2")
    await pilot.pause(0.3)
    return app.screen.query_one("#module-tree", Tree)


def screen_lines(app, region) -> list[str]:
    strips = app.screen._compositor.render_strips()
    out = []
    for y in range(region.y, region.bottom):
        text = "".join(seg.text for seg in list(strips[y]))
        out.append(text[region.x : region.right])
    return out


def test_the_tree_share_grows_with_the_width_and_names_keep_their_tail():
    assert tree_width(80) == 24 and tree_width(160) == 80 and tree_width(240) == 120
    assert tree_width(80) / 80 < tree_width(120) / 120 < tree_width(160) / 160
    assert tree_width(80, -100) == 24 and tree_width(120, 1000) == 120 - 40  # the table keeps its columns
    assert tail("decoder.layers.3.mlp.down_proj", 23) == "…layers.3.mlp.down_proj"
    assert tail("down_proj", 24) == "down_proj" and tail("abc", 1) == "…"


@pytest.mark.asyncio
async def test_the_tree_is_wider_on_a_wider_terminal_and_keys_resize_it(captured, tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        tree = await graph_at(app, pilot, captured)
        narrow = tree.outer_size.width
        await pilot.resize_terminal(160, 40)
        await pilot.pause(0.3)
        wide = tree.outer_size.width
        assert narrow == 24 and wide == 80  # 30% of 80 columns, half of 160
        await pilot.press("greater_than_sign", "greater_than_sign")
        await pilot.pause(0.2)
        assert tree.outer_size.width == wide + 8
        await pilot.press(*["less_than_sign"] * 4)
        await pilot.pause(0.2)
        assert tree.outer_size.width == wide - 8
        assert "module tree 72 columns" in app.message[0]


@pytest.mark.asyncio
async def test_deep_module_names_show_their_tail_instead_of_vanishing(captured, tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause(0.2)
        tree = await graph_at(app, pilot, captured)
        await pilot.press(*["less_than_sign"] * 3)  # as narrow as it goes: its minimum
        for node in app.screen._tree_nodes.values():
            node.expand()
        await pilot.pause(0.3)
        # each row without the tree's guides and icons, its border and the scrollbar
        lines = [ln.rstrip(" ▕▁▂▃▄▅▆▇█▔").lstrip("│├└ ▼▶▌") for ln in screen_lines(app, tree.region)]
        lines = [ln for ln in lines if ln]
        assert len(lines) >= 20
        assert all(len(ln) >= 4 for ln in lines), lines  # never just guides, as `│   │   │   ├── ▶ ▕` was
        assert "down_proj" in lines, lines
        assert any("…" in ln and "layernorm" in ln for ln in lines), lines


@pytest.mark.asyncio
async def test_lists_grow_with_the_height(captured, tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        app.apply_results("capture_graph", *captured)
        await pilot.press("escape", "f3")
        await pilot.pause(0.3)
        recipes = app.screen.query_one("#recipes", DataTable)
        assert recipes.row_count == 3 and recipes.size.height == 7  # its rows, no blank room below them
        for i in range(30):  # a deep model's list: one attention instance a layer
            recipes.add_row(f"decoder.layers.{i + 2}.decode_attention", "qwen.decode_attention_region@2", "node:1")
        await pilot.pause(0.3)
        small = recipes.size.height
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.3)
        assert small >= 7 and recipes.size.height >= small + 6


@pytest.mark.asyncio
async def test_the_guide_panel_folds_away_below_its_width(tmp_path):
    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path))
    async with app.run_test(size=(ROOMY_WIDTH - 10, 40)) as pilot:
        await pilot.pause(0.2)
        assert not app.screen.query_one("#guide").display and app.screen.query_one("#stepbar").display
        await pilot.resize_terminal(ROOMY_WIDTH + 10, 40)
        await pilot.pause(0.2)
        assert app.screen.query_one("#guide").display and not app.screen.query_one("#stepbar").display
