"""The app-wide key bindings: WorkbenchApp binds them and the command palette (workbench.commands)
lists them, so neither imports the other for them."""

from __future__ import annotations

from textual.binding import Binding, BindingType

APP_BINDINGS: list[BindingType] = [
    Binding("f1", "show('model')", "Model", show=False),
    Binding("f2", "show('graph')", "Graph", show=False),
    Binding("f3", "show('region')", "Region", show=False),
    Binding("f4", "show('kernel')", "Kernel", show=False),
    Binding("f5", "show('build')", "Build", show=False),
    Binding("f6", "show('verify')", "Verify", show=False),
    Binding("n", "guide_next", "next step"),
    Binding("n", "summary", "summary"),  # once every step is done, n shows what was built
    Binding("x", "cancel", "cancel"),
    Binding("slash", "search", "search graph", show=False),
    Binding("g", "toggle_guide", "guide", show=False),
    Binding("left_square_bracket", "scroll_guide(-1)", "guide up", show=False),
    Binding("right_square_bracket", "scroll_guide(1)", "guide down", show=False),
    Binding("ctrl+s", "save_session", "save", show=False),
    Binding("ctrl+o", "open_session", "open", show=False),
    Binding("q", "request_quit", "quit", show=False),
    Binding("ctrl+q", "request_quit", "quit", show=False, priority=True),
    # Esc never switches screens (the next letter would act on another one): going back has its own key
    Binding("alt+left", "go_back", "back to the previous screen", show=False),
]
