"""Build screen: the native and the slot-ready bundle (build_bundle), each with its own progress
bar and current step; work runs in a thread worker and `x` cancels it (nothing half-written)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import ProgressBar, RichLog, Static

from ..messages import ActionDone, ActionLog, ActionProgress, ActionStarted
from ..registry import bundle_arm
from ..results import KernelSlotRow
from .base import WorkbenchScreen, on_action

ARMS = ("native", "slot")
ARM_TITLES = {"native": "native bundle (no slot)", "slot": "slot-ready bundle (your region as a kernel slot)"}


arm_of = bundle_arm  # "native" or "slot": the one rule (workbench/registry.py)


def slot_lines(kernel_slots: Iterable[KernelSlotRow]) -> list[str]:
    """One line per binding: a binding that serves several slots (one per layer) says how many."""
    groups: dict[tuple[str, str], int] = {}  # one manifest entry binds each (binding ID, ABI) group
    for s in kernel_slots:
        key = (s.binding_id, s.abi_sha256)
        groups[key] = groups.get(key, 0) + 1
    return [
        f"slot {bid} abi {abi[:16]}…" + (f" ×{n} slots, one binding" if n > 1 else "")
        for (bid, abi), n in groups.items()
    ]


class BuildScreen(WorkbenchScreen):
    SCREEN_NAME = "build"
    BINDINGS = [
        Binding("b", "build('native')", "build native"),
        Binding("s", "build('slot')", "build slot-ready"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.running: str | None = None
        self.step_text: dict[str, str] = {arm: "" for arm in ARMS}

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="build-args", classes="section")
        for arm in ARMS:
            with Vertical(classes="build-arm", id=f"arm-{arm}"):
                yield Static("", id=f"title-{arm}", classes="arm-title")
                yield ProgressBar(total=100, show_eta=False, id=f"bar-{arm}")
                yield Static("", id=f"info-{arm}", classes="arm-info")
        yield RichLog(id="build-log", wrap=True, markup=False, min_width=20, max_lines=300)

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_view()

    # ------------------------------------------------------------------ state -> widgets
    def slot_source(self) -> dict[str, Any] | None:
        """recipe or graph_patch for the slot-ready build, from the saved receipt."""
        st = self.state
        rec = st.receipt
        if rec is None or st.receipt_path is None:
            return None
        if rec.recipe:
            return {"recipe": [rec.recipe.id, rec.recipe.instance]}
        return {"graph_patch": st.receipt_path}

    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        st = self.state
        a = st.build_args
        shown = {k: v for k, v in a.items() if v not in (None, "") and k != "seed"}
        self.query_one("#build-args", Static).update(
            Text("build args: " + "  ".join(f"{k}={v}" for k, v in shown.items()), style="dim")
        )
        for arm in ARMS:
            self.show_arm(arm)

    def show_arm(self, arm: str) -> None:
        st = self.state
        key = "b" if arm == "native" else "s"
        title = Text()
        title.append(f" {key} ", style="bold reverse")
        title.append(f" {ARM_TITLES[arm]}", style="bold")
        self.query_one(f"#title-{arm}", Static).update(title)
        bar = self.query_one(f"#bar-{arm}", ProgressBar)
        info = Text()
        res = st.bundles.get(arm)
        busy_here = self.wb.busy == "build_bundle" and self.running == arm
        if busy_here:
            info.append(self.step_text.get(arm) or "starting", style="yellow")
            info.append("  (x cancels)", style="dim")
        elif res is not None:
            bar.update(progress=100)
            info.append("✓ ", style="green")
            info.append(f"{st.show_path(res.result.bundle)}")
            for role, fp in res.result.fingerprints.items():
                info.append(f"\n  {role} {fp[:16]}…", style="dim")
            for line in slot_lines(res.result.kernel_slots):
                info.append("\n  " + line, style="magenta")
        else:
            if self.step_text.get(arm):
                info.append(self.step_text[arm], style="red")
            elif arm == "slot":
                src = self.slot_source()
                if src is None:
                    info.append("needs a receipt: select a region (F3) first", style="dim")
                elif "recipe" in src:
                    info.append(f"from recipe {src['recipe'][0]} {src['recipe'][1]}", style="dim")
                else:
                    info.append(f"from receipt {st.show_path(src['graph_patch'])} (graph patch)", style="dim")
            else:
                info.append("same build args, no slot: the reference for the gates", style="dim")
        self.query_one(f"#info-{arm}", Static).update(info)

    @on_action
    def on_action_started(self, message: ActionStarted) -> None:
        if message.action == "build_bundle":
            arm = arm_of(message.params)
            self.running = arm
            self.step_text[arm] = ""
            self.query_one(f"#bar-{arm}", ProgressBar).update(progress=0)
            self.show_arm(arm)

    @on_action
    def on_action_progress(self, message: ActionProgress) -> None:
        if message.action != "build_bundle" or self.running is None:
            return
        arm = self.running
        self.step_text[arm] = message.step
        self.query_one(f"#bar-{arm}", ProgressBar).update(progress=round(message.fraction * 100))
        self.show_arm(arm)

    @on_action
    def on_action_done(self, message: ActionDone) -> None:
        outcome = message.outcome
        if outcome.action != "build_bundle":
            return
        arm = arm_of(outcome.params)
        if outcome.kind == "ok":
            self.step_text[arm] = ""
        else:
            self.step_text[arm] = (
                "cancelled: nothing was written" if outcome.kind == "cancelled" else f"failed: {outcome.error}"
            )
            self.query_one(f"#bar-{arm}", ProgressBar).update(progress=0)
        self.running = None
        self.show_arm(arm)

    @on_action
    def on_action_log(self, message: ActionLog) -> None:
        self.query_one("#build-log", RichLog).write(message.line)

    # ------------------------------------------------------------------ actions
    def action_build(self, arm: str) -> None:
        st = self.state
        if not st.build_args.get("model"):
            self.wb.report_error("no model chosen: pick one on the Model screen (F1)")
            return
        params: dict[str, Any] = {"build_args": dict(st.build_args)}
        if arm == "slot":
            src = self.slot_source()
            if src is None:
                self.wb.report_error("no receipt yet: pick a recipe or mark nodes and save on the Region screen (F3)")
                return
            params.update(src)
            params["output"] = "slot-ready.bundle"
        else:
            params["output"] = "native.bundle"
        if st.device:
            params["device"] = st.device
        self.start(arm, params)

    def start(self, arm: str, params: dict[str, Any]) -> None:
        self.wb.perform("build_bundle", params, label=f"build {arm} bundle")
