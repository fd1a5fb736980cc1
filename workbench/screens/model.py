"""Model screen: pick a model (demo, local checkpoint folder, local Hugging Face cache) and the
build arguments; every change is validated (BuildArgs.validate, then the family's own rules)
and the error is shown inline. `c` captures the chosen engine role's graph."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Grid
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from mcore import LAYOUTS, PRECISIONS, WEIGHTS, BuildArgs, UserError

from ..results import Captured, Record
from .base import WorkbenchScreen

DEVICES = ("auto", "cpu", "cuda")  # auto: the bundle's device, else CUDA when present


def demo_models() -> list[str]:
    from mcore import demo_names

    return [f"demo:{n}" for n in demo_names()]


def hf_cache_models() -> tuple[list[tuple[str, str, str]], str | None]:
    """[(repo_id, commit, label)] of model repos in the local Hugging Face cache (no network), and a note."""
    try:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except Exception:  # noqa: BLE001
        return [], "huggingface_hub is not installed"
    try:
        info = scan_cache_dir(os.environ.get("HF_HUB_CACHE") or None)
    except CacheNotFound:
        return [], "no Hugging Face cache on this machine"
    except Exception as e:  # noqa: BLE001 - a damaged cache must not stop the screen
        return [], f"could not scan the Hugging Face cache ({type(e).__name__})"
    rows = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
            refs = ",".join(sorted(rev.refs)) if rev.refs else ""
            if not (rev.snapshot_path / "config.json").exists():
                continue
            label = f"{repo.repo_id} @{rev.commit_hash[:10]}" + (f" ({refs})" if refs else "")
            rows.append((repo.repo_id, rev.commit_hash, label))
    return rows, (None if rows else "no checkpoints (with config.json) in the Hugging Face cache")


def _int_or_none(text: str, name: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UserError(
            f"--{name} {text!r} is not an integer; type a whole number or leave it empty for the default"
        ) from None
    if value < 0:  # typed, never dropped: a silently dropped `-` would build another graph (0: BuildArgs says)
        raise UserError(f"--{name} {value} must be a positive whole number; type one or leave it empty for the default")
    return value


class ModelScreen(WorkbenchScreen):
    SCREEN_NAME = "model"
    BINDINGS = [
        Binding("c", "capture", "capture graph"),
        Binding("r", "rescan", "rescan HF cache", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._resolve_serial = 0
        self._hf: list[tuple[str, str, str]] = []
        self._hf_note: str | None = "scanning the Hugging Face cache…"
        self.family: str | None = None
        self.kind: str | None = None
        self.roles: tuple[str, ...] = ()
        self.args_error: str | None = None
        self._filling = False
        self._shown_args: dict[str, Any] | None = None
        self._checked: tuple[BuildArgs, str | None] | None = None  # (args, error) of the last family check
        self.capture_queued = False  # c pressed while the model was still being checked
        self._first_focus = True  # the first time the screen shows: focus where the user types first

    def compose_body(self) -> Iterable[Widget]:
        # no auto-height wrapper around the list: one would count the list's every row, not its max-height
        yield Static(
            "Model: type a demo, a checkpoint folder or a hub ID (enter when done), or pick one below",
            classes="section",
        )
        yield Input(placeholder="demo:qwen3-tiny, /path/to/checkpoint or org/name", id="model-spec", compact=True)
        yield OptionList(id="model-list", compact=True)
        with Grid(id="args-form"):
            yield Label("revision", classes="lbl")
            yield Input(placeholder="(not pinned)", id="arg-revision", compact=True)
            yield Label("precision", classes="lbl")
            yield Select(
                [(p, p) for p in PRECISIONS], value="fp32", allow_blank=False, id="arg-precision", compact=True
            )
            yield Label("cache length", classes="lbl")
            yield Input(placeholder="decoders; default", id="arg-cache", compact=True)
            yield Label("layout", classes="lbl")
            yield Select(
                [("default (split)", "")] + [(x, x) for x in LAYOUTS],
                value="",
                allow_blank=False,
                id="arg-layout",
                compact=True,
            )
            yield Label("max seq length", classes="lbl")
            yield Input(placeholder="encoders; default 256", id="arg-seq", compact=True)
            yield Label("weights", classes="lbl")
            yield Select(
                [(w, w) for w in WEIGHTS], value="checkpoint", allow_blank=False, id="arg-weights", compact=True
            )
            yield Label("device", classes="lbl")
            yield Select([(d, d) for d in DEVICES], value="auto", allow_blank=False, id="arg-device", compact=True)
            yield Label("engine role", classes="lbl")
            yield Select([], prompt="(pick a model)", id="arg-role", compact=True)
        yield Static("", id="args-status")

    # ------------------------------------------------------------------ lifecycle
    def on_mount(self) -> None:
        super().on_mount()
        self.fill_from_state()
        self.fill_list()
        self.scan_hf()

    def focus_default(self) -> None:
        if self._first_focus:
            self._first_focus = False
            if self.wb.guide is None and self.state.snapshot is None:
                # free mode starts by naming a model: typing `qwen` must fill the field, never quit
                self.query_one("#model-spec", Input).focus()
                return
        if not isinstance(self.focused, (Input, Select)):
            self.query_one("#model-list", OptionList).focus()

    def on_descendant_focus(self) -> None:
        self.show_status()  # the capture hint depends on whether a field has the focus

    def on_descendant_blur(self) -> None:
        self.show_status()

    @on(Input.Submitted, "#model-spec")
    def spec_submitted(self) -> None:
        """Enter: done typing the model; the list takes the focus, so letters are keys again (c captures)."""
        self.query_one("#model-list", OptionList).focus()
        self.show_status()

    def fill_from_state(self) -> None:
        a = self.state.build_args
        self._shown_args = dict(a)
        self._filling = True
        self.query_one("#model-spec", Input).value = str(a.get("model") or "")
        self.query_one("#arg-revision", Input).value = a.get("model_revision") or ""
        self.query_one("#arg-precision", Select).value = a.get("precision") or "fp32"
        self.query_one("#arg-cache", Input).value = str(a.get("max_cache_length") or "")
        self.query_one("#arg-layout", Select).value = a.get("decoder_engine_layout") or ""
        self.query_one("#arg-seq", Input).value = str(a.get("max_seq_length") or "")
        self.query_one("#arg-weights", Select).value = a.get("weights") or "checkpoint"
        self.query_one("#arg-device", Select).value = self.state.device if self.state.device in DEVICES else "auto"
        self._filling = False
        self.model_changed()

    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        # a guided capture or build changes the build args: show them
        if self.state.build_args != self._shown_args:
            self.fill_from_state()
        self.show_status()

    def fill_list(self) -> None:
        ol = self.query_one("#model-list", OptionList)
        ol.clear_options()
        items: list[Any] = []
        for name in demo_models():
            items.append(Option(f"{name}   demo, offline, seeded", id=f"spec:{name}|"))
        for repo, commit, label in self._hf:
            items.append(Option(f"{label}   HF cache", id=f"spec:{repo}|{commit}"))
        ol.add_options(items)
        if self._hf_note:
            ol.add_option(Option(Text(self._hf_note, style="dim"), disabled=True))

    @work(thread=True, exclusive=True, group="hfscan")
    def scan_hf(self) -> None:
        rows, note = hf_cache_models()
        self.app.call_from_thread(self._hf_scanned, rows, note)

    def _hf_scanned(self, rows, note) -> None:
        self._hf, self._hf_note = rows, note
        if self.is_mounted:
            self.fill_list()

    def action_rescan(self) -> None:
        self._hf_note = "scanning the Hugging Face cache…"
        self.fill_list()
        self.scan_hf()

    # ------------------------------------------------------------------ events
    @on(OptionList.OptionSelected, "#model-list")
    def picked(self, event: OptionList.OptionSelected) -> None:
        oid = event.option.id or ""
        if not oid.startswith("spec:"):
            return
        spec, _, commit = oid[len("spec:") :].partition("|")
        self._filling = True
        self.query_one("#model-spec", Input).value = spec
        self.query_one("#arg-revision", Input).value = commit
        self._filling = False
        self.model_changed()

    @on(Input.Changed, "#model-spec")
    def spec_changed(self) -> None:
        if not self._filling:
            self.model_changed()

    @on(Input.Changed, "#arg-revision, #arg-cache, #arg-seq")
    @on(Select.Changed, "#arg-precision, #arg-layout, #arg-weights, #arg-device")
    def arg_changed(self) -> None:
        if not self._filling:
            self.validate_args()

    def model_changed(self) -> None:
        self.family, self.kind, self.roles = None, None, ()
        self._resolve_serial += 1
        self._checked = None
        self.validate_args()

    # ------------------------------------------------------------------ validation
    def read_args(self) -> BuildArgs:
        """The form as BuildArgs; raises UserError (shown inline) for bad input."""
        q = self.query_one
        layout = q("#arg-layout", Select).value
        return BuildArgs(
            model=q("#model-spec", Input).value.strip(),
            model_revision=q("#arg-revision", Input).value.strip() or None,
            precision=str(q("#arg-precision", Select).value),
            max_cache_length=_int_or_none(q("#arg-cache", Input).value, "max-cache-length"),
            decoder_engine_layout=(str(layout) if layout and layout is not Select.BLANK else None),
            max_seq_length=_int_or_none(q("#arg-seq", Input).value, "max-seq-length"),
            weights=str(q("#arg-weights", Select).value),
        )

    def validate_args(self) -> None:
        """Cheap checks now; the family's rules (model resolution) in a worker."""
        try:
            args = self.read_args().validate()
            device = str(self.query_one("#arg-device", Select).value)
            if device == "cuda" and not _cuda_available():
                raise UserError("device cuda: no CUDA GPU is visible on this machine; choose cpu")
        except UserError as e:
            self._resolve_serial += 1  # a family check still running is for older input: drop its verdict
            self.args_error = str(e)
            self.show_status()
            return
        if self._checked is not None and self._checked[0] == args:
            # unchanged since the last family check (e.g. a device or role change): reuse its verdict
            self.args_error = self._checked[1]
            self.show_status()
            return
        self.args_error = None
        self.show_status()
        self._resolve_serial += 1
        self.resolve_family(args, self._resolve_serial)

    @work(thread=True, exclusive=True, group="resolve")
    def resolve_family(self, args: BuildArgs, serial: int) -> None:
        from mcore import resolve

        result: tuple[str | None, str | None, tuple[str, ...], str | None]
        try:
            _source, family, _gargs = resolve(args)
            result = (family.name, family.kind, tuple(family.roles), None)
        except UserError as e:
            result = (None, None, (), str(e))
        except Exception as e:  # noqa: BLE001 - shown inline
            result = (None, None, (), f"{args.model}: could not read the model ({type(e).__name__}: {e})")
        self.app.call_from_thread(self._resolved, serial, args, *result)

    def _resolved(self, serial: int, args: BuildArgs, family, kind, roles, error) -> None:
        if not self.is_mounted or not self.app.is_running or serial != self._resolve_serial:
            return
        self._checked = (args, error)
        self.family, self.kind, self.roles = family, kind, roles
        self.args_error = error
        role_sel = self.query_one("#arg-role", Select)
        current = role_sel.value
        if roles:
            want = self.state.engine_role if self.state.engine_role in roles else None
            if current in roles:
                want = str(current)
            self._filling = True
            try:
                role_sel.set_options([(r, r) for r in roles])
                role_sel.value = want or ("decode" if "decode" in roles else roles[0])
            except NoMatches:  # the app is closing
                return
            finally:
                self._filling = False
        self.show_status()
        if self.capture_queued:
            self.capture_queued = False
            if error:
                self.wb.report_error(error)
            else:
                self.action_capture()

    def show_status(self) -> None:
        if not self.is_mounted:
            return
        t = Text()
        if self.args_error:
            t.append("✗ ", style="bold red")
            t.append(self.args_error, style="red")
        elif self.family:
            t.append("✓ ", style="bold green")
            t.append(f"family {self.family} ({self.kind}); roles {', '.join(self.roles)}")
            # in a field `c` is a letter: say how to get to the key
            t.append(" · enter, then " if isinstance(self.focused, Input) else " · ", style="dim")
            t.append("c", style="bold reverse")
            t.append(" captures", style="dim")
        else:
            t.append("checking the model…", style="dim")
        snap = self.state.snapshot
        if snap is not None:
            t.append(
                f"\ncaptured: {snap.metadata['model']} {snap.engine_role}  {len(snap.nodes)} nodes  "
                f"fingerprint {snap.fingerprint[:16]}…",
                style="dim",
            )
        if self.wb.guide is None:  # free mode writes here (a guided session says so in its summary)
            from .dialogs import shown_folder

            t.append(f"\nwork folder: {shown_folder(self.state.workdir)}", style="dim")
        self.query_one("#args-status", Static).update(t)

    # ------------------------------------------------------------------ capture
    def action_capture(self) -> None:
        if self.args_error:
            self.wb.report_error(self.args_error)
            return
        try:
            args = self.read_args().validate()
        except UserError as e:
            self.wb.report_error(str(e))
            return
        role = self.query_one("#arg-role", Select).value
        if not self.roles or role is Select.BLANK or role not in self.roles:
            # a cold cache makes the first check slow: queue the capture instead of refusing it
            self.capture_queued = True
            self.wb.say("checking the model first; the capture starts as soon as it is ready", "yellow")
            return
        self.capture_queued = False
        device = str(self.query_one("#arg-device", Select).value)
        self.state.device = None if device == "auto" else device
        self.state.build_args = args.to_dict()
        self.state.family_kind = self.kind
        params = {"build_args": args.to_dict(), "engine_role": str(role), "snapshot": f"{role}.graph.json"}

        def done(result: Record) -> None:
            assert isinstance(result, Captured)
            self.wb.say(f"✓ captured {result.nodes} nodes; fingerprint {result.fingerprint[:16]}…", "green")
            self.wb.go("graph")

        self.wb.perform("capture_graph", params, on_done=done, label=f"capture {role} graph")


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False
