"""The app tells the current screen about the action it runs through Textual messages
(workbench/messages.py), which screens handle in `on_action_...`: no screen hook is called by name,
a screen sees the typed result, and a handler that fails is shown in the UI, never a traceback."""

from __future__ import annotations

import pytest

from workbench.app import WorkbenchApp
from workbench.messages import ActionDone, ActionLog
from workbench.results import Recipes
from workbench.screens.build import BuildScreen

from .tui_helpers import no_hf_cache  # noqa: F401 (autouse fixture)


@pytest.mark.asyncio
async def test_a_failing_message_handler_is_reported_in_the_ui(tmp_path, monkeypatch):
    from textual.widgets import RichLog

    def broken(self, line, *args, **kwargs):
        raise RuntimeError(f"cannot show {line}")

    monkeypatch.setattr(RichLog, "write", broken)  # the Build screen's log handler writes there
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("escape", "f5")
        await pilot.pause(0.1)
        assert isinstance(app.screen, BuildScreen)
        app._post(ActionLog("a line"))
        await pilot.pause(0.1)
        assert app.is_running and app.last_error is not None
        assert "could not update the build screen: RuntimeError: cannot show a line" in app.last_error


@pytest.mark.asyncio
async def test_the_screen_gets_the_typed_result_when_an_action_ends(tmp_path, monkeypatch):
    """A real action (list_recipes on a missing snapshot fails; then on a captured one succeeds): the
    screen's ActionDone carries how it ended and, on success, the result as its dataclass."""
    seen: list[ActionDone] = []
    monkeypatch.setattr(BuildScreen, "on_action_done", lambda self, m: seen.append(m), raising=False)
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("escape", "f5")
        await pilot.pause(0.1)
        app.perform("list_recipes", {"snapshot": "missing.graph.json"})
        for _ in range(100):
            await pilot.pause(0.05)
            if seen:
                break
        (done,) = seen
        assert done.outcome.action == "list_recipes" and done.outcome.kind == "user"
        assert done.outcome.result is None and "missing.graph.json" in (done.outcome.error or "")
        seen.clear()
        from mcore import BuildArgs, capture, write_json

        snap = capture(BuildArgs(model="demo:qwen3-tiny", max_cache_length=64), "decode").snapshot
        write_json(tmp_path / "decode.graph.json", snap.to_dict())
        app.perform("list_recipes", {"snapshot": "decode.graph.json"})
        for _ in range(200):
            await pilot.pause(0.05)
            if seen:
                break
        (done,) = seen
        assert isinstance(done.outcome.result, Recipes) and done.outcome.kind == "ok"
        assert done.outcome.result.count == len(snap.recipe_rows) > 0
        assert done.outcome.results == done.outcome.result.to_dict()  # what the session recorded
