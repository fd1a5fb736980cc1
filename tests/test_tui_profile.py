"""The Profile screen and the `profile` action (issue 14): mcore's profile of demo:qwen3-tiny on the
torch engine (CPU), its candidates listed in rank order, one taken to the Region screen with its
nodes marked and valid there, cancellation, replay-stable results, and SVG snapshots of a fixed
hand-made report (no measured number reaches a snapshot)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable

from mcore import ProfileReport
from mcore.profile.profiler import MAX_STEPS
from mcore.selection.region import select_region
from workbench.actions import ActionContext
from workbench.app import DEFAULT_BUILD_ARGS, WorkbenchApp
from workbench.commands import palette_entries
from workbench.dispatch import run_action
from workbench.registry import REGISTRY

from .profile_reports import fixed_report
from .tui_helpers import no_hf_cache, text_of  # noqa: F401 (autouse fixture)

SIZE = (80, 24)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The free-mode build arguments: the decode graph captured and the native bundle built, once."""
    wd = tmp_path_factory.mktemp("profile-work")
    ctx = ActionContext(workdir=wd)
    steps = [
        ("capture_graph", {"build_args": DEFAULT_BUILD_ARGS, "engine_role": "decode", "snapshot": "decode.graph.json"}),
        ("build_bundle", {"build_args": DEFAULT_BUILD_ARGS, "output": "native.bundle"}),
    ]
    out = []
    for action, params in steps:
        results, error = run_action(ctx, action, params)
        assert error is None, error
        # the app runs in its own work folder: the artifacts by absolute path
        for key in ("snapshot", "bundle"):
            if key in results:
                results = dict(results, **{key: str(wd / results[key])})
        out.append((action, params, results))
    return ctx.workdir, out


def load(app: WorkbenchApp, steps) -> None:
    for action, params, results in steps:
        app.apply_results(action, params, results)


async def wait(pilot, until, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)
    await pilot.pause(0.1)


def table_names(app) -> list[str]:
    t = app.screen.query_one("#candidates", DataTable)
    return [str(t.get_row_at(i)[-1]) for i in range(t.row_count)]


@pytest.mark.asyncio
async def test_profile_lists_candidates_and_selects_one_into_the_region_screen(built, tmp_path):
    wd, steps = built
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        load(app, steps)
        await pilot.press("f2", "p")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "profile"
        assert "Press r to profile" in text_of(app, "#profile-empty")
        await pilot.press("e", "e")  # the torch engine, what auto is on a CPU (on CUDA auto is compiled)
        await pilot.pause(0.1)
        assert "on engine torch" in text_of(app, "#profile-empty")
        # while it runs, the bars fill in step by step (labelled live) before the candidates come
        live: list[str] = []
        real = app.screen.refresh_view

        def watch() -> None:
            real()
            if app.busy == "profile" and app.state.profile_partial is not None:
                live.append(text_of(app, "#profile-head") + "\n" + text_of(app, "#bars-modules"))

        app.screen.refresh_view = watch
        await pilot.press("r")
        await wait(pilot, lambda: app.last_outcome is not None and not app.busy)
        assert app.last_outcome.kind == "ok", app.last_outcome.error
        assert any("live: step 1/3" in t for t in live) and any("live: step 3/3" in t for t in live)
        assert all("time by module" in t for t in live)
        assert "live:" not in text_of(app, "#profile-head") and table_names(app)
        report = json.loads((tmp_path / "profile-decode.json").read_text())
        assert report["kind"] == "mcore-profile" and report["role"] == "decode"
        assert report["bundle"]["fingerprint"] == app.state.snapshot.fingerprint
        assert app.session.steps[-1].action == "profile"
        # the table lists every candidate in the report's rank order
        names = [c["instance"] if c["kind"] == "recipe" else c["module_path"] for c in report["candidates"]]
        assert table_names(app) == names and len(names) > 3
        bars = text_of(app, "#bars-modules") + text_of(app, "#bars-ops")
        assert "decoder.layers.0" in bars or "…" in bars
        assert "mm" in text_of(app, "#bars-ops") or "linear" in text_of(app, "#bars-ops")
        # the candidates have the keys once the profile is done: Down moves, s takes the highlighted one
        assert app.focused is app.screen.query_one("#candidates", DataTable)
        i = next(i for i, c in enumerate(report["candidates"]) if c["kind"] == "region" and i > 0)
        await pilot.press(*["down"] * i)
        assert app.focused.cursor_row == i
        await pilot.press("s")
        await pilot.pause(0.3)
        assert app.screen.SCREEN_NAME == "region"
        region = report["candidates"][i]
        assert app.state.marked == region["node_ids"]
        assert app.screen.recipe is None and app.screen.error is None, app.screen.error
        assert list(app.screen.preview.node_ids) == region["node_ids"]
        # alt+left goes back to the Profile screen; a recipe candidate picks its recipe instance
        await pilot.press("alt+left")
        await pilot.pause(0.1)
        assert app.screen.SCREEN_NAME == "profile"
        j = next(j for j, c in enumerate(report["candidates"]) if c["kind"] == "recipe")
        app.screen.query_one("#candidates", DataTable).move_cursor(row=j)
        await pilot.press("s")
        await pilot.pause(0.3)
        rec = report["candidates"][j]
        assert app.screen.SCREEN_NAME == "region"
        assert app.screen.recipe == (rec["recipe"], rec["instance"]) and app.state.marked == rec["node_ids"]


