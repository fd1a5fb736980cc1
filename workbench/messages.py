"""Requests that screens, dialogs and the command palette post to the app (Textual messages the
app handles in `on_...`), so they ask for app work without importing the app."""

from __future__ import annotations

from textual.message import Message


class SaveSession(Message):
    """Save the session (as ctrl+s does): the summary dialog's save key."""


class PaletteCommand(Message):
    """Run a command palette entry: switch to `screen` (when given), then run `action` there."""

    def __init__(self, screen: str, action: str) -> None:
        super().__init__()
        self.screen = screen
        self.action = action
