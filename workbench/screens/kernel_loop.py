"""The Kernel screen's edit-export-verify loop: `o` opens the exporter in $EDITOR (the TUI suspends
and resumes), `v` watches it with mcore's loop (mcore.watch_kernel, the one `mcore kernel watch`
runs): every save re-exports the kernel into a new DSO, binds it to a NEW pipeline and runs the
correctness gate in lockstep and the perf gate; each round's row (round, time, max_abs, ratio,
verdict) joins the history shown under the stub. `x` stops the watch at any point."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import DataTable

from mcore import UserError, WatchConfig, WatchRound

from ..outputs import fresh_name

if TYPE_CHECKING:
    from ..app import WorkbenchApp
    from ..state import WorkbenchState

VERDICT_STYLES = {"PROMOTE": "bold green", "PASS": "green", "REJECT": "bold red", "ERROR": "red", "EXPORTED": "yellow"}
WATCH_PROMPT = "Explain grouped-query attention in one sentence."
ENCODER_PROMPT = "The quick brown fox jumps over the lazy dog."


def editor_command(path: Path) -> list[str]:
    """$VISUAL, else $EDITOR (which may carry its own flags), with the file to edit."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
    if not editor or not editor.strip():
        raise UserError("set $EDITOR (or $VISUAL) to your editor, e.g. `EDITOR=vim workbench`, then press o again")
    try:
        return shlex.split(editor) + [str(path)]
    except ValueError as e:
        raise UserError(f"$EDITOR {editor!r} does not parse as a command ({e})") from None


def open_in_editor(app: WorkbenchApp, path: Path) -> int:
    """Run the editor on `path` with the terminal handed over (App.suspend), then take it back.
    Where the app cannot suspend (a test's headless driver) the editor runs without a terminal."""
    from textual.app import SuspendNotSupported

    cmd = editor_command(path)
    try:
        with app.suspend():
            return subprocess.call(cmd)
    except SuspendNotSupported:
        return subprocess.call(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as e:
        raise UserError(f"could not start the editor {cmd[0]!r}: {e.strerror or e}; check $EDITOR") from None


def watch_config(state: WorkbenchState) -> WatchConfig:
    """The watch of the current stub, receipt and bundles; a one-line error naming what is missing."""
    missing = []
    if state.stub_path is None:
        missing.append("an exporter (s generates the stub)")
    if state.receipt_path is None:
        missing.append("a receipt (F3)")
    for arm, how in (("native", "F5, b"), ("slot", "F5, s")):
        if arm not in state.bundles:
            missing.append(f"the {arm} bundle ({how})")
    if missing:
        raise UserError("the watch needs " + ", ".join(missing))
    assert state.stub_path is not None and state.receipt_path is not None
    last = state.last_prompt.prompt if state.last_prompt else None
    prompt = last or (WATCH_PROMPT if state.is_decoder else ENCODER_PROMPT)
    settings = dict(state.watch_settings)
    return WatchConfig(
        exporter=str(state.path(state.stub_path)),
        selection=state.path(state.receipt_path),
        native_bundle=state.path(state.bundles["native"].result.bundle),
        slot_bundle=state.path(state.bundles["slot"].result.bundle),
        out_dir=state.path(fresh_name(state, "watch")),
        prompt=str(prompt),
        snapshot=state.path(state.snapshot_path) if state.snapshot_path else None,
        device=state.device,
        **settings,
    )


def fill_history(table: DataTable, rounds: list[WatchRound]) -> None:
    """The rounds so far, the newest last (and in view)."""
    if not table.columns:
        for label, key in (("#", "round"), ("time", "time"), ("max_abs", "max_abs"), ("ratio", "ratio")):
            table.add_column(label, key=key)
        table.add_column("verdict", key="verdict")
        table.add_column("note", key="note")
    table.clear()
    for r in rounds:
        num = "-" if r.max_abs is None else f"{r.max_abs:.3g}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.4f}"
        verdict = Text(r.verdict, style=VERDICT_STYLES.get(r.verdict, "yellow"))
        table.add_row(str(r.index), r.clock, num, ratio, verdict, _note(r), key=str(r.index))
    if rounds:
        table.move_cursor(row=len(rounds) - 1)


def _note(r: WatchRound) -> str:
    note = r.note
    for prefix in ("PASS: ", "FAIL: ", "INCONCLUSIVE: "):
        note = note.removeprefix(prefix)
    return note
