"""SVG snapshots of every workbench screen at 80x24 and 120x40 (pytest-textual-snapshot).

The screens show real results: the qwen-recipe tutorial's steps (all but the measured
performance gate) run once through the actions into a shared work folder, and each snapshot
app loads those results. Nothing time-dependent is shown: paths are relative to the work
folder, the perf plot uses fixed sample values (their verdict and interval by mcore's own rule),
notifications are cleared.
Regenerate with `pytest tests/test_tui_snapshots.py --snapshot-update` after a deliberate
UI change, then review the SVGs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import Input

from workbench.actions import ActionContext
from workbench.app import WorkbenchApp
from workbench.dispatch import run_action
from workbench.results import EmbeddingsGated, PerfGated
from workbench.screens.dialogs import TrustModal
from workbench.session import Session, find_tutorial
from workbench.state import Applied

SIZES = [(80, 24), (120, 40)]
SCREENS = ["model", "graph", "region", "kernel", "build", "verify"]
KEYS = {name: f"f{i + 1}" for i, name in enumerate(SCREENS)}

# A deterministic stand-in for a measured gate (the real gate is exercised by the pilot tests): fixed
# samples, with the verdict, interval and rule the gate's own rule gives them.
SAMPLES = {"native": [40.1, 41.5, 41.2, 40.8, 41.9, 41.2], "external": [39.8, 41.0, 41.1, 41.3, 41.6, 40.9]}


def perf_result(samples: dict, params: dict | None = None) -> Applied[PerfGated]:
    """What gate_perf records for these per-pair samples (fastest-step steps/s), by mcore's rule."""
    import statistics

    from mcore.verify.interval import ratio_interval
    from mcore.verify.perf import PerfPlan

    plan = PerfPlan(6, 12, None, 0.98, 0.95, 1, "min-step")
    ratios = [e / n for n, e in zip(samples["native"], samples["external"], strict=True)]
    iv = ratio_interval(ratios, 0.95)
    word = iv.verdict(0.98)
    where = {"PROMOTE": "is at or above 0.98", "REJECT": "is below 0.98", "INCONCLUSIVE": "straddles 0.98"}[word]
    nm, em = statistics.median(samples["native"]), statistics.median(samples["external"])
    result = {
        "passed": word == "PROMOTE",
        "verdict": word,
        "ratio": iv.estimate,
        "interval": {"low": iv.low, "high": iv.high, "confidence": 0.95, "t": iv.t, "sd_log": iv.sd_log},
        "rule": plan.rule(),
        "native": nm,
        "external": em,
        "unit": "steps/s (fastest)",
        "line": f"{word}: external/native fastest-step ratio {iv.estimate:.4f}, 95% interval [{iv.low:.4f}, "
        f"{iv.high:.4f}] {where} (6 pairs; medians native={nm:.2f} external={em:.2f} steps/s (fastest))",
        "pairs": [
            {"native": n, "external": e, "ratio": e / n, "first": "native" if i % 2 == 0 else "external"}
            for i, (n, e) in enumerate(zip(samples["native"], samples["external"], strict=True))
        ],
    }
    return Applied("gate_perf", params or {"pairs": 6, "warmup": 1, "min_ratio": 0.98}, PerfGated.from_dict(result))


PERF = perf_result(SAMPLES)
assert PERF.result.verdict == "PROMOTE"


@pytest.fixture(autouse=True)
def no_hf_cache(tmp_path, monkeypatch):
    """The Model screen scans the Hugging Face cache: make it the same everywhere."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))


@pytest.fixture(autouse=True)
def beside_the_work_folder(recorded, monkeypatch):
    """Free mode shows its work folder relative to the current folder: the same name everywhere."""
    monkeypatch.chdir(recorded[0].parent)


# session, not module: xdist's work stealing can bring a worker back to this module after another one,
# and a module fixture would run the tutorial's steps again (6 s each time)
@pytest.fixture(scope="session")
def recorded(tmp_path_factory) -> tuple[Path, list[tuple[str, dict, dict]]]:
    # the folder's name shows on screen: always snapshot-work0, whatever mktemp numbers its parent
    wd = tmp_path_factory.mktemp("snapshots") / "snapshot-work0"
    wd.mkdir()
    ctx = ActionContext(workdir=wd)
    steps = []
    for st in Session.load(find_tutorial("qwen-recipe")).steps:
        if st.action == "gate_perf":
            continue
        results, error = run_action(ctx, st.action, st.params)
        assert error is None, f"{st.action}: {error}"
        steps.append((st.action, st.params, results))
    stub = {
        "receipt": "qwen3-slot-ready.selection.json",
        "snapshot": "decode.graph.json",
        "output": "export_logits_copy.py",
    }
    results, error = run_action(ctx, "kernel_stub", stub)
    assert error is None, error
    steps.append(("kernel_stub", stub, results))
    return ctx.workdir, steps


async def settle(pilot, until: Callable[[], bool] | None = None, timeout: float = 60) -> None:
    """Wait for `until`, then for the screen to stop changing: `until` can read state that is already
    true while the work it stands for still redraws (after `loaded`'s refresh the screen changed
    later than the fixed 0.2 s pause in 25 of 106 calls here), and on a loaded machine the lag grows:
    the thirtieth session's GPU suite (16 workers) saw one snapshot differ that passed alone."""
    waited = 0.0
    while until is not None and not until() and waited < timeout:
        await pilot.pause(0.1)
        waited += 0.1
    await pilot.pause(0.2)
    shot = pilot.app.export_screenshot()
    for _ in range(100):  # 10 s at most; a screen still changing then is the snapshot's to show
        await pilot.pause(0.1)
        again = pilot.app.export_screenshot()
        if again == shot:
            return
        shot = again


