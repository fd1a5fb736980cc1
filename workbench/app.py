"""The workbench TUI: a Textual app whose every step runs through workbench.actions.

Screens (F1..F6): Model, Graph, Region, Kernel, Build, Verify. Each step a person takes
is an action run in a thread worker (never on the UI thread) with progress, cancellation
and, for the performance gate, live samples; its results are recorded into the session,
applied to the shared state, and shown. A shipped session opens in guided mode
(`workbench tutorial NAME`) or replay mode (`workbench replay FILE`): `n` performs the
current step for real and the side panel shows its results (and, on replay, expected vs
actual).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.actions import ActionParseResult
from textual.app import App
from textual.css.query import NoMatches
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Input, TextArea

from mcore import Cancelled, CancelToken, Progress, UserError

if TYPE_CHECKING:
    from mcore import PartialProfile

    from .actions import ActionContext
    from .session import Session

from .commands import WorkbenchCommands
from .keys import APP_BINDINGS
from .messages import (
    ActionDone,
    ActionLog,
    ActionMessage,
    ActionProgress,
    ActionSample,
    ActionStarted,
    PaletteCommand,
    SaveSession,
)
from .registry import REGISTRY
from .results import Record
from .screens.base import SCREEN_ORDER, SIDE_SCREENS, WorkbenchScreen
from .screens.guide import GuideState
from .state import DEFAULT_BUILD_ARGS as DEFAULT_BUILD_ARGS  # tests and callers read it here
from .state import ActionOutcome, WorkbenchState

DEFAULT_TUTORIAL = "qwen-recipe"


@dataclass(frozen=True)
class ActionRequest:
    """One request to run an action (WorkbenchApp.perform), kept whole while the app asks about
    overwriting or trust and while it runs."""

    action: str
    params: dict[str, Any]
    guide: dict[str, str] | None = None  # recorded with the step (guided sessions)
    on_done: Callable[[Record], None] | None = None  # the typed result of a success
    on_finish: Callable[[ActionOutcome], None] | None = None  # however it ended
    label: str | None = None  # what the status line calls it
    expect_error: str | None = None  # the error a guided session recorded for this step


def tutorial_path(name: str) -> Path:
    """A shipped tutorial by name (sessions/NAME.json) or a session file's path."""
    from .session import find_tutorial

    p = Path(name).expanduser()
    if p.suffix == ".json" and p.is_file():
        return p
    return find_tutorial(name or DEFAULT_TUTORIAL)


