"""The frame every workbench screen shares: a screen bar (F1..F6), the body beside the guide
panel, an error panel, a status line with the running step's progress, and the footer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

if TYPE_CHECKING:  # pragma: no cover
    from ..app import WorkbenchApp, WorkbenchState

SCREEN_ORDER = ("model", "graph", "region", "kernel", "build", "verify")
SCREEN_TITLES = {"model": "Model", "graph": "Graph", "region": "Region", "kernel": "Kernel", "build": "Build",
                 "verify": "Verify"}


def bar_text(fraction: Optional[float], width: int) -> str:
    if fraction is None:
        return ""
    width = max(4, width)
    filled = int(round(fraction * width))
    return "█" * filled + "░" * (width - filled)


class NavBar(Static):
    """One row: the screens and their keys, the current one highlighted, and the mode."""

    def __init__(self, current: str):
        super().__init__("", id="navbar")
        self.current = current

    def render_bar(self, mode: str = "") -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, name in enumerate(SCREEN_ORDER):
            label = f" F{i + 1} {SCREEN_TITLES[name]} "
            if name == self.current:
                t.append(label, style="reverse bold")
            else:
                t.append(label)
        if mode:
            t.append("  " + mode, style="bold")
        self.update(t)


class StatusLine(Static):
    """The running step (label, step, bar, percent) or what is ready; one row."""

    def show(self, app: "WorkbenchApp") -> None:
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
            t.append("ready", style="green")
            if app.progress_step:
                t.append(f" · last: {app.progress_step}")
            t.append(f" · session: {steps} step{'s' if steps != 1 else ''}", style="dim")
        self.update(t)


class ErrorPanel(Static):
    """The last error with what to do; hidden until there is one (esc dismisses)."""

    def show_error(self, text: Optional[str], expected: bool = False) -> None:
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


class WorkbenchScreen(Screen):
    """Base class: subclasses give SCREEN_NAME, compose_body() and refresh_view()."""

    SCREEN_NAME = "model"
    # nothing grabs focus on its own: an Input focused by default would swallow n (next step)
    AUTO_FOCUS = ""
    BINDINGS = [Binding("escape", "dismiss_error", "dismiss", show=False)]

    @property
    def wb(self) -> "WorkbenchApp":
        return self.app  # type: ignore[return-value]

    @property
    def state(self) -> "WorkbenchState":
        return self.wb.state

    def compose(self) -> ComposeResult:
        from .guide import GuidePanel

        yield NavBar(self.SCREEN_NAME)
        with Horizontal(id="main"):
            with Vertical(id="body", classes=f"body body-{self.SCREEN_NAME}"):
                yield from self.compose_body()
            yield GuidePanel(id="guide")
        yield ErrorPanel(id="error")
        yield StatusLine(id="status")
        yield Footer()

    def compose_body(self) -> Iterable[Widget]:
        return []

    def on_mount(self) -> None:
        self.refresh_chrome()

    def on_screen_resume(self) -> None:
        self.refresh_chrome()
        self.refresh_view()
        self.focus_default()

    def focus_default(self) -> None:
        pass

    # -------------------------------------------------------------- hooks
    def refresh_view(self) -> None:
        """Re-read app.state into the widgets (called on resume and after every action)."""
        self.refresh_chrome()

    def on_action_started(self, action: str) -> None:
        """An action began (on this screen's watch)."""

    def on_action_progress(self, action: str, step: str, fraction: float) -> None:
        """Per-screen progress (the Build screen's bars)."""

    def on_action_sample(self, arm: str, index: int, value: float) -> None:
        """A perf-gate measurement arrived (already stored in state.samples)."""

    def on_action_log(self, line: str) -> None:
        """A log line from the running action."""

    def on_action_done(self, outcome) -> None:
        """The action finished (ok, failed or cancelled); the view was already refreshed."""

    # -------------------------------------------------------------- chrome
    def refresh_chrome(self) -> None:
        if not self.is_mounted:
            return
        g = self.wb.guide
        mode = ""
        if g is not None:
            mode = f"{g.mode} {min(g.index + 1, len(g.session.steps))}/{len(g.session.steps)}"
        self.query_one(NavBar).render_bar(mode)
        self.refresh_status()
        from .guide import GuidePanel

        self.query_one(GuidePanel).show_guide(g)
        self.query_one(ErrorPanel).show_error(self.wb.last_error, self.wb.last_error_expected)

    def refresh_status(self) -> None:
        if self.is_mounted:
            self.query_one(StatusLine).show(self.wb)

    def show_error(self, text: Optional[str], expected: bool = False) -> None:
        if self.is_mounted:
            self.query_one(ErrorPanel).show_error(text, expected)

    def action_dismiss_error(self) -> None:
        self.wb.last_error = None
        self.show_error(None)