def model_checked(app) -> bool:
    scr = app.get_screen("model")
    return bool(scr.family or scr.args_error)


def loaded(recorded, screen: str, extra: Callable | None = None):
    """run_before: load the recorded results, wait for the model check, go to `screen`."""
    _, steps = recorded

    async def run_before(pilot) -> None:
        app = pilot.app
        await settle(pilot, lambda: model_checked(app))
        for action, params, results in steps:
            app.apply_results(action, params, results)
        app.refresh_screen()  # the Model screen shows the captured build args and checks them again
        await settle(pilot, lambda: model_checked(app))
        if screen != "model":
            await pilot.press(KEYS[screen])
        await settle(pilot)
        if extra is not None:
            await extra(pilot)
        app.refresh_screen()
        await settle(pilot)
        app.clear_notifications()
        # the capture came about 1.0 s after the field took focus, on the edge of a cursor blink (0.5 s):
        # stopped, the cursor is hidden, as every recorded snapshot shows it, whatever the timing
        for field in app.screen.query(Input):
            field._pause_blink(visible=False)  # Textual's own "blur" step; cursor_blink=False would show it

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", SCREENS)
def test_screen(snap_compare, recorded, screen, size):
    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=size, run_before=loaded(recorded, screen))


def test_graph_follow_edge(snap_compare, recorded):
    """The node details after following a tensor edge into the zero-bias add."""

    async def go(pilot) -> None:
        graph = pilot.app.screen
        graph.goto("node:188")
        await pilot.press("e", "enter")

    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(120, 40), run_before=loaded(recorded, "graph", go))


def test_graph_search(snap_compare, recorded):
    """80x24: a words search; the results take the tree's width and show the recipe instance in full."""

    async def search(pilot) -> None:
        await pilot.press("slash", *"decode_attention", "enter")

    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(recorded, "graph", search))


def test_verify_verdict_with_plot(snap_compare, recorded):
    """Both gates passed (fixed numbers): the throughput plot and PROMOTE."""

    async def perf(pilot) -> None:
        st = pilot.app.state
        st.perf = PERF
        st.samples = {k: list(v) for k, v in SAMPLES.items()}

    for size in SIZES:
        app = WorkbenchApp(workdir=str(recorded[0]))
        assert snap_compare(app, terminal_size=size, run_before=loaded(recorded, "verify", perf))


def test_verify_reject(snap_compare, recorded):
    slow = {"native": SAMPLES["native"], "external": [v * 0.81 for v in SAMPLES["external"]]}

    async def perf(pilot) -> None:
        st = pilot.app.state
        st.perf = perf_result(slow)
        assert st.perf.result.verdict == "REJECT"
        st.samples = slow

    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(recorded, "verify", perf))


def test_verify_inconclusive(snap_compare, recorded):
    """The pairs spread across the threshold: INCONCLUSIVE, the interval drawn over it."""
    noisy = {
        "native": SAMPLES["native"],
        "external": [v * f for v, f in zip(SAMPLES["external"], (0.93, 1.04, 0.97, 1.02, 0.95, 1.0), strict=True)],
    }

    async def perf(pilot) -> None:
        st = pilot.app.state
        st.perf = perf_result(noisy)
        assert st.perf.result.verdict == "INCONCLUSIVE"
        st.samples = noisy

    for size in SIZES:
        app = WorkbenchApp(workdir=str(recorded[0]))
        assert snap_compare(app, terminal_size=size, run_before=loaded(recorded, "verify", perf))


