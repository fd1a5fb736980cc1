"""Modal dialogs: the native-code trust warning, a path prompt (save/open session), the key help."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from ..messages import SaveSession


class TrustModal(ModalScreen[bool]):
    """Loading a DSO runs native code: say so and ask, once per library.

    y loads; esc (or d) declines. `n` is no answer here: the guide teaches n = next step, so a
    user pressing it on this prompt must not silently decline the step they asked for.
    """

    BINDINGS = [
        Binding("y", "answer(True)", "load it"),
        Binding("escape,d", "answer(False)", "do not load"),
        Binding("n", "hint", "", show=False),
    ]

    def __init__(self, library: str, manifest: str):
        super().__init__()
        self.library = library
        self.manifest = manifest

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("Trusted native code only\n\n", style="bold yellow")
        if self.library == self.manifest:  # a script (an exporter), not a bindings manifest
            t.append(
                "This step runs a Python script (a kernel exporter) with your permissions; the workbench "
                "cannot check what it does.\n\n"
            )
            t.append("script:   ", style="dim")
            t.append(f"{self.library}\n\n")
            t.append("Run it only if you wrote or generated it or trust its source.")
        else:
            t.append(
                "This step loads a kernel library into this process. Loading a DSO runs its native code "
                "with your permissions; the workbench cannot check what it does.\n\n"
            )
            t.append("library:  ", style="dim")
            t.append(f"{self.library}\n")
            t.append("manifest: ", style="dim")
            t.append(f"{self.manifest}\n\n")
            t.append("Load it only if you built it or trust its source.")
        with Vertical(id="trust-box", classes="modal-box"):
            yield Static(t, id="trust-text")
            yield Static("", id="trust-hint")
            with Horizontal(classes="key-buttons"):
                yield Button("y load it", id="trust-yes", compact=True, variant="warning")
                yield Button("esc do not load", id="trust-no", compact=True)

    def action_answer(self, ok: bool) -> None:
        self.dismiss(ok)

    def action_hint(self) -> None:
        self.query_one("#trust-hint", Static).update(
            Text("n does nothing here: press y to load the kernel and run the step, esc not to", style="bold")
        )

    @on(Button.Pressed, "#trust-yes, #trust-no")
    def pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "trust-yes")


class ConfirmQuit(ModalScreen[str | None]):
    """Quit with unsaved steps: save first, quit anyway, or stay. Answers "save", "quit" or None."""

    QUESTION = "Quit the workbench?"
    GO_LABEL = "q quit anyway"
    BINDINGS = [
        Binding("s", "answer('save')", "save first"),
        Binding("q", "answer('quit')", "quit without saving"),  # ctrl+q again: the app quits
        Binding("escape", "answer(None)", "stay"),
    ]

    def __init__(self, unsaved: int):
        super().__init__()
        self.unsaved = unsaved

    def compose(self) -> ComposeResult:
        t = Text()
        t.append(f"{self.QUESTION}\n\n", style="bold")
        t.append(
            f"{self.unsaved} step(s) of this session are not saved; a saved session replays with "
            "`workbench replay FILE`."
        )
        with Vertical(id="quit-box", classes="modal-box"):
            yield Static(t)
            with Horizontal(classes="key-buttons"):
                yield Button("s save first", id="quit-save", compact=True, variant="primary")
                yield Button(self.GO_LABEL, id="quit-quit", compact=True, variant="error")
                yield Button("esc stay", id="quit-stay", compact=True)

    def action_answer(self, choice: str | None) -> None:
        self.dismiss(choice)

    @on(Button.Pressed, "#quit-save, #quit-quit, #quit-stay")
    def pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss({"quit-save": "save", "quit-quit": "quit"}.get(event.button.id or ""))


class ConfirmReplaceSession(ConfirmQuit):
    """Ctrl+o with unsaved steps: opening another session replaces this one. Answers "save", "quit"
    (open it anyway) or None (stay)."""

    QUESTION = "Open another session? It replaces this one."
    GO_LABEL = "o open anyway"
    BINDINGS = [
        Binding("s", "answer('save')", "save first"),
        Binding("o", "answer('quit')", "open without saving"),
        Binding("escape", "answer(None)", "stay"),
    ]


class ConfirmOverwrite(ModalScreen[bool]):
    """An output would replace an existing file: y replaces it, esc (or n, d) keeps it and the step
    does not run. Never shown for a link, device or folder (those are refused outright)."""

    BINDINGS = [
        Binding("y", "answer(True)", "replace"),
        Binding("escape,n,d", "answer(False)", "keep it"),
    ]

    def __init__(self, paths: list[str], what: str):
        super().__init__()
        self.paths = paths
        self.what = what

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("Replace an existing file?\n\n", style="bold yellow")
        t.append(f"{self.what} writes over:\n")
        for p in self.paths:
            t.append(f"  {p}\n", style="bold")
        t.append("\nIts content is lost. Keep it and the step does not run (choose another name to keep both).")
        with Vertical(id="overwrite-box", classes="modal-box"):
            yield Static(t, id="overwrite-text")
            with Horizontal(classes="key-buttons"):
                yield Button("y replace", id="overwrite-yes", compact=True, variant="warning")
                yield Button("esc keep it", id="overwrite-no", compact=True)

    def action_answer(self, ok: bool) -> None:
        self.dismiss(ok)

    @on(Button.Pressed, "#overwrite-yes, #overwrite-no")
    def pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "overwrite-yes")


class PathPrompt(ModalScreen[str | None]):
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
    (
        "Everywhere",
        [
            ("F1..F6", "Model, Graph, Region, Kernel, Build, Verify (or click the tab)"),
            ("ctrl+p", "command palette: every screen and action"),
            ("tab / shift+tab", "move between fields, tables and buttons"),
            ("esc", "leave a field; dismiss the error; end a search (never another screen)"),
            ("alt+left", "back to the previous screen"),
            ("letters", "keys only outside text fields; after tab leaves a field they stay text until esc/enter"),
            ("/", "search the graph (from any screen)"),
            ("n", "guided/replay: perform the current step"),
            ("g", "guided/replay: step bar / guide panel (beside the body from 120 columns)"),
            ("✓ ≠ – ▸", "step marks: done or matched, differs, skipped (needs CUDA), next"),
            ("[ / ]", "guided/replay: scroll the guide panel"),
            ("x", "cancel the running step"),
            ("ctrl+s / ctrl+o", "save the session / open a session to replay"),
            ("WORKBENCH_ANSI=1", "(environment) the 16-colour ANSI theme"),
            ("?", "this help"),
            ("q / ctrl+q", "quit (asks first if steps are unsaved)"),
        ],
    ),
    ("Model", [("c", "capture the graph (queued while the model is checked)"), ("r", "rescan the Hugging Face cache")]),
    (
        "Graph",
        [
            ("/", "search IDs, ops, names, module paths (words; * ? globs)"),
            ("enter", "search: go to the results; tree: show that module"),
            ("n / N", "while searching: next / previous match (table or tree)"),
            ("right / left", "tree: expand / collapse"),
            ("enter (edges)", "follow the highlighted tensor edge"),
            ("backspace", "back along the followed edges"),
            ("space", "mark/unmark the node for a region"),
            ("t", "tree / table focus"),
            ("< / >", "narrower / wider module tree"),
            ("p", "Profile: where the time goes"),
        ],
    ),
    (
        "Region",
        [
            ("enter", "pick the highlighted recipe instance"),
            ("space", "unmark a node"),
            ("s", "save the receipt"),
            ("m", "manual selection from marked nodes"),
        ],
    ),
    (
        "Kernel",
        [
            ("i / a", "build the identity-copy / residual-add kernel"),
            ("enter (list)", "build the shipped kernel, or run the shipped exporter, highlighted"),
            ("/", "type a DSO path (the / is its first character)"),
            ("enter (DSO)", "use the DSO path typed (l outside the field)"),
            ("s", "generate the CuTe DSL exporter stub"),
            ("e", "run the exporter"),
            ("o", "edit the exporter in $EDITOR"),
            ("v", "watch: each save re-exports, binds a new pipeline, runs both gates (x stops)"),
            ("w", "write the bindings manifest"),
        ],
    ),
    ("Build", [("b", "build the native bundle"), ("s", "build the slot-ready bundle"), ("x", "cancel")]),
    ("Verify", [("c", "correctness gate"), ("p", "performance gate"), ("v", "both, then the verdict")]),
    (
        "Profile",
        [
            ("r", "profile the native bundle on the engine shown (auto: the one the pipeline runs)"),
            ("e", "the engine to profile: auto, compiled, torch (op by op)"),
            ("f", "profile op by op and report what the compiled engine fuses"),
            ("up / down", "move through the candidates (they take the keys once the profile is done)"),
            ("s / enter", "select the candidate: Region screen with its nodes marked"),
            ("x", "cancel"),
        ],
    ),
    ("Trust prompt", [("y", "load the kernel and run the step"), ("esc / d", "do not load")]),
    ("Replace prompt", [("y", "replace the existing file"), ("esc / n", "keep it; the step does not run")]),
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


class SummaryModal(ModalScreen[None]):
    """The end of a guided session: what was built, the verdicts with numbers, save and replay."""

    BINDINGS = [Binding("escape,enter,q", "close", "close"), Binding("ctrl+s", "save", "save the session")]

    def __init__(self, app) -> None:
        super().__init__()
        self.text = summary_text(app)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="summary-box", classes="modal-box"):
            yield Static(self.text, id="summary-text")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        self.dismiss(None)
        self.app.post_message(SaveSession())


def shown_folder(p) -> str:
    """A folder as a person would type it from here: relative to the current folder when inside it."""
    import os
    from pathlib import Path

    p = Path(p)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        home = str(Path.home())
        s = str(p)
        return "~" + s[len(home) :] if s.startswith(home + os.sep) else s


def replay_verdict(g) -> tuple[str, list[str]]:
    """A TUI replay's word (PASS / FAIL / REPRODUCED, as the headless headline) and its gate notes."""
    from ..registry import PASSING, verdict_of
    from ..replay import verdict_note

    notes, failing, reproduced = [], bool(g.mismatches) or not g.done, False
    for i, step in enumerate(g.session.steps):
        o = g.outcomes.get(i)
        if o is None or o.kind != "ok":
            continue
        then = verdict_of(step.action, step.results) if step.status == "ok" else None
        now = verdict_of(step.action, o.results)
        note = verdict_note(i + 1, step.action, then, now)
        if note:
            notes.append(note)
        if now is not None and now not in PASSING:
            failing |= then is None
            reproduced |= then == now
    return ("FAIL" if failing else "REPRODUCED" if reproduced else "PASS"), notes


