"""Kernel screen: choose a DSO path or pick a shipped kernel from the list (build_kernel, or a shipped
exporter for the receipt), generate the CuTe DSL exporter stub from the receipt (kernel_stub) and
read it, run the exporter in a worker with this Python (its output shown; without the CuTe DSL its
error line), and write the bindings manifest (write_bindings). The edit-export-verify loop (o edits
the stub in $EDITOR, v watches it) is kernel_loop.py. Native code is loaded only after a trust prompt."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import DataTable, Input, Label, OptionList, RichLog, Static, TextArea
from textual.widgets.option_list import Option

from mcore import WatchRound

from ..messages import ActionLog
from ..outputs import fresh_name
from ..results import KernelBuilt, Record
from .base import KeyButtons, WorkbenchScreen, on_action
from .kernel_loop import fill_history, open_in_editor, watch_config

KERNEL_OUTPUTS = {"identity-copy": "kernel.so", "residual-add": "residual-add.so"}
KERNEL_KEYS = {"identity-copy": "i", "residual-add": "a"}
WATCH_TASK = "kernel_watch"


def catalog_options() -> list[Option]:
    """mcore's shipped kernels and exporters (`mcore kernel list`): enter builds or exports one."""
    from mcore import kernel_catalog

    out = []
    for k in kernel_catalog():
        t = Text(no_wrap=True, overflow="ellipsis")
        key = KERNEL_KEYS.get(k.name)
        t.append(f"{key} " if key else "  ", style="bold")
        t.append(k.name, style="bold")
        t.append(f"  {k.kind} · {k.description}", style="dim")
        out.append(Option(t, id=f"{k.kind}:{k.name}"))
    return out


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
        Binding("o", "edit", "edit"),
        Binding("v", "watch", "watch"),
        Binding("w", "bindings", "bindings"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._shown_stub: str | None = None

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
                ("s", "stub", "stub"),
                ("e", "export", "export"),
                ("o", "edit", "edit"),
                ("v", "watch", "watch"),
                ("w", "bind", "bindings"),
            ],
            id="kernel-buttons",
        )
        yield Static("", id="kernel-status")
        yield OptionList(*catalog_options(), id="kernel-list", compact=True)
        yield Static("", id="stub-title", classes="section")
        yield _text_area(id="stub-view")
        yield DataTable(id="watch-history", cursor_type="row", zebra_stripes=False)
        yield RichLog(id="export-log", wrap=True, markup=False, min_width=20, max_lines=500)

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#export-log", RichLog).display = False
        self.refresh_view()

    def refresh_history(self) -> None:
        """The watch's rounds (round, time, max_abs, ratio, verdict), shown once a watch has run."""
        table = self.query_one("#watch-history", DataTable)
        rounds = self.state.watch_rounds
        table.display = bool(rounds) or self.wb.busy == WATCH_TASK
        if table.row_count != len(rounds) or not table.columns:
            fill_history(table, rounds)

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
            slot = st.bundles.get("slot")
            served = [
                k
                for k in (slot.result.kernel_slots if slot else ())
                if rec and k.binding_id == rec.binding_id and k.abi_sha256 == rec.abi_sha256
            ]
            if len(served) > 1:  # one entry binds every slot of its binding ID (one per layer)
                t.append(f"  (its entry binds all {len(served)} slots of the slot-ready bundle)", style="magenta")
        else:
            t.append("- (w writes it once a receipt and a library are chosen)", style="dim")
        self.query_one("#kernel-status", Static).update(t)
        if st.library and not self.query_one("#dso-path", Input).value:
            self.query_one("#dso-path", Input).value = st.show_path(st.library)
        self.refresh_history()
        title = self.query_one("#stub-title", Static)
        view = self.query_one("#stub-view", TextArea)
        if st.stub_text is not None:
            title.update(
                Text.assemble(
                    ("CuTe DSL exporter stub ", "bold"),
                    (st.show_path(st.stub_path), ""),
                    ("  (o edits, e runs, v watches it)", "dim"),
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

        def done(result: Record) -> None:
            assert isinstance(result, KernelBuilt)
            self.query_one("#dso-path", Input).value = self.state.show_path(result.library)
            self.wb.say(f"✓ built {name}: {result.description or result.variant}", "green")

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
    def action_export(self, exporter: str | None = None) -> None:
        """Run the stub, or the shipped exporter picked in the list (the export_kernel step: recorded
        and replayed like every step); its output streams into the log below the stub."""
        st = self.state
        exporter = exporter or st.stub_path
        if exporter is None:
            self.wb.report_error("no stub yet: press s to generate the exporter stub first")
            return
        if st.receipt_path is None:
            self.wb.report_error("no receipt yet: the exporter compiles for one (F3 saves it, F5 s builds one)")
            return
        stem = Path(exporter).stem.replace("export_", "") or "kernel"
        out = fresh_name(st, f"{stem}.cute.so")
        log = self.query_one("#export-log", RichLog)
        log.display = True
        log.clear()
        snap = f" --snapshot {st.snapshot_path}" if st.snapshot_path else ""
        log.write(Text(f"$ mcore kernel export {exporter} --selection {st.receipt_path}{snap} -o {out}", style="dim"))

        def finished(outcome) -> None:
            if outcome.kind == "ok":
                self.query_one("#dso-path", Input).value = out
                log.write(Text(f"exported {out}; w binds it", style="green"))
            elif outcome.error:
                log.write(Text(outcome.error, style="bold red"))

        params = {"exporter": exporter, "receipt": st.receipt_path, "output": out}
        if st.snapshot_path:
            params["snapshot"] = st.snapshot_path
        self.wb.perform("export_kernel", params, on_finish=finished, label="run the exporter")

    @on_action
    def on_action_log(self, message: ActionLog) -> None:
        if self.wb.busy == "export_kernel":
            style = "red" if "error" in message.line.lower() else ""
            self.query_one("#export-log", RichLog).write(Text(message.line, style=style))

    @on(OptionList.OptionSelected, "#kernel-list")
    def kernel_picked(self, event: OptionList.OptionSelected) -> None:
        kind, _, name = (event.option.id or "").partition(":")
        if kind == "build":
            self.action_build(name)
        elif kind == "export":
            self.action_export(name)

    # ------------------------------------------------------------------ the edit-export-verify loop
    def action_edit(self) -> None:
        """o: the exporter in $EDITOR (the TUI hands the terminal over and takes it back); a running
        watch sees the saved file and starts its next round."""
        st = self.state
        if st.stub_path is None:
            self.wb.report_error("no exporter to edit yet: press s to generate the stub from the receipt")
            return
        path = st.path(st.stub_path)
        rc = open_in_editor(self.wb, path)
        self.reload_stub()
        watching = self.wb.busy == WATCH_TASK
        self.wb.say(
            f"edited {st.show_path(st.stub_path)}"
            + (f" (the editor exited {rc})" if rc else "")
            + (
                "; the watch runs the next round if it changed"
                if watching
                else "; v watches it: every save re-exports and verifies"
            ),
            "yellow" if rc else "green",
        )

    def reload_stub(self) -> None:
        st = self.state
        try:
            st.stub_text = st.path(st.stub_path).read_text(encoding="utf-8") if st.stub_path else None
        except OSError:
            st.stub_text = None
        self.refresh_view()

    def action_watch(self) -> None:
        """v: the watch loop on the stub (x stops it). Asks once before it runs the script and loads
        the DSOs it exports."""
        cfg = watch_config(self.state)
        shown = self.state.show_path(self.state.stub_path)
        if shown in self.state.trusted:
            self.start_watch(cfg)
            return
        from .dialogs import TrustModal

        def answered(ok: bool | None) -> None:
            if ok:
                self.state.trusted.add(shown)
                self.start_watch(cfg)
            else:
                self.wb.say("not watched: you declined to run the exporter", "yellow")

        what = f"{shown} (each save: run it, then load the DSO it exports)"
        self.wb.push_screen(TrustModal(what, what), answered)

    def start_watch(self, cfg) -> None:
        from mcore import watch_kernel

        st = self.state
        st.watch_rounds = []

        def on_round(r) -> None:
            self.wb.call_from_thread(self.round_done, r)

        def say(line: str) -> None:  # the exporter's output and the native-code notices, from the thread
            self.wb._call_ui(self.wb._on_log, line)

        def work(progress) -> None:
            watch_kernel(cfg, progress=progress, on_round=on_round, log=say, announce=say)

        def ended(outcome) -> None:
            self.refresh_view()

        label = f"watch {st.show_path(st.stub_path)}"
        if self.wb.run_task(WATCH_TASK, label, work, ended):
            self.wb.say(f"watching; rounds go to {st.show_path(str(cfg.out_dir))} (x stops)", "green")
            self.refresh_view()

    def round_done(self, r: WatchRound) -> None:
        self.state.watch_rounds.append(r)
        self.reload_stub()
        style = {"PROMOTE": "green", "PASS": "green", "EXPORTED": "yellow"}.get(r.verdict, "red")
        self.wb.say(f"round {r.index}: {r.verdict}; save the exporter for the next (x stops)", style)