def test_ansi_16_colours(snap_compare, recorded):
    """The ansi-dark theme: only the terminal's 16 colours."""
    app = WorkbenchApp(workdir=str(recorded[0]), ansi=True)
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(recorded, "region"))


def test_verify_embeddings_correctness(snap_compare, recorded, tmp_path):
    """An encoder's correctness view: the sorted per-element error under the max_abs line, the cosine gauge."""
    import json

    native = [((i * 37) % 101) / 50.0 - 1.0 for i in range(64)]
    external = [v + ((i * 13) % 7 - 3) * 0.002 for i, v in enumerate(native)]
    (tmp_path / "native.json").write_text(json.dumps({"embedding": native}))
    (tmp_path / "external.json").write_text(json.dumps({"embedding": external}))

    async def gate(pilot) -> None:
        st = pilot.app.state
        st.family_kind = "encoder"
        st.perf, st.samples = None, {"native": [], "external": []}
        params = {
            "native": str(tmp_path / "native.json"),
            "external": str(tmp_path / "external.json"),
            "max_abs": 0.02,
            "min_cosine": 0.999,
        }
        result = EmbeddingsGated(passed=True, values=64, max_abs=0.006, cosine=0.99998, line="PASS: numerical gate")
        st.correctness = Applied("gate_embeddings", params, result)

    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(recorded, "verify", gate))


def test_too_small(snap_compare, recorded):
    """Below 80x24: one notice instead of a broken layout."""
    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(60, 20), run_before=loaded(recorded, "graph"))


def test_trust_prompt(snap_compare, recorded):
    async def ask(pilot) -> None:
        pilot.app.push_screen(TrustModal("kernel.so", "kernel-bindings.json"))

    app = WorkbenchApp(workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(recorded, "verify", ask))


def test_tutorial_summary(snap_compare, recorded, monkeypatch):
    """The end of a tutorial: what was built, the verdicts with numbers, how to save and replay."""
    monkeypatch.chdir(recorded[0].parent)  # the work folder is shown relative to here

    async def finish(pilot) -> None:
        app = pilot.app
        app.state.perf = PERF
        app.guide.index = len(app.guide.session.steps)
        app.refresh_screen()
        app.action_summary()

    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(recorded[0]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(recorded, "verify", finish))


def test_help(snap_compare, recorded):
    app = WorkbenchApp(workdir=str(recorded[0]))
    # escape first: free mode starts in the model field, where ? is text
    assert snap_compare(
        app, terminal_size=(80, 24), press=["escape", "question_mark"], run_before=loaded(recorded, "model")
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tutorial_start(snap_compare, tmp_path, size):
    """Guided mode: the side panel explains step 1 of the shipped qwen-recipe tutorial."""

    async def ready(pilot) -> None:
        await settle(pilot, lambda: model_checked(pilot.app))
        pilot.app.clear_notifications()

    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path / "work"))
    assert snap_compare(app, terminal_size=size, run_before=ready)


def test_tutorial_after_first_step(snap_compare, tmp_path):
    """Guided mode after n: the real capture's results in the panel, the Graph screen shown."""

    async def step(pilot) -> None:
        app = pilot.app
        await settle(pilot, lambda: model_checked(app))
        await pilot.press("n")
        await settle(pilot, lambda: 0 in app.guide.outcomes and not app.busy, timeout=120)
        app.clear_notifications()

    app = WorkbenchApp(tutorial="qwen-recipe", workdir=str(tmp_path / "work"))
    assert snap_compare(app, terminal_size=(120, 40), run_before=step)


def test_replay_difference(snap_compare, tmp_path):
    """Replay mode after one step whose recorded fingerprint was altered: expected vs actual."""
    src = Session.load(find_tutorial("qwen-manual"))
    data = src.to_dict()
    data["header"]["title"] = "replay check"
    data["steps"] = data["steps"][:3]
    data["steps"][0]["results"]["fingerprint"] = "0" * 64
    path = tmp_path / "tampered.json"
    Session.from_dict(data, "tampered").save(path)

    async def step(pilot) -> None:
        app = pilot.app
        await settle(pilot, lambda: model_checked(app))
        await pilot.press("n")
        await settle(pilot, lambda: 0 in app.guide.outcomes and not app.busy, timeout=120)
        app.clear_notifications()

    app = WorkbenchApp(replay=str(path), workdir=str(tmp_path / "work"))
    assert snap_compare(app, terminal_size=(120, 40), run_before=step)
