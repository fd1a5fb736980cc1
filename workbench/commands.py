"""The command palette (ctrl+p): every screen and every key action, from the key bindings
themselves, so a new binding shows up here with no second list to keep in step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

from .keys import APP_BINDINGS
from .messages import PaletteCommand

if TYPE_CHECKING:
    from .screens.base import WorkbenchScreen

# app bindings that are plumbing, not commands
_HIDDEN_APP_ACTIONS = {"scroll_guide(-1)", "scroll_guide(1)"}


def _key(binding: Binding) -> str:
    return binding.key_display or binding.key.replace("question_mark", "?").replace("slash", "/")


def screen_classes() -> dict[str, type[WorkbenchScreen]]:
    from .screens.build import BuildScreen
    from .screens.graph import GraphScreen
    from .screens.kernel import KernelScreen
    from .screens.model import ModelScreen
    from .screens.profile import ProfileScreen
    from .screens.region import RegionScreen
    from .screens.verify import VerifyScreen

    return {
        "model": ModelScreen,
        "graph": GraphScreen,
        "region": RegionScreen,
        "kernel": KernelScreen,
        "build": BuildScreen,
        "verify": VerifyScreen,
        "profile": ProfileScreen,
    }


def palette_entries() -> list[tuple[str, str, str, str]]:
    """(label, help, screen or "", action): screens first, then app actions, then each screen's."""
    from .screens.base import SCREEN_ORDER, SCREEN_TITLES, SIDE_SCREENS, WorkbenchScreen

    out: list[tuple[str, str, str, str]] = []
    for i, name in enumerate(SCREEN_ORDER):
        out.append((f"Go to {SCREEN_TITLES[name]}", f"F{i + 1}", "", f"show('{name}')"))
    for name, key in SIDE_SCREENS.items():
        out.append((f"Go to {SCREEN_TITLES[name]}", key, "", f"show('{name}')"))
    shared = {b.action for b in WorkbenchScreen.BINDINGS}  # type: ignore[union-attr]
    for b in APP_BINDINGS:
        if isinstance(b, Binding) and not b.action.startswith("show(") and b.action not in _HIDDEN_APP_ACTIONS:
            if any(e[3] == b.action for e in out):
                continue
            out.append((b.description.capitalize() if b.description else b.action, _key(b), "", b.action))
    out.append(("Keys (help)", "?", "", "help"))
    for name, cls in screen_classes().items():
        for b in cls.BINDINGS:
            if isinstance(b, Binding) and b.action not in shared and b.description:
                out.append((f"{SCREEN_TITLES[name]}: {b.description}", _key(b), name, b.action))
    return out


class WorkbenchCommands(Provider):
    """Screens and actions, fuzzy-matched; running one switches to its screen first."""

    def _entries(self) -> Iterator[tuple[str, str, Callable[[], Any]]]:
        for label, key, screen, action in palette_entries():
            yield label, f"key {key}" if key else "", partial(self._run, screen, action)

    def _run(self, screen: str, action: str) -> None:
        """The app runs the entry (WorkbenchApp.on_palette_command): its screen first, then its action."""
        self.app.post_message(PaletteCommand(screen, action))

    async def discover(self) -> Hits:
        for label, help_text, run in self._entries():
            yield DiscoveryHit(label, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_text, run in self._entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), run, text=label, help=help_text)
