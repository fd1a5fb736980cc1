"""Guided mode: the side panel that explains each step of a shipped (or opened) session, and
the state of stepping through it (tutorial: perform each step; replay: also compare)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

if TYPE_CHECKING:  # pragma: no cover
    from ..session import Step


def stable_fields(action: str) -> tuple[str, ...]:
    from ..registry import REGISTRY

    spec = REGISTRY.get(action)
    return spec.stable_keys if spec is not None else ()


def shown_fields(action: str) -> tuple[str, ...]:
    """What the panel shows of a step's results, in order (ActionSpec.shown)."""
    from ..registry import REGISTRY

    spec = REGISTRY.get(action)
    return spec.shown if spec is not None else ()


def short(value: Any, width: int = 60) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:16] + "…"
    if isinstance(value, float):
        s = f"{value:.6g}"
    elif isinstance(value, dict):
        s = ", ".join(f"{k}={short(v, 24)}" for k, v in value.items())
    elif isinstance(value, list):
        if value and all(isinstance(v, (int, float)) for v in value):
            head = " ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value[:8])
            s = f"{len(value)}: {head}{' …' if len(value) > 8 else ''}"
        else:
            s = "[" + ", ".join(short(v, 30) for v in value[:4]) + (", …" if len(value) > 4 else "") + "]"
    else:
        s = str(value)
    s = s.replace("\n", "⏎")
    return s if len(s) <= width else s[: width - 1].rstrip(" …") + "…"


def result_lines(key: str, value: Any) -> list[tuple[str, str]]:
    """(label, text) rows for one result: dicts by key, lists of slots one per row."""
    if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
        return [(f"{key} {k}", short(v, 30)) for k, v in value.items()]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        rows = []
        for v in value[:4]:
            rows.append((key.rstrip("s"), " ".join(short(x, 30) for x in v.values())))
        return rows
    if isinstance(value, bool):
        return [(key, "yes" if value else "no")]
    return [(key, short(value, 40))]


SKIP_GLYPH = "–"  # a step this machine cannot run (it needs CUDA): neither done nor matched
SKIP_MEANING = "needs CUDA, which this machine lacks"
# the marks of the replay's step list, explained under it
STEP_LEGEND = f"✓ matched · ≠ differs · {SKIP_GLYPH} skipped ({SKIP_MEANING}) · ▸ next · · not run yet"


@dataclass
class StepOutcome:
    results: dict[str, Any] | None
    error: str | None
    kind: str  # ok | user | cancelled | bug | skipped (needs CUDA, which this machine lacks)
    diffs: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def matched(self) -> bool:
        return not self.diffs


@dataclass
class GuideState:
    session: Any  # workbench.session.Session
    mode: str = "tutorial"  # tutorial | replay
    source: Path | None = None
    index: int = 0
    outcomes: dict[int, StepOutcome] = field(default_factory=dict)

    @property
    def current_step(self):
        steps = self.session.steps
        return steps[self.index] if self.index < len(steps) else None

    @property
    def done(self) -> bool:
        return self.index >= len(self.session.steps)

    def finish(self, index: int, results: dict[str, Any] | None, error: str | None, kind: str) -> StepOutcome:
        """Record what step `index` did now; compare it with the recording (replay.compare_in_session)."""
        from ..replay import compare_in_session

        step = self.session.steps[index]
        diffs: list[tuple[str, Any, Any]] = []
        if kind in ("ok", "user"):
            status = "ok" if kind == "ok" else "error"
            diffs = [
                (d.field, d.expected, d.actual)
                for d in compare_in_session(
                    self.session, index, status, results, error, {j: o.results for j, o in self.outcomes.items()}
                )
            ]
        elif kind == "bug":
            diffs = [("status", "ok" if step.status == "ok" else f"error: {step.error}", f"error: {error}")]
        out = StepOutcome(results, error, kind, diffs)
        self.outcomes[index] = out
        # a tutorial advances when the step ran as recorded (an expected error counts), never on a
        # new failure, so the user can fix the cause and press n again; a replay reports every
        # step, so it moves on after anything but a cancel
        if self.mode == "replay":
            advance = kind != "cancelled"
        else:
            advance = kind in ("ok", "skipped") or (kind == "user" and step.status == "error")
        if advance and index == self.index:
            self.index += 1
        return out

    @property
    def mismatches(self) -> int:
        return sum(1 for o in self.outcomes.values() if o.diffs)

    @property
    def skipped(self) -> int:
        return sum(1 for o in self.outcomes.values() if o.kind == "skipped")

    def finished_text(self) -> str:
        """How a finished session went, counted honestly (one text for the step bar, panel and summary):
        a skipped step is neither done nor matched."""
        n, skipped = len(self.session.steps), self.skipped
        ran = n - skipped
        if self.mode == "replay":
            head = f"{ran - self.mismatches}/{n} steps matched the recording"
        else:
            head = f"all {n} steps done" if not skipped else f"{ran} of {n} steps done"
        return head + (f", {skipped} skipped ({SKIP_GLYPH} {SKIP_MEANING})" if skipped else "")