def summary_text(app) -> Text:
    """What a finished tutorial or replay leaves behind (one implementation; tests read it)."""
    t = Text()
    _summary_headline(t, app.guide)
    _summary_files(t, app.state)
    _summary_verdicts(t, app.state)
    _summary_next(t)
    return t


def _summary_headline(t: Text, g) -> None:
    """The title, and the replay's word (as the headless headline has it) or the tutorial's counts."""
    t.append(
        f"{'Tutorial' if g and g.mode == 'tutorial' else 'Replay'} finished: {g.session.title if g else ''}\n",
        style="bold",
    )
    if g is not None and g.mode == "replay":
        # the word as the headless headline has it; the counts as the step bar has them (skips honest)
        word, notes = replay_verdict(g)
        style = {"PASS": "green", "REPRODUCED": "yellow"}.get(word, "red")
        t.append(f"{word}: {g.finished_text()}\n", style=style)
        for note in notes:
            t.append(f"  {note}\n", style=style)
    elif g is not None:
        t.append(f"{g.finished_text()}\n", style="yellow" if g.skipped else "green")


def _summary_files(t: Text, st) -> None:
    """What was built, in the work folder."""
    t.append("built, in the work folder ", style="bold")
    t.append(f"{shown_folder(st.workdir)}\n", style="")
    rows = [
        ("graph snapshot", st.snapshot_path),
        ("receipt", st.receipt_path),
        ("kernel", st.library),
        ("bindings", st.manifest),
    ]
    rows += [
        (f"{arm} bundle", st.bundles[arm].result.bundle if arm in st.bundles else None) for arm in ("native", "slot")
    ]
    for label, path in rows:
        if path:
            t.append(f"  {label:<15}", style="dim")
            t.append(f"{st.show_path(path)}\n")