class WorkbenchApp(App):
    """The byok workbench. `WorkbenchApp(tutorial=..., replay=..., workdir=...)`."""

    CSS_PATH = "workbench.tcss"
    TITLE = "byok-workbench"
    # ctrl+p: every screen and action (workbench.commands), not Textual's system commands
    COMMANDS = {WorkbenchCommands}
    COMMAND_PALETTE_BINDING = "ctrl+p"

    BINDINGS = APP_BINDINGS

    def __init__(
        self,
        tutorial: str | None = None,
        replay: str | None = None,
        workdir: str | None = None,
        ansi: bool | None = None,
        *,
        start_screen: str | None = None,
        state: WorkbenchState | None = None,
    ):
        if ansi is None:
            ansi = os.environ.get("WORKBENCH_ANSI", "") not in ("", "0")
        super().__init__(ansi_color=True if ansi else None)
        if ansi:
            self.theme = "ansi-dark"
        self._tutorial_arg = tutorial
        self._replay_arg = replay
        self._start_screen = start_screen
        self.state = state or WorkbenchState(workdir=self._make_workdir(workdir, tutorial or replay))
        self.guide: GuideState | None = None
        self.session: Session | None = None  # created on first use
        self.busy: str | None = None
        self.busy_params: dict[str, Any] | None = None
        self.busy_label: str = ""
        self.busy_label_done: str = ""
        self.progress_step: str = ""
        self.progress_fraction: float | None = None
        self.last_error: str | None = None
        self.last_error_expected = False  # the last "error" was one the guided session recorded
        self._token: CancelToken | None = None
        self.startup_error: str | None = None
        self._expect_error: str | None = None
        self.last_outcome: ActionOutcome | None = None  # the last finished action (shown; tests read it)
        self.message: tuple[str, str] = ("", "")  # the status line's last notice (text, style): no toasts
        self.saved_steps = 0  # session steps already in a saved file (quit asks about the rest)
        self.guide_expanded: bool | None = None  # None: beside the body when the terminal is roomy
        self.history: list[str] = []  # screens visited, for alt+left = back
        # the text field the user is typing in: set by a printable key there, kept by tab/shift+tab,
        # cleared by any other key or a click; a letter after a tab out of the field is no command
        self.typing_in: Widget | None = None
        self.summary_shown = False
        self.device_line = ""  # the header's device facts, filled in by a background probe

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _make_workdir(workdir: str | None, fresh_for: str | None) -> Path:
        return make_workdir(workdir)

    def on_mount(self) -> None:
        from .screens.build import BuildScreen
        from .screens.graph import GraphScreen
        from .screens.kernel import KernelScreen
        from .screens.model import ModelScreen
        from .screens.profile import ProfileScreen
        from .screens.region import RegionScreen
        from .screens.verify import VerifyScreen

        for name, cls in (
            ("model", ModelScreen),
            ("graph", GraphScreen),
            ("region", RegionScreen),
            ("kernel", KernelScreen),
            ("build", BuildScreen),
            ("verify", VerifyScreen),
            ("profile", ProfileScreen),
        ):
            self.install_screen(cls(), name=name)
        try:
            if self._tutorial_arg is not None:
                self.load_guided(tutorial_path(self._tutorial_arg), mode="tutorial")
            elif self._replay_arg is not None:
                # a replay writes the recorded artifacts afresh: never over someone's files
                check_replay_workdir(self.state.workdir)
                self.load_guided(Path(self._replay_arg), mode="replay")
        except UserError as e:
            self.startup_error = str(e)
        self.push_screen(self._start_screen or "model")
        if self.startup_error:
            self.report_error(self.startup_error)
        if os.environ.get("WORKBENCH_DEVICE_LINE", "1") != "0":  # tests turn it off: snapshots stay fixed
            self.run_worker(self._probe_device, thread=True, group="device-probe")

    def _probe_device(self) -> None:
        """Device facts for the header (name, SMs, memory, measured copy rate and peak); torch and the
        copy measurement take a moment, so this runs off the UI thread, once."""
        import torch

        from mcore import describe_device, device_facts

        dev = self.state.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            line = describe_device(device_facts(torch.device(dev)))
        except Exception as e:  # noqa: BLE001 - the header is a convenience: say why it is missing
            line = f"{dev}: device facts unavailable ({type(e).__name__})"
        self.call_from_thread(self.show_device_line, line)

    def show_device_line(self, line: str) -> None:
        self.device_line = line
        if self.current is not None:
            self.current.refresh_chrome()

    def load_guided(self, path: Path, mode: str) -> None:
        from .replay import check_session
        from .session import Session

        sess = Session.load(path)
        # someone else's steps: their paths stay in the work folder (the trust prompt covers DSOs)
        check_session(sess, self.state.workdir, native_confirmed=True)
        self.guide = GuideState(sess, mode=mode, source=path)
        first = next((s for s in sess.steps if isinstance(s.params.get("build_args"), dict)), None)
        if first is not None and self.state.snapshot is None:
            # the Model screen shows the build arguments the session will use
            self.state.build_args = dict(first.params["build_args"])
        self.sub_title = f"{'tutorial' if mode == 'tutorial' else 'replay'}: {sess.title}"

    # ------------------------------------------------------------------ key actions
    async def run_action(
        self,
        action: str | ActionParseResult,
        default_namespace: DOMNode | None = None,
        namespaces: Mapping[str, DOMNode] | None = None,
    ) -> bool:
        """Every key binding (and a click on a tree node, whose action Textual runs with `namespaces`)
        runs through here: a failure is shown in the UI, never a traceback screen."""
        try:
            return await super().run_action(action, default_namespace, namespaces)
        except UserError as e:
            self.report_error(str(e))
        except Exception as e:  # noqa: BLE001
            where = self._write_crash_log(f"key action {action}", {})
            self.report_error(
                f"unexpected error in {action}: {type(e).__name__}: {e}".replace("\n", " ")[:300]
                + f" (details in {where}; please report it)"
            )
        return True

    async def on_event(self, event: events.Event) -> None:
        """Follow the typing streak (see `typing_in`) before the key goes anywhere."""
        if isinstance(event, events.Key) and self._too_small():
            # the screen's widgets are hidden behind the notice but keep the focus: a key would type into
            # a field no one sees, start an action or page a list that has no lines (a KeyError in
            # Textual's OptionList). The notice's keys only: q quits, x cancels what runs.
            event.stop()
            event.prevent_default()
            if event.key in ("q", "ctrl+q"):
                self.action_request_quit()
            elif event.key == "x":
                self.action_cancel()
            return
        if isinstance(event, events.Key):
            focused = self.focused
            if (
                event.is_printable
                and isinstance(focused, (Input, TextArea))
                and not getattr(focused, "read_only", False)
            ):
                self.typing_in = focused
            elif event.key not in ("tab", "shift+tab") and not event.is_printable:
                self.typing_in = None
        elif isinstance(event, events.MouseDown):
            self.typing_in = None
        await super().on_event(event)

    def _too_small(self) -> bool:
        """A workbench screen shows the "terminal too small" notice in place of its content (a dialog
        over it still takes its own keys)."""
        scr = self.current
        return scr is not None and scr.has_class("too-small")

    # ------------------------------------------------------------------ navigation
    @property
    def current(self) -> WorkbenchScreen | None:
        s = self.screen
        return s if isinstance(s, WorkbenchScreen) else None

    def action_show(self, name: str) -> None:
        if name not in SCREEN_ORDER and name not in SIDE_SCREENS:
            return
        if isinstance(self.screen, WorkbenchScreen) and self.screen.SCREEN_NAME == name:
            return
        if not isinstance(self.screen, WorkbenchScreen):
            return  # a modal is open; it decides
        self.go(name)

    def go(self, name: str):
        """Switch to screen `name`, remembering where we were (alt+left goes back)."""
        self.typing_in = None
        cur = self.current
        if cur is not None and cur.SCREEN_NAME != name:
            self.history.append(cur.SCREEN_NAME)
            del self.history[:-20]
        return self.switch_screen(name)

    def refresh_footer(self) -> None:
        """Bindings that depend on state (n = next match or next step) changed: redraw the footer."""
        self.refresh_bindings()

    def action_go_back(self) -> None:
        """alt+left (and the palette): the screen before this one."""
        cur = self.current
        if cur is None:
            return  # a modal is open; it decides
        while self.history:
            name = self.history.pop()
            if name != cur.SCREEN_NAME:
                self.typing_in = None
                self.switch_screen(name)
                return
        self.say("no earlier screen to go back to; F1–F6 switch screens", "dim")

    def action_search(self) -> None:
        """/ anywhere: search the graph (the Graph screen binds / itself)."""
        if self.state.snapshot is None:
            self.report_error("no graph to search yet: capture one on the Model screen (F1, then c)")
            return

        async def then() -> None:
            await self.go("graph")
            from .screens.graph import GraphScreen

            scr = self.current
            if isinstance(scr, GraphScreen):
                scr.action_filter()

        self.call_later(then)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "guide_next":
            # gone from the footer once every step is done (the summary says what next)
            return self.guide is not None and not self.guide.done
        if action == "summary":
            return self.guide is not None and self.guide.done
        if action in ("toggle_guide", "scroll_guide"):
            return self.guide is not None
        if action == "cancel":
            return True if self.busy else None
        return True

    def action_toggle_guide(self) -> None:
        scr = self.current
        if self.guide is not None and scr is not None:
            self.guide_expanded = not scr.guide_beside()
            self.refresh_screen()

    async def run_palette_command(self, screen: str, action: str) -> None:
        """A command palette entry: its screen first (when it has one), then its action there."""
        if screen:
            cur = self.current
            if cur is None or cur.SCREEN_NAME != screen:
                await self.go(screen)
            await self.run_action(action, self.get_screen(screen))
        else:
            await self.run_action(action)

    async def on_palette_command(self, message: PaletteCommand) -> None:
        await self.run_palette_command(message.screen, message.action)

    def on_save_session(self, message: SaveSession) -> None:
        self.action_save_session()

    # ------------------------------------------------------------------ notices and quitting
    def say(self, text: str, style: str = "") -> None:
        """A one-line notice in the status line (never a toast over the content)."""
        self.message = (text.replace("\n", " "), style)
        self.refresh_status()

    @property
    def unsaved_steps(self) -> int:
        return max(0, len(self.session) - self.saved_steps) if self.session is not None else 0

    def action_request_quit(self) -> None:
        """q / ctrl+q: quit, asking first when the session has unsaved steps."""
        from .screens.dialogs import ConfirmQuit

        if isinstance(self.screen, ConfirmQuit):
            self.exit()  # ctrl+q twice: quit without saving, as the dialog says
            return
        if isinstance(self.screen, ModalScreen):
            return  # another dialog is open: it answers its own keys
        if not self.unsaved_steps:
            self.exit()
            return

        def answered(choice: str | None) -> None:
            if choice == "quit":
                self.exit()
            elif choice == "save":
                self.action_save_session(then=self.exit)

        self.push_screen(ConfirmQuit(self.unsaved_steps), answered)

    def action_scroll_guide(self, direction: int) -> None:
        scr = self.current
        if scr is None or self.guide is None:
            return
        from .screens.guide import GuidePanel

        panel = scr.query_one(GuidePanel)
        panel.scroll_relative(y=direction * max(3, panel.size.height // 2), animate=False)

    def action_help(self) -> None:
        from .screens.dialogs import HelpModal

        self.push_screen(HelpModal())

    # ------------------------------------------------------------------ sessions
    def ensure_session(self):
        if self.session is None:
            from .session import Session

            title = "workbench session"
            if self.guide is not None:
                title = f"{self.guide.session.title} ({self.guide.mode})"
            self.session = Session.new(title, guided=False, device=self.state.device)
        return self.session

    def action_save_session(self, then: Callable[[], Any] | None = None) -> None:
        """ctrl+s: ask for a path, then save (the overwrite rule: never over one of the session's own
        artifacts; over another existing file only after asking; its own file again is a save)."""
        from .screens.dialogs import ConfirmOverwrite, PathPrompt

        default = self.state.show_path(str(self.session.path)) if self.session and self.session.path else "session.json"

        def save(target: Path) -> None:
            try:
                sess = self.ensure_session()
                out = sess.save(target)
            except UserError as e:
                self.report_error(str(e))
                return
            self.saved_steps = len(sess)
            self.say(
                f"saved {len(sess)} step(s) to {self.state.show_path(str(out))}; replay: workbench replay {out}",
                "green",
            )
            if then is not None:
                then()

        def done(path: str | None) -> None:
            if not path:
                return
            target = self.state.path(path)
            why = self._save_refusal(target)
            if why:
                self.report_error(why)
            elif target.exists() and not self._is_own_save(target):
                self.push_screen(
                    ConfirmOverwrite([path], "saving the session"), lambda ok: save(target) if ok else None
                )
            else:
                save(target)

        self.push_screen(
            PathPrompt(
                "Save the session (every step taken so far) to:",
                default,
                f"relative to the work folder {self.state.workdir}",
            ),
            done,
        )

    def _save_refusal(self, target: Path) -> str | None:
        """Why the session may not be saved at `target` (one of its own artifacts), or None."""
        from .outputs import artifact_owner

        owner = artifact_owner(target, self.state, self.session, self.guide)
        if owner is None:
            return None
        return (
            f"{self.state.show_path(str(target))} is an artifact of this session ({owner} names it); "
            "saving the session over it would lose it: choose another name, e.g. session.json"
        )

    def _is_own_save(self, target: Path) -> bool:
        path = self.session.path if self.session is not None else None
        return path is not None and Path(path).resolve() == target.resolve()

    def action_open_session(self) -> None:
        """ctrl+o: open a session to replay; with unsaved steps, ask first (it replaces this session)."""
        if not self.unsaved_steps:
            self._open_session_prompt()
            return
        from .screens.dialogs import ConfirmReplaceSession

        def answered(choice: str | None) -> None:
            if choice == "quit":  # open it anyway
                self._open_session_prompt()
            elif choice == "save":
                self.action_save_session(then=self._open_session_prompt)

        self.push_screen(ConfirmReplaceSession(self.unsaved_steps), answered)

    def _open_session_prompt(self) -> None:
        from .screens.dialogs import PathPrompt

        def done(path: str | None) -> None:
            if not path:
                return
            try:
                p = self.state.path(path)
                if p is None or not p.is_file():
                    raise UserError(f"{path}: no such session file; give a path to a saved session (.json)")
                from .session import Session

                Session.load(p)  # a bad file is one line here, before anything changes
                # the replay writes its own artifacts: a fresh folder inside the work folder, fresh state
                fresh = Path(tempfile.mkdtemp(prefix="replay-", dir=self.state.workdir)).resolve()
                self.state = WorkbenchState(workdir=fresh, device=self.state.device)
                self.session = None
                self.saved_steps = 0
                self.summary_shown = False
                self.last_error = None
                self.load_guided(p, mode="replay")
            except UserError as e:
                self.report_error(str(e))
                return
            self.say(
                f"opened {path}; it replays in the new folder {fresh.name} inside the work folder: "
                "press n for each step",
                "green",
            )
            self.refresh_screen()

        self.push_screen(
            PathPrompt(
                "Open a session file to replay step by step (n performs the next step):",
                "session.json",
                f"relative to the work folder {self.state.workdir}",
            ),
            done,
        )

    # ------------------------------------------------------------------ guided steps
    async def action_guide_next(self) -> None:
        g = self.guide
        if g is None:
            return
        if self.busy:
            self.say("a step is still running; wait for it or press x to cancel", "yellow")
            return
        step = g.current_step
        if step is None:
            self.action_summary()
            return
        index = g.index
        from .dispatch import check_step_paths

        # checked when the session opened and again now: a link made in the work folder since must not lead out
        check_step_paths(step.action, step.params, self.state.workdir, f"step {index + 1} ({step.action})")
        from .replay import SKIP_NOTE, cuda_here

        if step.requires == "cuda" and not cuda_here(self.state.device):
            g.finish(index, None, SKIP_NOTE, "skipped")
            self.say(f"step {index + 1} skipped: {SKIP_NOTE} ({step.title})", "yellow")
            self.refresh_screen()
            if g.done and not self.summary_shown:
                self.summary_shown = True
                self.action_summary()
            return
        screen = REGISTRY[step.action].screen
        if screen and self.current and self.current.SCREEN_NAME != screen:
            await self.go(screen)

        def finished(outcome: ActionOutcome) -> None:
            g.finish(index, outcome.results, outcome.error, outcome.kind)
            self.refresh_screen()
            if outcome.kind == "ok" or (outcome.kind == "user" and step.status == "error"):
                left = len(g.session.steps) - g.index
                self.say(f"✓ step {index + 1} done: {step.title}" + (f"; {left} to go (n)" if left else ""), "green")
            if g.done and not self.summary_shown:
                self.summary_shown = True
                self.action_summary()

        self.perform(
            step.action,
            dict(step.params),
            guide=step.guide,
            on_finish=finished,
            label=f"step {index + 1}: {step.title}",
            expect_error=step.error if step.status == "error" else None,
        )

    def action_summary(self) -> None:
        """The end of a guided session: what was built, the verdicts, how to save and replay."""
        from .screens.dialogs import SummaryModal

        if self.guide is None or isinstance(self.screen, ModalScreen):
            return
        self.push_screen(SummaryModal(self))

    # ------------------------------------------------------------------ running actions
    def action_cancel(self) -> None:
        if self._token is not None and self.busy:
            self._token.cancel()
            self.progress_step = "cancelling..."
            self.refresh_status()

    def run_task(
        self,
        name: str,
        label: str,
        work: Callable[[Progress], None],
        on_end: Callable[[ActionOutcome], None],
    ) -> bool:
        """Long work that is not one recorded step (the Kernel screen's watch loop) in a thread worker,
        with the same busy state, status line and x to cancel as a step; `on_end` gets how it ended."""
        if self.busy:
            self.say(f"{self.busy_label} is still running; wait or press x to cancel", "yellow")
            return False
        token = CancelToken()
        self.busy, self.busy_params, self.busy_label, self._token = name, {}, label, token
        self.progress_step, self.progress_fraction, self.last_error = "starting", 0.0, None
        self.refresh_status()
        self.refresh_screen()

        def thread() -> None:
            outcome = ActionOutcome(name, {})
            try:
                work(Progress(lambda s, f: self._call_ui(self._on_progress, s, f), token))
            except Cancelled:
                outcome.kind, outcome.error = "cancelled", "cancelled"
            except UserError as e:
                outcome.kind, outcome.error = "user", str(e)
            except Exception as e:  # noqa: BLE001 - shown in the UI, never a traceback screen
                where = self._write_crash_log(name, {})
                outcome.kind, outcome.error = "bug", f"unexpected error in {name}: {type(e).__name__}: {e} ({where})"
            self._call_ui(self._task_done, outcome, on_end)

        self.run_worker(thread, thread=True, group="task", name=name, exit_on_error=False)
        return True

    def _task_done(self, outcome: ActionOutcome, on_end: Callable[[ActionOutcome], None]) -> None:
        self.busy = self.busy_params = self._token = None
        self.progress_fraction = None
        self.progress_step = f"{self.busy_label}: {outcome.kind if outcome.kind != 'ok' else 'done'}"
        if outcome.kind == "cancelled":
            self.say(f"{self.busy_label}: stopped", "yellow")
        elif outcome.error:
            self.report_error(outcome.error)
        try:
            on_end(outcome)
        except Exception as e:  # noqa: BLE001
            self.report_error(f"could not show the results: {type(e).__name__}: {e}")
        self.refresh_status()
        self.refresh_screen()
        self.last_outcome = outcome

    def perform(
        self,
        action: str,
        params: dict[str, Any],
        *,
        guide: dict[str, str] | None = None,
        on_done: Callable[[Record], None] | None = None,
        on_finish: Callable[[ActionOutcome], None] | None = None,
        label: str | None = None,
        trusted: bool = False,
        expect_error: str | None = None,
    ) -> bool:
        """Run one action in a thread worker; record it, apply its result, then call back (UI thread).
        `on_done(result)` gets the typed result of a success, `on_finish(outcome)` how it ended.
        Phases: refuse while busy, ask before replacing an output, ask before loading native code,
        then start the worker. True when it started."""
        req = ActionRequest(action, dict(params), guide, on_done, on_finish, label, expect_error)
        return self._submit(req, trusted)

    def _submit(self, req: ActionRequest, trusted: bool = False) -> bool:
        if self.busy:
            self.say(f"{self.busy_label} is still running; wait or press x to cancel", "yellow")
            return False
        if self._ask_overwrite(req) or (not trusted and self._ask_trust(req)):
            return False
        self._start(req)
        return True

    def _not_run(self, req: ActionRequest, error: str, notice: str) -> None:
        """The user answered no to a question before the action: nothing ran."""
        self.say(notice, "yellow")
        if req.on_finish:
            req.on_finish(ActionOutcome(req.action, req.params, error=error, kind="cancelled"))

    def _ask_overwrite(self, req: ActionRequest) -> bool:
        """The overwrite rule (workbench/outputs.py): a step that would replace an existing file asks
        first; yes runs it with `overwrite: true`, esc does not run it. True when it asked."""
        from .outputs import taken_outputs

        taken = taken_outputs(req.action, req.params, self.state)
        if not taken:
            return False
        from .screens.dialogs import ConfirmOverwrite

        def answered(ok: bool | None) -> None:
            if ok:
                self._submit(replace(req, params=dict(req.params, overwrite=True)))
            else:
                self._not_run(
                    req, "not run: the existing output was kept", f"not run: {', '.join(taken)} kept as it is"
                )

        self.push_screen(ConfirmOverwrite(taken, (req.label or req.action).replace("_", " ")), answered)
        return True

    def _ask_trust(self, req: ActionRequest) -> bool:
        """An action that loads the native code its bindings manifest names (or runs a script) asks
        before it runs, once per library. True when it asked."""
        spec = REGISTRY.get(req.action)
        native = spec.trust_needed(req.params) if spec is not None else None
        if spec is None or not native or not req.params.get(native):
            return False
        value = req.params[native]
        lib = self._library_of(value) if native == spec.native_param else self.state.show_path(value)
        if lib in self.state.trusted:
            return False
        from .screens.dialogs import TrustModal

        def answered(ok: bool | None) -> None:
            if ok:
                self.state.trusted.add(lib)
                self._submit(req, trusted=True)
            else:
                self._not_run(
                    req, "not run: loading the kernel was declined", "not run: you declined to load the kernel"
                )

        self.push_screen(TrustModal(lib, self.state.show_path(value)), answered)
        return True

    def _start(self, req: ActionRequest) -> None:
        """The busy state, the status line and the worker."""
        action = req.action
        self.busy = action
        self.busy_params = dict(req.params)
        self.busy_label = req.label or action.replace("_", " ")
        if action == "gate_perf":
            self.state.samples = {"native": [], "external": []}
        if action == "profile":
            self.state.profile_partial = None
        self.progress_step, self.progress_fraction = "starting", 0.0
        self.last_error = None
        self.message = ("", "")
        token = CancelToken()
        self._token = token
        self.refresh_status()
        self.refresh_screen()
        self._post(ActionStarted(action, dict(req.params)))
        self._expect_error = req.expect_error
        self.run_worker(
            lambda: self._action_thread(req, token), thread=True, group="action", name=action, exit_on_error=False
        )

    def _library_of(self, manifest: str) -> str:
        """The library a manifest names (as shown), for the trust prompt; the manifest itself if unreadable."""
        from mcore import load_bindings_manifest

        try:
            libs = [b.library_path for b in load_bindings_manifest(self.state.path(manifest))]
            if libs:
                return ", ".join(self.state.show_path(str(lib)) for lib in libs)
        except Exception:  # noqa: BLE001 - the action itself reports a bad manifest
            pass
        return self.state.show_path(manifest)

    def _call_ui(self, fn: Callable, *args: Any) -> None:
        try:
            self.call_from_thread(fn, *args)
        except Exception:  # noqa: BLE001 - the app is closing
            pass

    def _action_context(self, action: str, token: CancelToken) -> ActionContext:
        """What the action runs with: its progress, samples, partial profiles and log go to the UI thread."""
        from .actions import ActionContext

        return ActionContext(
            workdir=self.state.workdir,
            progress=Progress(lambda step, f: self._call_ui(self._on_progress, step, f), token),
            on_sample=lambda arm, i, v: self._call_ui(self._on_sample, arm, i, v),
            on_partial=lambda data: self._call_ui(self._on_partial, action, data),
            log=lambda line: self._call_ui(self._on_log, line),
            device=self.state.device,
        )

    def _action_thread(self, req: ActionRequest, token: CancelToken) -> None:
        from .dispatch import perform_action

        action, params = req.action, req.params
        outcome = ActionOutcome(action, params)
        try:
            result, error = perform_action(self._action_context(action, token), action, params)
            if error is not None:
                outcome.kind, outcome.error = "user", error
            else:
                outcome.result = result
        except Cancelled:
            outcome.kind, outcome.error = "cancelled", "cancelled"
        except UserError as e:
            outcome.kind, outcome.error = "user", str(e)
        except Exception as e:  # noqa: BLE001 - shown in the UI, never a traceback screen
            outcome.kind = "bug"
            where = self._write_crash_log(action, params)
            outcome.error = (
                f"unexpected error in {action}: {type(e).__name__}: {e}".replace("\n", " ")[:300]
                + f" (details in {where}; please report it)"
            )
        self._call_ui(self._action_done, outcome, req)

    def _write_crash_log(self, action: str, params: dict[str, Any]) -> str:
        path = self.state.workdir / "workbench-errors.log"
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"--- {action} {json.dumps(params, default=str)}\n{traceback.format_exc()}\n")
        except OSError:
            return "the terminal log"
        return self.state.show_path(str(path))

    def _on_progress(self, step: str, fraction: float) -> None:
        self.progress_step, self.progress_fraction = step, fraction
        self.refresh_status()
        self._post(ActionProgress(self.busy or "", step, fraction))

    def _on_sample(self, arm: str, index: int, value: float) -> None:
        ys = self.state.samples.setdefault(arm, [])
        while len(ys) < index:
            ys.append(float(value))  # a missed sample: keep the x axis aligned
        if index < len(ys):
            ys[index] = float(value)
        else:
            ys.append(float(value))
        self._post(ActionSample(arm, index, value))

    def _on_partial(self, action: str, data: PartialProfile) -> None:
        if self.busy == action == "profile":
            self.state.profile_partial = data
            self._hook(lambda s: s.refresh_view())

    def _on_log(self, line: str) -> None:
        self.state.log.append(line)
        del self.state.log[:-500]
        self._post(ActionLog(line))

    def _action_done(self, outcome: ActionOutcome, req: ActionRequest) -> None:
        """The worker finished: end the busy state, record and apply (or report) the outcome, call
        the requester back, then tell the screen (ActionDone)."""
        self.busy_label_done = self.busy_label
        self.busy = self.busy_params = self._token = None
        expected, self._expect_error = self._expect_error, None
        self.progress_fraction = None
        what = outcome.action.replace("_", " ")
        if outcome.kind == "ok":
            self._finished_ok(outcome, req)
        elif outcome.kind == "cancelled":
            self.progress_step = f"{what}: cancelled"
            self.say(f"{what} cancelled; nothing was written", "yellow")
        else:
            self._finished_failed(outcome, req, expected)
        self.refresh_status()
        if outcome.kind == "ok" and req.on_done is not None and outcome.result is not None:
            self._call_back(req.on_done, outcome.result)
        if req.on_finish is not None:
            self._call_back(req.on_finish, outcome)
        self.refresh_screen()
        self._post(ActionDone(outcome))
        self.last_outcome = outcome

    def _call_back(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except Exception as e:  # noqa: BLE001
            self.report_error(f"could not show the results: {type(e).__name__}: {e}")

    def _finished_ok(self, outcome: ActionOutcome, req: ActionRequest) -> None:
        """A success: recorded into the session, its result applied to the state."""
        self.progress_step = f"{outcome.action.replace('_', ' ')}: done"
        self.message = (f"✓ {self.busy_label_done}: done", "green")
        try:
            self.ensure_session().record(outcome.action, outcome.params, outcome.results, guide=req.guide)
        except UserError as e:  # results not JSON: still shown, reported
            self.say(f"step not recorded: {e}", "yellow")
        try:
            if outcome.result is not None:
                self.apply_result(outcome.action, outcome.params, outcome.result)
        except UserError as e:
            outcome.kind, outcome.error = "user", str(e)
            self.report_error(str(e))
        except Exception as e:  # noqa: BLE001
            outcome.kind = "bug"
            outcome.error = f"could not show the results of {outcome.action}: {type(e).__name__}: {e}"
            self.report_error(outcome.error)

    def _finished_failed(self, outcome: ActionOutcome, req: ActionRequest, expected: str | None) -> None:
        """A failure: a user error is recorded (a replay expects it again); the one a guided session
        recorded is shown as expected, any other reported."""
        what = outcome.action.replace("_", " ")
        self.progress_step = f"{what}: failed"
        self.message = (f"✗ {self.busy_label_done}: failed", "red")
        if outcome.kind == "user":
            try:
                self.ensure_session().record(outcome.action, outcome.params, error=outcome.error, guide=req.guide)
            except UserError:
                pass
        if outcome.kind == "user" and expected is not None and outcome.error == expected:
            self.progress_step = f"{what}: refused, as the session recorded"
            self.message = (f"✓ {self.busy_label_done}: refused, as the session recorded", "green")
            self.last_error, self.last_error_expected = outcome.error, True
            error = outcome.error
            self._hook(lambda s: s.show_error(error, True))
        else:
            self.report_error(outcome.error or "failed")

    def report_error(self, text: str) -> None:
        """The error panel above the status line (esc dismisses); no toast over the content."""
        self.last_error, self.last_error_expected = text, False
        self._hook(lambda s: s.show_error(text, False), report=False)

    def refresh_status(self) -> None:
        self._hook(lambda s: s.refresh_status())

    def refresh_screen(self) -> None:
        self._hook(lambda s: s.refresh_view())

    def _post(self, message: ActionMessage) -> None:
        """Tell the current screen about the running action (it handles `on_action_...`)."""
        scr = self.current
        if scr is not None and scr.is_mounted:
            scr.post_message(message)

    def _hook(self, call: Callable[[WorkbenchScreen], object], *, report: bool = True) -> None:
        """Call a hook of the current screen (a WorkbenchScreen method, so mypy checks the name and
        arguments); a display problem is reported in the UI, never a traceback screen."""
        scr = self.current
        if scr is None or not scr.is_mounted:
            return
        try:
            call(scr)
        except NoMatches:
            pass  # the screen is still being composed; it refreshes itself on resume
        except Exception as e:  # noqa: BLE001
            if report:
                self.report_error(f"could not update the {scr.SCREEN_NAME} screen: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ results -> state
    def apply_results(self, action: str, params: dict[str, Any], results: dict[str, Any]) -> None:
        """A recorded (JSON) result into the shared state: read into its type, then applied
        (each action's ActionSpec.apply); a running action's typed result goes through apply_result."""
        spec = REGISTRY.get(action)
        if spec is not None:
            spec.apply_json(self.state, params, results)

    def apply_result(self, action: str, params: dict[str, Any], result: Record) -> None:
        spec = REGISTRY.get(action)
        if spec is not None:
            spec.apply(self.state, params, result)


def make_workdir(workdir: str | None) -> Path:
    """The work folder: the one named, else a fresh artifacts/workbench-* folder (never reused silently)."""
    if workdir:
        p = Path(workdir).expanduser().resolve()
        if p.exists() and not p.is_dir():
            raise UserError(f"{p}: the work folder is not a folder")
        p.mkdir(parents=True, exist_ok=True)
        return p
    base = Path.cwd() / "artifacts"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="workbench-", dir=base)).resolve()
    except OSError:
        return Path(tempfile.mkdtemp(prefix="workbench-")).resolve()


def check_replay_workdir(wd: Path) -> None:
    """A replay needs a new or empty folder, in the TUI as headless (replay.replay applies the same rule)."""
    from .replay import require_empty_workdir

    require_empty_workdir(wd)


def check_terminal() -> None:
    """The TUI reads keys from stdin and draws on stdout: without a terminal on both it would write
    escape codes into a file or pipe and wait forever for keys that never come."""
    missing = [name for name, f in (("stdin", sys.stdin), ("stdout", sys.stdout)) if f is None or not f.isatty()]
    if missing:
        which = f"{missing[0]} is not one" if len(missing) == 1 else "neither stdin nor stdout is one"
        raise UserError(
            f"the workbench TUI needs a terminal, and {which}; in a script or CI use "
            "`workbench replay FILE --headless` or the `mcore` CLI"
        )


def run_app(tutorial: str | None = None, replay: str | None = None, workdir: str | None = None) -> int:
    """Entry point used by workbench/cli.py."""
    check_terminal()
    app = WorkbenchApp(tutorial=tutorial, replay=replay, workdir=workdir)
    app.run()
    return 0 if app.return_code in (None, 0) else int(app.return_code)
