"""Modal dialogs: the native-code trust warning, a path prompt (save/open session), the key help."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class TrustModal(ModalScreen[bool]):
    """Loading a DSO runs native code: say so and ask, once per library."""

    BINDINGS = [
        Binding("y", "answer(True)", "load it"),
        Binding("n", "answer(False)", "do not load"),
        Binding("escape", "answer(False)", "cancel"),
    ]

    def __init__(self, library: str, manifest: str):
        super().__init__()
        self.library = library
        self.manifest = manifest

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("Trusted native code only\n\n", style="bold yellow")
        t.append("This step loads a kernel library into this process. Loading a DSO runs its native code "
                 "with your permissions; the workbench cannot check what it does.\n\n")
        t.append("library:  ", style="dim")
        t.append(f"{self.library}\n")
        t.append("manifest: ", style="dim")
        t.append(f"{self.manifest}\n\n")
        t.append("Load it only if you built it or trust its source.\n\n")
        t.append(" y ", style="bold reverse")
        t.append(" load it    ")
        t.append(" n ", style="bold reverse")
        t.append(" / ")
        t.append(" esc ", style="bold reverse")
        t.append(" do not load")
        with Vertical(id="trust-box", classes="modal-box"):
            yield Static(t, id="trust-text")

    def action_answer(self, ok: bool) -> None:
        self.dismiss(ok)


class PathPrompt(ModalScreen[Optional[str]]):
    """Ask for a path; Enter accepts, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, question: str, default: str = "", hint: str = ""):
        super().__init__()
        self.question = question
        self.default = default
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box", classes="modal-box"):
            yield Static(self.question, id="prompt-question")
            yield Input(self.default, id="prompt-input", compact=True)
            yield Static(Text(f"{self.hint}  ·  enter accepts, esc cancels", style="dim"), id="prompt-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = [
    ("Everywhere", [
        ("F1..F6", "Model, Graph, Region, Kernel, Build, Verify"),
        ("tab / shift+tab", "move between fields and tables"),
        ("n", "guided/replay: perform the current step"),
        ("g", "guided/replay: show or hide the guide panel"),
        ("[ / ]", "guided/replay: scroll the guide panel"),
        ("x", "cancel the running step"),
        ("ctrl+s / ctrl+o", "save the session / open a session to replay"),
        ("esc", "dismiss the error panel"),
        ("WORKBENCH_ANSI=1", "(environment) the 16-colour ANSI theme"),
        ("?", "this help"),
        ("ctrl+q", "quit"),
    ]),
    ("Model", [("c", "capture the graph with these build args"), ("r", "rescan the Hugging Face cache")]),
    ("Graph", [("/", "filter (--match glob)"), ("enter", "follow the highlighted tensor edge"),
               ("backspace", "back along the followed edges"), ("space", "mark/unmark the node for a region"),
               ("t", "tree / table focus")]),
    ("Region", [("enter", "pick the highlighted recipe instance"), ("space", "unmark a node"),
                ("s", "save the receipt"), ("m", "manual selection from marked nodes")]),
    ("Kernel", [("i / a", "build the identity-copy / residual-add kernel"), ("l", "use the DSO path typed"),
                ("s", "generate the CuTe DSL exporter stub"), ("e", "run the exporter"),
                ("w", "write the bindings manifest")]),
    ("Build", [("b", "build the native bundle"), ("s", "build the slot-ready bundle"), ("x", "cancel")]),
    ("Verify", [("c", "correctness gate"), ("p", "performance gate"), ("v", "both, then the verdict")]),
]


class HelpModal(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def compose(self) -> ComposeResult:
        t = Text()
        for section, rows in HELP:
            t.append(f"{section}\n", style="bold")
            for key, what in rows:
                t.append(f"  {key:<16}", style="bold cyan")
                t.append(f"{what}\n")
        t.append("\nesc closes", style="dim")
        with VerticalScroll(id="help-box", classes="modal-box"):
            yield Static(t)

    def action_close(self) -> None:
        self.dismiss(None)
