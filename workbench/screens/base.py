"""The frame every workbench screen shares: a screen bar (F1..F6, clickable), the body beside
the guide panel (or, on narrow terminals, a one-line step bar), an error panel, a status line
with the running step's progress or the last notice, and the footer.

Key conventions live here once: `?` first in the footer; Esc leaves a field, then dismisses
the error, then ends a screen's own mode (a search), and never switches screens (the next
letter would then act on a screen the user did not choose; alt+left goes back); a printable
key typed after tab left a text field is text the user meant for the field, never a command
(`on_key`), until Esc, Enter, another key or a click.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Static, TextArea

from mcore import UserError

from ..messages import ActionMessage

M = TypeVar("M", bound=ActionMessage)
S = TypeVar("S", bound="WorkbenchScreen")


def on_action(handler: Callable[[S, M], None]) -> Callable[[S, M], None]:
    """A screen's handler of the app's messages about the running action (workbench/messages.py):
    a failure in it is shown in the UI, never a traceback screen."""

    @functools.wraps(handler)
    def guarded(self: S, message: M) -> None:
        try:
            handler(self, message)
        except NoMatches:
            pass  # the screen is still being composed; it refreshes itself on resume
        except Exception as e:  # noqa: BLE001
            self.wb.report_error(f"could not update the {self.SCREEN_NAME} screen: {type(e).__name__}: {e}")

    return guarded


if TYPE_CHECKING:  # pragma: no cover
    from mcore import Snapshot

    from ..app import WorkbenchApp
    from ..state import WorkbenchState

SCREEN_ORDER = ("model", "graph", "region", "kernel", "build", "verify")
SCREEN_TITLES = {
    "model": "Model",
    "graph": "Graph",
    "region": "Region",
    "kernel": "Kernel",
    "build": "Build",
    "verify": "Verify",
    "profile": "Profile",
}
# Screens off the F-key path, reached by a key on another screen (and the palette): name -> that key
SIDE_SCREENS = {"profile": "p on Graph"}
MIN_SIZE = (80, 24)  # below this the screens cannot show their content; say so instead
# from this width the guide panel (30% of it, at most 48 columns) sits beside the body; below, a
# one-line step bar (g shows the panel)
ROOMY_WIDTH = 120


def bar_text(fraction: float | None, width: int) -> str:
    if fraction is None:
        return ""
    width = max(4, width)
    filled = int(round(fraction * width))
    return "█" * filled + "░" * (width - filled)


def nav_labels() -> list[tuple[str, str]]:
    """(screen, label) of the screen bar, left to right (one source for drawing and clicks)."""
    return [(name, f" F{i + 1} {SCREEN_TITLES[name]} ") for i, name in enumerate(SCREEN_ORDER)]


class NavBar(Static):
    """One row: the screens and their keys, the current one highlighted, and the mode. Clickable."""

    def __init__(self, current: str):
        super().__init__("", id="navbar")
        self.current = current

    def render_bar(self, mode: str = "", device: str = "") -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        for name, label in nav_labels():
            t.append(label, style="reverse bold" if name == self.current else "")
        if mode:
            t.append("  " + mode, style="bold")
        if device:
            t.append("  " + device, style="dim")
        self.update(t)

    async def on_click(self, event: events.Click) -> None:
        x = 0
        for name, label in nav_labels():
            if x <= event.x < x + len(label):
                await self.app.run_action(f"show('{name}')")
                return
            x += len(label)


class StatusLine(Static):
    """The running step (label, step, bar, percent), else the last notice; one row."""

    def show(self, app: WorkbenchApp) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        if app.busy:
            frac = app.progress_fraction
            t.append("● ", style="yellow")
            t.append(app.busy_label, style="bold")
            pct = f" {int(round((frac or 0) * 100)):3d}% " if frac is not None else " "
            t.append(pct)
            t.append(bar_text(frac, 12), style="cyan")
            t.append(f" {app.progress_step}")
            t.append("  x cancel", style="dim")
        else:
            steps = len(app.session) if app.session is not None else 0
            unsaved = app.unsaved_steps
            text, style = app.message
            if text:
                t.append(text, style=style)
            else:
                t.append("ready", style="green")
            t.append(f" · session: {steps} step{'s' if steps != 1 else ''}", style="dim")
            if unsaved:
                t.append(f" ({unsaved} unsaved, ctrl+s)", style="dim")
        self.update(t)


class StepBar(Static):
    """The guided step in one row (narrow terminals): where you are, what n does, g for details."""

    def show_step(self, g) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        if g is None:
            return
        t.append(" TUTORIAL " if g.mode == "tutorial" else " REPLAY ", style="bold reverse")
        step = g.current_step
        total = len(g.session.steps)
        last = g.outcomes.get(g.index - 1) if g.index else None
        if last is not None:
            from .guide import SKIP_GLYPH

            ok = last.kind == "ok" and not last.diffs
            if last.kind == "skipped":
                t.append(f" {SKIP_GLYPH} skipped", style="yellow")
            else:
                t.append(" ✓" if ok else " ≠", style="green" if ok else "red")
        if step is None:
            t.append(f" {g.finished_text()} · ", style="bold")
            t.append("n", style="bold reverse")
            t.append(" summary ", style="dim")
            t.append("ctrl+s", style="bold reverse")
            t.append(" save", style="dim")
        else:
            t.append(f" {g.index + 1}/{total} ", style="bold")
            t.append(step.title)
            t.append("  n", style="bold reverse")
            t.append(" run it", style="dim")
        t.append("  g", style="bold reverse")
        t.append(" details", style="dim")
        self.update(t)


class ErrorPanel(Static):
    """The last error with what to do; hidden until there is one (esc dismisses)."""

    def show_error(self, text: str | None, expected: bool = False) -> None:
        if not text:
            self.update("")
            self.remove_class("shown")
            return
        t = Text()
        if expected:
            t.append("✓ refused, as the session recorded: ", style="bold green")
        else:
            t.append("✗ ", style="bold red")
        t.append(text)
        t.append("  (esc dismisses)", style="dim")
        self.update(t)
        self.add_class("shown")


class KeyButtons(Horizontal):
    """A row of compact buttons, each running one of the screen's key actions (for the mouse)."""

    def __init__(self, buttons: list[tuple[str, str, str]], **kw):
        """buttons: (key, label, action) in the screen's namespace."""
        super().__init__(classes="key-buttons", **kw)
        self.buttons = buttons

    def compose(self) -> ComposeResult:
        for key, label, action in self.buttons:
            yield Button(f"{key} {label}", name=action, compact=True, classes="key-button")


