"""Textual messages between the app and its screens: requests that screens, dialogs and the command
palette post to the app (handled in the app's `on_...`), so they ask for app work without importing
it; and what the app tells the current screen about the action it runs (handled in the screen's
`on_action_...`), so the app calls no screen hook by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:  # pragma: no cover
    from .state import ActionOutcome


class SaveSession(Message):
    """Save the session (as ctrl+s does): the summary dialog's save key."""


class PaletteCommand(Message):
    """Run a command palette entry: switch to `screen` (when given), then run `action` there."""

    def __init__(self, screen: str, action: str) -> None:
        super().__init__()
        self.screen = screen
        self.action = action


# ---------------------------------------------------------------------------- a running action
# The app posts these to the current screen; a screen that cares handles them (`on_action_done`,
# ...), the rest let them bubble up to the app, which ignores them.


class ActionMessage(Message, bubble=False):
    """About the running action, for the current screen only (WorkbenchScreen shows a handler's
    failure in the UI, never a traceback screen)."""


class ActionStarted(ActionMessage):
    """An action began running in its worker, with these params."""

    def __init__(self, action: str, params: dict[str, Any]) -> None:
        super().__init__()
        self.action = action
        self.params = params


class ActionProgress(ActionMessage):
    """The running action reported a step and how far along it is (0..1)."""

    def __init__(self, action: str, step: str, fraction: float) -> None:
        super().__init__()
        self.action = action
        self.step = step
        self.fraction = fraction


class ActionSample(ActionMessage):
    """A perf-gate measurement arrived (already stored in state.samples)."""

    def __init__(self, arm: str, index: int, value: float) -> None:
        super().__init__()
        self.arm = arm
        self.index = index
        self.value = value


class ActionLog(ActionMessage):
    """A log line from the running action (already kept in state.log)."""

    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


class ActionDone(ActionMessage):
    """The action finished (ok, failed or cancelled); its result is in the state and the view was
    refreshed. `outcome.result` is the typed result (workbench/results.py) when it succeeded."""

    def __init__(self, outcome: ActionOutcome) -> None:
        super().__init__()
        self.outcome = outcome