@pytest.mark.asyncio
async def test_profile_with_fusion_marks_the_candidates_a_slot_would_split(built, tmp_path):
    wd, steps = built
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        load(app, steps)
        await pilot.press("f2", "p")
        await pilot.pause(0.1)
        await pilot.press("f")
        await wait(pilot, lambda: app.last_outcome is not None and not app.busy)
        assert app.last_outcome.kind == "ok", app.last_outcome.error
        report = json.loads((tmp_path / "profile-decode.json").read_text())
        assert report["fusion"]["kernels"] and app.session.steps[-1].params["fusion"] is True
        t = app.screen.query_one("#candidates", DataTable)
        cells = [str(t.get_row_at(i)[-1]) for i in range(t.row_count)]
        want = [f"splits {len(c['splits'])} fused" if c["splits"] else None for c in report["candidates"]]
        assert all(w in cell if w else "splits" not in cell for w, cell in zip(want, cells, strict=True))
        assert any(want)


@pytest.mark.asyncio
async def test_profile_names_the_engine_it_profiled(built, tmp_path):
    """e picks the engine r profiles: compiled on this CPU (Inductor's C++ kernels) shows its kernels,
    the time between them as a bar of its own and how much of the step they account for."""
    wd, steps = built
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        load(app, steps)
        await pilot.press("f2", "p")
        await pilot.pause(0.1)
        assert "on engine auto" in text_of(app, "#profile-empty")
        await pilot.press("e")
        await pilot.pause(0.1)
        assert "on engine compiled" in text_of(app, "#profile-empty")
        await pilot.press("r")
        await wait(pilot, lambda: app.last_outcome is not None and not app.busy)
        assert app.last_outcome.kind == "ok", app.last_outcome.error
        assert app.session.steps[-1].params["engine"] == "compiled"
        report = json.loads((tmp_path / "profile-decode.json").read_text())
        assert report["engine"]["name"] == "compiled" and app.state.profile.kernels
        head = text_of(app, "#profile-head")
        assert f"engine compiled: {len(report['kernels'])} kernels, between kernels" in head, head
        assert "between kernels" in text_of(app, "#bars-ops")
        names = [c["instance"] if c["kind"] == "recipe" else c["module_path"] for c in report["candidates"]]
        marks = [f"  splits {len(c['splits'])} fused" if c["splits"] else "" for c in report["candidates"]]
        assert table_names(app) == [n + m for n, m in zip(names, marks, strict=True)] and any(marks)


@pytest.mark.asyncio
async def test_profile_cancels_with_x_and_writes_nothing(built, tmp_path):
    _, steps = built
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        load(app, steps)
        await pilot.press("f2", "p")
        await pilot.pause(0.1)
        bundle = app.state.bundles["native"].result.bundle
        # the op-by-op profile reports each step (on CUDA the `auto` engine is the compiled one)
        long = {"bundle": bundle, "output": "long.json", "steps": MAX_STEPS, "engine": "torch"}  # seconds or more
        app.perform("profile", long)
        await wait(pilot, lambda: app.progress_step.startswith("profiling decode: step"))
        assert "x cancels" in text_of(app, "#profile-empty")
        await pilot.press("x")
        await wait(pilot, lambda: not app.busy, timeout=60)
        assert app.last_outcome.kind == "cancelled"
        assert not (tmp_path / "long.json").exists() and app.state.profile is None


