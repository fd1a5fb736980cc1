"""Kernel screen: choose a DSO path or build a shipped kernel (build_kernel), generate the CuTe
DSL exporter stub from the receipt (kernel_stub) and read it, run the exporter in a worker
with this Python (its output shown; without the CuTe DSL its error line), and write the
bindings manifest (write_bindings). Native code is loaded only later, after a trust prompt."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Input, Label, RichLog, Static, TextArea


from ..outputs import fresh_name
from .base import KeyButtons, WorkbenchScreen

KERNEL_OUTPUTS = {"identity-copy": "kernel.so", "residual-add": "residual-add.so"}


def relative_paths(text: str, workdir: Path) -> str:
    """The stub as shown: paths inside the work folder written relative to it (the file is unchanged)."""
    for root in {str(workdir), os.path.realpath(workdir)}:
        text = text.replace(root + os.sep, "")
    return text


def _text_area(**kw) -> TextArea:
    try:
        return TextArea.code_editor("", language="python", read_only=True, **kw)
    except Exception:  # noqa: BLE001 - no tree-sitter grammar: plain text, still read-only
        return TextArea("", read_only=True, show_line_numbers=True, **kw)


class KernelScreen(WorkbenchScreen):
    SCREEN_NAME = "kernel"
    BINDINGS = [
        Binding("i", "build('identity-copy')", "identity-copy"),
        Binding("a", "build('residual-add')", "residual-add"),
        Binding("l", "use_path", "use DSO", show=False),
        Binding("slash", "edit_path", "DSO path", show=False),
        Binding("s", "stub", "stub"),
        Binding("e", "export", "export"),
        Binding("w", "bindings", "bindings"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._shown_stub: Optional[str] = None

    def compose_body(self) -> Iterable[Widget]:
        with Horizontal(id="dso-row"):
            yield Label("DSO", classes="lbl")
            yield Input(
                placeholder="/ types a path to a TVM-FFI .so (enter uses it; esc leaves the field)",
                id="dso-path",
                compact=True,
                select_on_focus=False,  # `/` puts its slash in first; selecting it would let the next key replace it
            )
        # buttons for the mouse, and somewhere for tab to go from the field
        yield KeyButtons(
            [
                ("i", "identity-copy", "build('identity-copy')"),
                ("a", "residual-add", "build('residual-add')"),
                ("s", "stub", "stub"),
                ("e", "export", "export"),
                ("w", "bind", "bindings"),
            ],
            id="kernel-buttons",
        )
        yield Static("", id="kernel-status")
        yield Static("", id="stub-title", classes="section")
        yield _text_area(id="stub-view")
        yield RichLog(id="export-log", wrap=True, markup=False, min_width=20, max_lines=500)

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#export-log", RichLog).display = False
        self.refresh_view()

    # ------------------------------------------------------------------ state -> widgets
    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        st = self.state
        t = Text()
        rec = st.receipt
        t.append("receipt  ", style="dim")
        if rec:
            t.append(f"{rec.binding_id}  abi {rec.abi_sha256[:16]}…  {rec.call}\n")
        else:
            t.append("none yet: save one on the Region screen (F3)\n", style="yellow")
        t.append("library  ", style="dim")
        t.append(f"{st.show_path(st.library) if st.library else '-'}\n")
        t.append("manifest ", style="dim")
        if st.manifest:
            t.append(f"{st.show_path(st.manifest)}")
            served = [
                k
                for k in ((st.bundles.get("slot") or {}).get("kernel_slots") or [])
                if rec and k["binding_id"] == rec.binding_id and k["abi_sha256"] == rec.abi_sha256
            ]
            if len(served) > 1:  # one entry binds every slot of its binding ID (one per layer)
                t.append(f"  (its entry binds all {len(served)} slots of the slot-ready bundle)", style="magenta")
        else:
            t.append("- (w writes it once a receipt and a library are chosen)", style="dim")
        self.query_one("#kernel-status", Static).update(t)
        if st.library and not self.query_one("#dso-path", Input).value:
            self.query_one("#dso-path", Input).value = st.show_path(st.library)
        title = self.query_one("#stub-title", Static)
        view = self.query_one("#stub-view", TextArea)
        if st.stub_text is not None:
            title.update(
                Text.assemble(
                    ("CuTe DSL exporter stub ", "bold"),
                    (st.show_path(st.stub_path), ""),
                    ("  (read-only, paths relative to the work folder; e runs it)", "dim"),
                )
            )
            if self._shown_stub != st.stub_text:
                self._shown_stub = st.stub_text
                view.load_text(relative_paths(st.stub_text, st.workdir))
            view.display = True
        else:
            view.display = False
            if rec:
                head = Text.assemble(
                    ("The kernel must implement this call (", "dim"),
                    ("s", "bold reverse"),
                    (" generates a CuTe DSL exporter stub for it):\n", "dim"),
                )
                title.update(Text.assemble(head, Text("\n".join(rec.call_lines()), style="")))
            else:
                title.update(Text("s generates a CuTe DSL exporter stub from the receipt", style="dim"))

    def focus_default(self) -> None:
        pass

    # ------------------------------------------------------------------ actions
    def action_build(self, name: str) -> None:
        # a fresh name: a library this process loaded is never rebuilt in place (mcore would refuse to run it)
        out = fresh_name(self.state, KERNEL_OUTPUTS.get(name, f"{name}.so"))

        def done(results: dict[str, Any]) -> None:
            self.query_one("#dso-path", Input).value = self.state.show_path(results.get("library"))
            self.wb.say(f"✓ built {name}: {results.get('description') or results.get('variant')}", "green")

        self.wb.perform("build_kernel", {"name": name, "output": out}, on_done=done, label=f"build {name} kernel")

    @on(Input.Submitted, "#dso-path")
    def path_submitted(self) -> None:
        # enter in the field is `l`: letters there are text, so the key itself cannot be used
        self.action_use_path()
        self.set_focus(None)

    def action_edit_path(self) -> None:
        """/: the DSO field takes the focus and the `/` itself, as the first character of an absolute path
        (over the path the screen filled in; after what the user typed, at the cursor)."""
        field = self.query_one("#dso-path", Input)
        if not field.value or field.value == self.state.show_path(self.state.library):
            field.value = "/"
            field.cursor_position = 1
        else:
            field.insert_text_at_cursor("/")
        field.focus()
        self.wb.typing_in = field

    def action_use_path(self) -> None:
        text = self.query_one("#dso-path", Input).value.strip()
        if not text:
            self.wb.report_error("type the DSO's path first (relative paths are inside the work folder)")
            return
        p = self.state.path(text)
        if not p.is_file():
            self.wb.report_error(f"{text}: no such file; build a kernel (i / a) or give the path of a .so")
            return
        self.state.library = text
        self.refresh_view()
        self.wb.say(f"using {text}; w writes the bindings manifest", "green")

    def action_stub(self) -> None:
        st = self.state
        if st.receipt is None or st.receipt_path is None or st.snapshot_path is None:
            self.wb.report_error("no receipt yet: capture a graph (F1) and save a selection on the Region screen (F3)")
            return
        out = f"export_{st.receipt.binding_id.split('@')[0].replace('.', '_')}.py"
        self.wb.perform(
            "kernel_stub",
            {"receipt": st.receipt_path, "snapshot": st.snapshot_path, "output": out},
            label="generate the CuTe DSL stub",
        )

    def action_bindings(self) -> None:
        st = self.state
        typed = self.query_one("#dso-path", Input).value.strip()
        if typed and typed != st.show_path(st.library):
            st.library = typed
        if st.receipt_path is None:
            self.wb.report_error(
                "no receipt yet: save a selection on the Region screen (F3) or build a slot-ready "
                "bundle from a recipe (F5)"
            )
            return
        if not st.library:
            self.wb.report_error("no library yet: build one (i / a) or type a DSO path and press l")
            return
        self.wb.perform(
            "write_bindings",
            {"receipt": st.receipt_path, "library": st.show_path(st.library), "manifest": "kernel-bindings.json"},
            label="write the bindings manifest",
        )

    # ------------------------------------------------------------------ exporter run
    def action_export(self) -> None:
        """Run the stub (the export_kernel step: recorded and replayed like every step); its output
        streams into the log below the stub."""
        st = self.state
        if st.stub_path is None:
            self.wb.report_error("no stub yet: press s to generate the exporter stub first")
            return
        stem = Path(st.stub_path).stem.replace("export_", "") or "kernel"
        out = fresh_name(st, f"{stem}.cute.so")
        log = self.query_one("#export-log", RichLog)
        log.display = True
        log.clear()
        log.write(
            Text(
                f"$ mcore kernel export {st.stub_path} --selection {st.receipt_path} "
                f"--snapshot {st.snapshot_path} -o {out}",
                style="dim",
            )
        )

        def finished(outcome) -> None:
            if outcome.kind == "ok":
                self.query_one("#dso-path", Input).value = out
                log.write(Text(f"exported {out}; w binds it", style="green"))
            elif outcome.error:
                log.write(Text(outcome.error, style="bold red"))

        self.wb.perform(
            "export_kernel",
            {"exporter": st.stub_path, "receipt": st.receipt_path, "snapshot": st.snapshot_path, "output": out},
            on_finish=finished,
            label="run the exporter",
        )

    def on_action_log(self, line: str) -> None:
        if self.wb.busy == "export_kernel":
            style = "red" if "error" in line.lower() else ""
            self.query_one("#export-log", RichLog).write(Text(line, style=style))