class GuidePanel(VerticalScroll):
    """The side panel: current step's title and text, the last step's real results."""

    can_focus = False

    def compose(self):
        yield Static("", id="guide-text")

    def show_guide(self, g: GuideState | None) -> None:
        """The panel's text, in phases: the header, the last step's outcome, the current step (or the
        end of the session) and, on replay, the list of steps."""
        if g is None:
            self.display = False
            return
        self.display = True
        t = Text()
        t.append("TUTORIAL" if g.mode == "tutorial" else "REPLAY", style="bold reverse")
        t.append(f" {g.session.title}\n", style="bold")
        # the most recent outcome (possibly a failed current step)
        shown = g.index if g.index in g.outcomes else g.index - 1
        if shown >= 0 and shown in g.outcomes:
            _append_outcome(t, g, shown)
        step = g.current_step
        if step is None:
            _append_finished(t, g)
        else:
            _append_current(t, g, step)
        if g.mode == "replay":
            _append_step_list(t, g)
        self.query_one("#guide-text", Static).update(t)


def _append_outcome(t: Text, g: GuideState, shown: int) -> None:
    """How step `shown` went: its mark and title, then its results, its skip or error, and (replay)
    expected vs actual."""
    o, st = g.outcomes[shown], g.session.steps[shown]
    ran = o.kind == "ok" or (o.kind == "user" and st.status == "error" and not o.diffs)
    ok = ran and not (g.mode == "replay" and o.diffs)
    mark = SKIP_GLYPH if o.kind == "skipped" else "✓" if ok else ("≠" if ran else "✗")
    t.append(
        f"\n{mark} step {shown + 1}: {st.title}\n",
        style="yellow" if o.kind == "skipped" else "green" if ok else "red",
    )
    if o.kind == "skipped":
        t.append(f"  {SKIP_GLYPH} skipped: {o.error}\n", style="yellow")
    elif o.kind == "ok" and (g.mode == "tutorial" or not stable_fields(st.action)):
        got = o.results or {}
        for k in shown_fields(st.action):
            if k in got:
                for label, value in result_lines(k, got[k]):
                    t.append(f"  {label}: ", style="dim")
                    t.append(value + "\n")
    elif o.error:
        t.append(f"  {o.error}\n", style="red")
    if g.mode == "replay" and o.kind not in ("cancelled", "skipped"):
        _append_expected_vs_actual(t, st, o)
    elif o.diffs and o.kind == "ok":
        t.append("  differs from the recording: " + ", ".join(k for k, _, _ in o.diffs) + "\n", style="yellow")


def _append_expected_vs_actual(t: Text, st: Step, o: StepOutcome) -> None:
    """Replay: each compared field the same (=) or differing (≠, with both values)."""
    t.append("  expected vs actual:\n", style="bold")
    differing = {k.split(".")[0].split("[")[0].split(" ")[0] for k, _, _ in o.diffs}
    if st.status == "error" and "error" not in differing and "status" not in differing:
        t.append(f"  = error: {short(st.error, 40)}\n", style="green")
    for k in stable_fields(st.action) if st.status == "ok" and o.kind == "ok" else ():
        if k not in differing:
            t.append(f"  = {k}: {short(st.results.get(k), 40)}\n", style="green")
    for k, exp, act in o.diffs:
        t.append(f"  ≠ {k}\n", style="bold red")
        t.append(f"    expected {short(exp, 34)}\n")
        t.append(f"    actual   {short(act, 34)}\n")
    if not o.diffs and not stable_fields(st.action) and st.status == "ok":
        t.append("  (measured: shown, not compared)\n", style="dim")


def _append_finished(t: Text, g: GuideState) -> None:
    """Every step done: how it went, and what the user can do next."""
    t.append(f"\nAll {len(g.session.steps)} steps done.", style="bold")
    if g.skipped:
        t.append(f"\n{g.finished_text()}.", style="yellow")
    if g.mode == "replay":
        n = g.mismatches
        t.append(f"\n{n} step(s) differ." if n else "\nEvery step matched.", style="red" if n else "green")
    t.append("\n\npress ", style="dim")
    t.append("n", style="bold reverse")
    t.append(" for the summary (what was built, the verdicts), ", style="dim")
    t.append("ctrl+s", style="bold reverse")
    t.append(" to save the session; `workbench replay FILE` replays it\n", style="dim")


def _append_current(t: Text, g: GuideState, step: Step) -> None:
    """The step `n` performs next: its title and text (and, on replay, what it should give)."""
    t.append(f"\nstep {g.index + 1} of {len(g.session.steps)}: ", style="bold")
    t.append(f"{step.title}\n", style="bold")
    text = (step.guide or {}).get("text") or f"Perform {step.action}."
    t.append(text + "\n")
    if g.mode == "replay" and step.results:
        t.append("expected:\n", style="dim")
        for k in stable_fields(step.action)[:4]:
            if k in step.results:
                t.append(f"  {k}: {short(step.results[k], 30)}\n", style="dim")
    t.append("\npress ", style="dim")
    t.append("n", style="bold reverse")
    t.append(" to perform this step", style="dim")


def _append_step_list(t: Text, g: GuideState) -> None:
    """Replay: every step with its mark (· to come, ▸ next, ✓ matched, ≠ differs, skipped)."""
    t.append("\n\nsteps\n", style="bold")
    for i, st in enumerate(g.session.steps):
        oc = g.outcomes.get(i)
        mark, style = (
            ("·", "dim")
            if oc is None
            else (SKIP_GLYPH, "yellow")
            if oc.kind == "skipped"
            else (("✓", "green") if not oc.diffs and oc.kind != "cancelled" else ("≠", "red"))
        )
        if i == g.index:
            mark, style = "▸", "bold"
        t.append(f" {mark} {i + 1:>2} {st.action}\n", style=style)
    t.append(STEP_LEGEND, style="dim")
