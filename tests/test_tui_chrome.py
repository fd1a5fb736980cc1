"""What the workbench says about itself (issue 30): `workbench --workdir DIR` and its --help, the work
folder shown in free mode, a finished tutorial that counts its skipped steps honestly (and says what
the skip mark means), and the shipped kernels and exporters listed by `mcore kernel list` and on the
Kernel screen."""

from __future__ import annotations

import pytest
from textual.widgets import OptionList

from mcore import kernel_catalog
from workbench.app import WorkbenchApp
from workbench.screens.dialogs import summary_text
from workbench.screens.guide import SKIP_GLYPH
from workbench.session import Session, find_tutorial

from .tui_helpers import no_hf_cache, text_of  # noqa: F401 (autouse fixture)


def test_plain_workbench_takes_workdir_and_its_help_says_so(tmp_path, workbench, monkeypatch):
    import workbench.app as app

    calls = []
    monkeypatch.setattr(app, "run_app", lambda **kw: calls.append(kw) or 0)
    assert workbench("--workdir", tmp_path / "w").code == 0
    assert workbench("--workdir", tmp_path / "t", "tutorial", "qwen-manual").code == 0
    assert calls == [
        {"workdir": str(tmp_path / "w")},
        {"tutorial": "qwen-manual", "workdir": str(tmp_path / "t")},
    ]
    r = workbench("--help")
    assert r.code == 0
    assert "workbench                 free exploration" in r.out and "workbench --workdir DIR" in r.out
    twice = workbench("--workdir", tmp_path / "a", "tutorial", "--workdir", tmp_path / "b")
    assert twice.code == 2 and "--workdir is given twice" in twice.err


def test_without_a_terminal_the_tui_says_so_and_writes_nothing(tmp_path):
    """Run from a script, a pipe or CI, the TUI wrote escape codes into the file and waited forever for
    keys: each way in refuses on one line instead, before any folder is made."""
    import subprocess
    import sys

    from .conftest import repo_env

    session = Session.new("t", guided=False).save(tmp_path / "s.json")
    for args, stdin in [
        (["--workdir", "w"], subprocess.DEVNULL),
        (["tutorial", "qwen-manual", "--workdir", "w"], subprocess.DEVNULL),
        (["replay", str(session), "--workdir", "w"], subprocess.DEVNULL),
        (["--workdir", "w"], None),  # stdin as pytest leaves it, stdout a pipe
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "workbench", *args],
            stdin=stdin,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=repo_env(),
            timeout=120,
        )
        assert r.returncode == 2 and r.stdout == "", (args, r)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("workbench: error: the workbench TUI needs a terminal, and ")
        assert "`workbench replay FILE --headless`" in lines[0]
        assert not (tmp_path / "w").exists()


@pytest.mark.asyncio
async def test_free_mode_shows_its_work_folder(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path / "mine"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert "free · mine" in text_of(app, "#navbar")
        assert f"work folder: {tmp_path / 'mine'}" in text_of(app, "#args-status")


@pytest.mark.asyncio
async def test_a_tutorial_with_skipped_steps_says_how_many_and_what_the_mark_means(tmp_path):
    """qwen-attention on a machine without CUDA: its 4 GPU steps are skipped, never counted as done."""
    app = WorkbenchApp(tutorial="qwen-attention", workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        g = app.guide
        steps = g.session.steps
        gpu = [i for i, s in enumerate(steps) if s.requires == "cuda"]
        assert len(gpu) == 4 and len(steps) == 10
        for i, s in enumerate(steps):  # as drive() in test_tui_pilot would leave it on a CPU machine
            if i in gpu:
                g.finish(i, None, "needs CUDA; skipped on this machine", "skipped")
            else:
                g.finish(i, s.results, None, "ok")
        app.refresh_screen()
        await pilot.pause(0.1)
        summary = summary_text(app).plain
        assert "6 of 10 steps done, 4 skipped" in summary and "all 10 steps done" not in summary
        assert f"{SKIP_GLYPH} needs CUDA, which this machine lacks" in summary
        assert "6 of 10 steps done, 4 skipped" in text_of(app, "#stepbar")
        await pilot.press("g")  # the guide panel explains the mark beside the last step
        await pilot.pause(0.1)
        assert f"{SKIP_GLYPH} skipped: needs CUDA" in text_of(app, "#guide-text")


@pytest.mark.asyncio
async def test_a_replay_never_counts_a_skipped_step_as_matched(tmp_path):
    path = tmp_path / "s.json"
    Session.load(find_tutorial("qwen-attention")).save(path)
    app = WorkbenchApp(replay=str(path), workdir=str(tmp_path / "wd"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        g = app.guide
        for i, s in enumerate(g.session.steps):
            g.finish(i, None, "needs CUDA; skipped on this machine", "skipped") if s.requires else g.finish(
                i, s.results, None, "ok"
            )
        app.refresh_screen()
        await pilot.pause(0.1)
        assert "6/10 steps matched the recording, 4 skipped" in summary_text(app).plain
        legend = text_of(app, "#guide-text")
        assert f"{SKIP_GLYPH} skipped (needs CUDA" in legend and "≠ differs" in legend


def test_mcore_kernel_list_names_the_shipped_exporter(mcore):
    r = mcore("kernel", "list")
    assert r.code == 0
    for name in ("identity-copy", "residual-add", "slow-copy", "cutedsl-decode-attention"):
        assert f"\n{name} " in "\n" + r.out, name
    assert "mcore kernel export cutedsl-decode-attention --selection RECEIPT -o KERNEL.so" in r.out


@pytest.mark.asyncio
async def test_the_kernel_screen_lists_every_shipped_kernel_and_exporter(tmp_path):
    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("f4")
        await pilot.pause(0.1)
        ol = app.screen.query_one("#kernel-list", OptionList)
        ids = [ol.get_option_at_index(i).id for i in range(ol.option_count)]
        assert ids == [f"{k.kind}:{k.name}" for k in kernel_catalog()]
        assert "export:cutedsl-decode-attention" in ids
        ol.focus()
        ol.highlighted = ids.index("export:cutedsl-decode-attention")
        await pilot.press("enter")  # the exporter compiles for a receipt: it asks for one first
        await pilot.pause(0.1)
        assert "no receipt yet" in text_of(app, "#error")