class WorkbenchScreen(Screen):
    """Base class: subclasses give SCREEN_NAME, compose_body() and refresh_view()."""

    SCREEN_NAME = "model"
    # nothing grabs focus on its own: an Input focused by default would swallow n (next step)
    AUTO_FOCUS = ""
    # `?` first: the footer is cut from the right on narrow terminals
    BINDINGS = [Binding("question_mark", "app.help", "keys"), Binding("escape", "escape", "close", show=False)]

    @property
    def wb(self) -> WorkbenchApp:
        return self.app  # type: ignore[return-value]

    @property
    def state(self) -> WorkbenchState:
        return self.wb.state

    @property
    def snap(self) -> Snapshot:
        """The captured graph, for code that runs only once there is one."""
        s = self.state.snapshot
        if s is None:
            raise UserError("no graph captured yet: capture one on the Model screen (F1, then c)")
        return s

    def compose(self) -> ComposeResult:
        from .guide import GuidePanel

        yield NavBar(self.SCREEN_NAME)
        with Horizontal(id="main"):
            with Vertical(id="body", classes=f"body body-{self.SCREEN_NAME}"):
                yield from self.compose_body()
            yield GuidePanel(id="guide")
        yield Static(
            Text(
                f"terminal too small: the workbench needs {MIN_SIZE[0]}x{MIN_SIZE[1]}; enlarge the window (q quits, x cancels what runs)",
                style="bold yellow",
            ),
            id="too-small",
        )
        yield ErrorPanel(id="error")
        yield StepBar(id="stepbar")
        yield StatusLine(id="status")
        yield Footer(compact=True)

    def compose_body(self) -> Iterable[Widget]:
        return []

    def on_mount(self) -> None:
        self.refresh_chrome()

    def on_screen_resume(self) -> None:
        self.refresh_chrome()
        self.refresh_view()
        if isinstance(self.focused, (Input, TextArea)):
            self.set_focus(None)  # coming back, letters are keys again, not text in a field
        self.focus_default()

    def on_resize(self, event: events.Resize) -> None:
        self.refresh_chrome()

    def focus_default(self) -> None:
        pass

    # -------------------------------------------------------------- hooks
    def refresh_view(self) -> None:
        """Re-read app.state into the widgets (called on resume and after every action)."""
        self.refresh_chrome()

    def escape_mode(self) -> bool:
        """End a screen's own mode on Esc (e.g. a search); True when something was ended."""
        return False

    # -------------------------------------------------------------- chrome
    def guide_beside(self) -> bool:
        """Whether the guide panel sits beside the body (else the one-line step bar)."""
        g = self.wb.guide
        if g is None:
            return False
        if self.wb.guide_expanded is not None:
            return self.wb.guide_expanded
        return self.app.size.width >= ROOMY_WIDTH

    def refresh_chrome(self) -> None:
        if not self.is_mounted:
            return
        w, h = self.app.size
        small = w < MIN_SIZE[0] or h < MIN_SIZE[1]
        self.set_class(small, "too-small")
        g = self.wb.guide
        if g is not None:
            mode = f"{g.mode} {min(g.index + 1, len(g.session.steps))}/{len(g.session.steps)}"
        else:
            mode = f"free · {self.state.workdir.name}"  # where free exploration writes (in full: F1)
        self.query_one(NavBar).render_bar(mode, self.wb.device_line)
        self.refresh_status()
        from .guide import GuidePanel

        beside = self.guide_beside()
        self.query_one(GuidePanel).show_guide(g if beside else None)
        bar = self.query_one(StepBar)
        bar.display = g is not None and not beside and not small
        if bar.display:
            bar.show_step(g)
        self.query_one(ErrorPanel).show_error(self.wb.last_error, self.wb.last_error_expected)

    def refresh_status(self) -> None:
        if self.is_mounted:
            self.query_one(StatusLine).show(self.wb)

    def show_error(self, text: str | None, expected: bool = False) -> None:
        if self.is_mounted:
            self.query_one(ErrorPanel).show_error(text, expected)

    def action_escape(self) -> None:
        """Esc: leave the field, else dismiss the error, else end the screen's mode; never another screen."""
        if isinstance(self.focused, (Input, TextArea)):
            self.set_focus(None)
            self.focus_default()
            return
        if self.wb.last_error:
            self.wb.last_error = None
            self.show_error(None)
            return
        if self.escape_mode():
            return
        self.wb.say("esc: nothing to close here · F1–F6 switch screens, alt+left goes back", "dim")

    def on_key(self, event: events.Key) -> None:
        """A printable key that reaches the screen while the user is still typing (they left the
        text field with tab, and its letters would now be commands): show it, never run it."""
        field = self.wb.typing_in
        if not event.is_printable or field is None or not field.is_attached or field.screen is not self:
            return
        if isinstance(self.focused, (Input, TextArea)):
            return  # a field takes it
        event.stop()
        event.prevent_default()
        name = field.id or "text"
        self.wb.say(
            f"{event.character!r} was not run as a key: tab left the {name} field while you were typing; "
            "shift+tab goes back to it, esc or enter ends typing (then letters are keys)",
            "yellow",
        )

    @on(Button.Pressed, ".key-button")
    async def key_button(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.name:
            await self.wb.run_action(event.button.name, self)