def test_profile_results_replay_by_which_candidates_exist(built, tmp_path):
    """Two runs measure different times; the compared results (role, context, candidates) agree."""
    wd, steps = built
    bundle = steps[1][2]["bundle"]
    ctx = ActionContext(workdir=tmp_path)
    a, err = run_action(ctx, "profile", {"bundle": bundle, "output": "a.json", "steps": 1, "context": 50})
    assert err is None, err
    b, err = run_action(ctx, "profile", {"bundle": bundle, "output": "b.json", "steps": 1, "context": 50})
    assert err is None, err
    stable = REGISTRY["profile"].stable_keys
    assert stable == ("role", "context", "candidates")
    assert {k: a[k] for k in stable} == {k: b[k] for k in stable}
    assert a["role"] == "decode" and a["context"] == 50
    report = json.loads((tmp_path / "a.json").read_text())
    # `ranked` is the report's order; every candidate is a region select_region() accepts
    assert [c["node_ids"] for c in a["ranked"]] == [c["node_ids"] for c in report["candidates"]]
    assert sorted(map(json.dumps, a["ranked"])) == sorted(map(json.dumps, a["candidates"]))
    snap = json.loads(Path(steps[0][2]["snapshot"]).read_text())
    for c in report["candidates"]:
        select_region(snap, c["node_ids"], "my.kernel@1", 0, (), c["output_shape_input"])
    _, err = run_action(ctx, "profile", {"bundle": bundle, "output": "c.json", "role": "nope"})
    assert err is not None and "role 'nope' is not in this bundle" in err


def test_a_profile_the_bundle_cannot_serve_is_refused_before_its_pipeline_loads(built, tmp_path):
    from mcore import Progress

    _, steps = built
    bundle = steps[1][2]["bundle"]
    seen: list[str] = []
    ctx = ActionContext(workdir=tmp_path, progress=Progress(lambda step, f: seen.append(step)))
    for params, fragment in [
        ({"role": "nope"}, "role 'nope' is not in this bundle"),
        ({"context": 100000}, "--context 100000 must lie in 1.."),
    ]:
        _, err = run_action(ctx, "profile", {"bundle": bundle, "output": "c.json", "steps": 1, **params})
        assert err is not None and fragment in err, err
    assert not any("capturing" in s or "ready" in s for s in seen), seen  # no graph was captured
    assert not (tmp_path / "c.json").exists()


def test_palette_lists_the_profile_screen():
    entries = {e[0]: e for e in palette_entries()}
    assert entries["Go to Profile"][1:] == ("p on Graph", "", "show('profile')")
    assert entries["Profile: select region"][2:] == ("profile", "select_candidate")


# ------------------------------------------------------------------ snapshots: a fixed, hand-made report


@pytest.mark.parametrize(
    "size, engine",
    [((80, 24), "torch"), ((120, 40), "torch"), ((120, 40), "compiled")],
    ids=["80x24", "120x40", "120x40-compiled"],
)
def test_profile_screen_snapshot(snap_compare, tmp_path, size, engine):
    async def show(pilot) -> None:
        app = pilot.app
        await wait(pilot, lambda: bool(app.get_screen("model").family or app.get_screen("model").args_error), 60)
        app.state.profile = ProfileReport.from_dict(fixed_report(engine))
        app.state.profile_path = "profile-decode.json"
        await pilot.press("f2", "p")
        await pilot.pause(0.3)
        app.clear_notifications()

    work = tmp_path / "profile-work"  # a fixed name: the screen bar shows the work folder
    work.mkdir()
    app = WorkbenchApp(workdir=str(work))
    assert snap_compare(app, terminal_size=size, run_before=show)


def test_profile_steps_are_confined_like_every_action(tmp_path):
    """A session's profile step may not write outside the replay workdir (issue 11's one rule)."""
    from mcore.common.errors import UserError
    from workbench.dispatch import check_step_paths

    assert REGISTRY["profile"].native_param == "kernel_bindings"
    with pytest.raises(UserError, match="field output"):
        check_step_paths("profile", {"bundle": "n.bundle", "output": "../p.json"}, tmp_path, "s: step 1 (profile)")


@pytest.mark.asyncio
async def test_header_shows_the_device_facts(tmp_path, monkeypatch):
    """Issue 14: the header (screen bar) names the device and its measured copy rate, probed off the
    UI thread; the same line `describe_device` gives the Profile view."""
    from mcore import describe_device, device_facts

    monkeypatch.setenv("WORKBENCH_DEVICE_LINE", "1")
    app = WorkbenchApp(workdir=str(tmp_path / "wd"))
    app.state.device = "cpu"
    async with app.run_test(size=(160, 30)) as pilot:
        await wait(pilot, lambda: app.device_line != "", timeout=120)
        bar = text_of(app, "#navbar")
        assert app.device_line.startswith("cpu · copy ") and app.device_line.endswith(" GB/s")
        assert app.device_line in bar
        # the probe's line is mcore's own description of the device (the rate is measured once)
        import torch

        assert app.device_line == describe_device(device_facts(torch.device("cpu")))