def _summary_verdicts(t: Text, st) -> None:
    """The correctness and performance verdicts with their numbers, and the overall word."""
    from ..results import EmbeddingsGated
    from .verify import verdict

    t.append("verdicts\n", style="bold")
    c, p = st.correctness, st.perf
    if c is not None:
        r = c.result
        word = "PASS" if r.passed else "FAIL"
        nums = ""
        if isinstance(r, EmbeddingsGated) and r.max_abs is not None:
            nums = f" max_abs {r.max_abs:.3g}, cosine {r.cosine or 0:.6f}"
        t.append(f"  correctness     {word}{nums}\n", style="green" if r.passed else "red")
    if p is not None:
        pw = p.result.word
        ratio, iv = p.result.ratio, p.result.interval
        nums = f" ratio {ratio:.4f}" if isinstance(ratio, (int, float)) else ""
        if iv is not None:
            nums += f", {iv.confidence * 100:.4g}% [{iv.low:.4f}, {iv.high:.4f}]"
        style = {"PROMOTE": "green", "INCONCLUSIVE": "yellow"}.get(pw, "red")
        t.append(f"  performance     {pw}{nums}\n", style=style)
    word, reason = verdict(c, p)
    t.append(f"  verdict         {word}: {reason}\n", style="bold")


def _summary_next(t: Text) -> None:
    t.append("next\n", style="bold")
    t.append("  ctrl+s", style="bold cyan")
    t.append(" saves this session (every step and its results) as a JSON file\n")
    t.append("  workbench replay FILE", style="bold cyan")
    t.append(" re-runs it step by step; add --headless for a table (CI)\n")
    t.append("enter / esc closes · ctrl+s saves now", style="dim")
