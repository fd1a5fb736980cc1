"""The Verify screen's reference check (r) and chat toggle (h), driven by key presses."""

from __future__ import annotations

import pytest
import transformers  # noqa: F401 - the reference; a test dependency, so its absence fails here

from workbench.app import WorkbenchApp

from .test_tui_pilot import static_text, wait_idle


@pytest.mark.asyncio
async def test_verify_screen_reference_check_and_chat_toggle(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        args = {"model": "demo:distilbert-tiny", "precision": "fp32"}
        app.state.build_args = dict(args)
        app.perform("build_bundle", {"build_args": args, "output": "native.bundle"})
        await wait_idle(app, pilot)
        assert "native" in app.state.bundles, static_text(app, "#error")
        await pilot.press("f6")
        await pilot.pause(0.1)
        assert "r compares the native bundle with transformers" in static_text(app, "#correctness")
        await pilot.press("r")
        await wait_idle(app, pilot)
        ref = app.state.reference
        assert ref is not None and ref.passed is True, static_text(app, "#error")
        assert ref.min_cosine is not None and ref.max_abs is not None
        assert ref.min_cosine > 0.99999 and ref.max_abs < 1e-4
        assert "PASS reference check" in static_text(app, "#correctness")
        step = app.session.steps[-1]
        assert step.action == "verify_reference" and step.params["checkpoint"] == "demo:distilbert-tiny"

        # a decoder: h turns the chat template on; without a template the check says so
        app.state.build_args = {"model": "demo:qwen3-tiny", "max_cache_length": 64}
        app.perform("build_bundle", {"build_args": app.state.build_args, "output": "q.bundle"})
        await wait_idle(app, pilot)
        await pilot.press("f6")
        await pilot.press("h")
        await pilot.pause(0.1)
        assert app.state.chat and "on (checkpoint's chat template)" in static_text(app, "#correctness")
        await pilot.press("r")
        await wait_idle(app, pilot)
        assert "no chat template" in static_text(app, "#error")
        assert app.session.steps[-1].params["chat"] is True
