"""Headless replay: re-execute a session's steps (registry.REGISTRY) in a fresh workdir and
compare the stable results (ActionSpec.stable_keys); every difference is reported with its
step and field.

A recorded error must recur as the same error (its text is compared). A gate's verdict is
compared with the recording (DESIGN.md contract 11): a changed verdict (REJECT -> PROMOTE,
PROMOTE -> INCONCLUSIVE, ...) is a difference; the same failing verdict again is "reproduced a
recorded failure", never PASS. The measurements behind a perf verdict are shown, not compared.

The headline's word and the exit code (`workbench replay --headless`):
    PASS        0  every step matched and every gate passed (PASS/PROMOTE)
    FAIL        1  a difference (a result, an error, a verdict), a gate that ran for the first
                   time (recorded without CUDA) and did not pass, or a replay that stopped early
    REPRODUCED  3  every step and verdict matched the recording, which holds a gate that did not
                   pass (FAIL/REJECT: a reproduced recorded failure; or INCONCLUSIVE again)
(2 is bad input.)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcore import NO_PROGRESS, Cancelled, Progress, UserError

from .actions import TRUST_FLAG, ActionContext
from .dispatch import check_step_paths
from .registry import GATES, PASSING, REGISTRY, verdict_of
from .session import Session, Step


@dataclass
class Difference:
    field: str
    expected: Any
    actual: Any


@dataclass
class StepOutcome:
    index: int  # 1-based step number
    action: str
    title: str
    recorded_status: str  # "ok" | "error"
    status: str  # what happened now: "ok" | "error"
    differences: list[Difference] = field(default_factory=list)
    compared: tuple[str, ...] = ()  # the stable fields compared
    results: dict[str, Any] | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def matched(self) -> bool:
        return not self.differences

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    @property
    def verdict(self) -> str:
        return "SKIP" if self.skipped else "OK" if self.matched else "DIFF"

    recorded_verdict: str | None = None  # the gate verdict the session recorded (None: not recorded)

    @property
    def gate_verdict(self) -> str | None:
        """A gate step's verdict now (PASS/FAIL/PROMOTE/REJECT/INCONCLUSIVE); None for other steps or errors."""
        if self.action not in GATES or self.status != "ok":
            return None
        return verdict_of(self.action, self.results)

    @property
    def gate(self) -> bool | None:
        """A gate step's verdict now as passed (True) or not (False); None for other steps or errors."""
        v = self.gate_verdict
        return None if v is None else v in PASSING

    @property
    def reproduced(self) -> bool:
        """The gate did not pass, and did the same in the recording (a reproduced recorded failure, or
        INCONCLUSIVE again)."""
        return self.gate is False and self.recorded_verdict == self.gate_verdict

    @property
    def failing(self) -> bool:
        """Differs from the recording (a changed verdict included), or a gate that had no recorded
        verdict (a step recorded without CUDA) did not pass."""
        return not self.matched or (self.gate is False and self.recorded_verdict is None)

    def gate_note(self) -> str:
        return verdict_note(self.index, self.action, self.recorded_verdict, self.gate_verdict)


def verdict_note(index: int, action: str, recorded: str | None, now: str | None) -> str:
    """What a replay's headline (and the TUI's summary) says about a gate step, "" when it passed as
    recorded: a changed verdict, a reproduced recorded failure, INCONCLUSIVE again, or a gate with
    no recorded verdict that did not pass."""
    if now is None or (now in PASSING and recorded in (None, now)):
        return ""
    if recorded is None:
        return f"step {index} {action} {now} (not recorded: it had to pass)"
    if recorded != now:
        return f"step {index} {action} verdict changed {recorded} -> {now}"
    if now == "INCONCLUSIVE":
        return f"step {index} {action} INCONCLUSIVE, as recorded"
    return f"step {index} {action} {now}: reproduced a recorded failure"


@dataclass
class ReplayReport:
    title: str
    session_path: Path | None
    workdir: Path
    outcomes: list[StepOutcome] = field(default_factory=list)
    total_steps: int = 0

    @property
    def ok(self) -> bool:
        """Every step ran and matched the recording, verdicts included (failing verdicts may be reproduced)."""
        return len(self.outcomes) == self.total_steps and not any(o.failing for o in self.outcomes)

    @property
    def reproduced_failures(self) -> list[StepOutcome]:
        return [o for o in self.outcomes if o.reproduced]

    @property
    def word(self) -> str:
        """PASS, FAIL or REPRODUCED (module docstring)."""
        if not self.ok:
            return "FAIL"
        return "REPRODUCED" if self.reproduced_failures else "PASS"

    @property
    def exit_code(self) -> int:
        return {"PASS": 0, "FAIL": 1, "REPRODUCED": EXIT_REPRODUCED}[self.word]

    @property
    def gates(self) -> list[StepOutcome]:
        return [o for o in self.outcomes if o.gate is not None]

    @property
    def differences(self) -> list[tuple[int, str, Difference]]:
        return [(o.index, o.action, d) for o in self.outcomes for d in o.differences]

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """(#, action, status, field, expected, actual): a row per differing field, else one OK row."""
        out = []
        for o in self.outcomes:
            if o.skipped:
                out.append((str(o.index), o.action, "SKIP", "requires", "", o.error or ""))
                continue
            if o.matched:
                if o.status == "error":
                    fieldname, actual = "error", o.error or ""
                elif o.gate_verdict is not None:  # the verdict compared: show it and its line
                    res = o.results or {}
                    note = (
                        ": reproduced a recorded failure" if o.reproduced and o.gate_verdict != "INCONCLUSIVE" else ""
                    )
                    line = str(res.get("line") or "")
                    out.append((str(o.index), o.action, "OK", "verdict", o.recorded_verdict or "", f"{line}{note}"))
                    continue
                elif o.compared:
                    fieldname, actual = ",".join(o.compared), ""
                else:  # nothing stable to compare: show what happened (a measurement, a build)
                    res = o.results or {}
                    fieldname = "(measured)" if "line" in res else "(not compared)"
                    actual = str(res.get("line") or res.get("variant") or "")
                out.append((str(o.index), o.action, "OK", fieldname, "", actual))
            for d in o.differences:
                out.append((str(o.index), o.action, "DIFF", d.field, show(d.expected), show(d.actual)))
        return out

    def render_table(self, width: int = 120) -> str:
        header = ("#", "action", "status", "field", "expected", "actual")
        rows = self.rows()
        w = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(4)]
        w = [min(x, cap) for x, cap in zip(w, (4, 16, 6, 36), strict=True)]
        fixed = sum(w) + 2 * 5
        rest = max(40, width - fixed)
        need_e = max([len("expected")] + [len(r[4]) for r in rows])
        need_a = max([len("actual")] + [len(r[5]) for r in rows])
        if need_e + 2 + need_a <= rest:
            ew = need_e
        else:  # share the room, but never squeeze one side below 20 while the other has slack
            ew = min(need_e, max(20, rest - 2 - need_a, (rest - 2) // 2))
        rest -= 2

        def line(r: tuple[str, ...]) -> str:
            cells = [clip(r[i], w[i]).ljust(w[i]) for i in range(4)]
            return "  ".join(cells + [clip(r[4], ew).ljust(ew), clip(r[5], max(8, rest - ew))]).rstrip()

        return "\n".join([line(header)] + [line(r) for r in rows])

    def summary(self) -> str:
        """The headline: its word (PASS/FAIL/REPRODUCED), steps matched, differences and gate verdicts."""
        matched = sum(o.matched for o in self.outcomes)
        ndiff = len(self.differences)
        done = len(self.outcomes)
        gates = self.gates
        passed = sum(1 for o in gates if o.gate)
        gate_text = f", gates {passed}/{len(gates)} passed" if gates else ""
        notes = [n for n in (o.gate_note() for o in gates) if n]
        if notes:
            gate_text += " (" + "; ".join(notes) + ")"
        tail = "" if done == self.total_steps else f", stopped after {done} of {self.total_steps}"
        skipped = sum(o.skipped for o in self.outcomes)
        if skipped:
            gate_text += f", {skipped} skipped (they need CUDA, which this machine lacks)"
            matched -= skipped
        return (
            f"{self.word}: {matched}/{self.total_steps - skipped} steps matched, {ndiff} difference(s){gate_text}{tail} "
            f"(session {self.title!r}, workdir {self.workdir})"
        )


def clip(text: str, width: int) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def show(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


def compare(name: str, expected: Any, actual: Any) -> list[Difference]:
    """Differences between two JSON values: dicts by key, lists by first differing index."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(expected) | set(actual), key=str):
            if k not in actual:
                out.append(Difference(f"{name}.{k}", expected[k], "(absent)"))
            elif k not in expected:
                out.append(Difference(f"{name}.{k}", "(absent)", actual[k]))
            else:
                out.extend(compare(f"{name}.{k}", expected[k], actual[k]))
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        # strict=False: lists of different lengths are a difference to report (below), not an error
        for i, (a, b) in enumerate(zip(expected, actual, strict=False)):
            if _norm(a) != _norm(b):
                sub = compare(f"{name}[{i}]", a, b)
                if len(expected) != len(actual):
                    sub.append(Difference(f"{name} (length)", len(expected), len(actual)))
                return sub
        if len(expected) != len(actual):
            return [Difference(f"{name} (length)", len(expected), len(actual))]
        return []
    if _norm(expected) != _norm(actual):
        return [Difference(name, expected, actual)]
    return []


def _norm(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def graph_note(step: Step, results: dict | None, header: dict | None) -> list[Difference]:
    """Why a recorded graph fingerprint differs, when it can be said: the torch that recorded the
    session against the one replaying it, and (for a capture) the op counts that changed. The
    fingerprint leaves tool versions out, so a difference here is a real graph difference."""
    from mcore import tool_versions

    out = []
    exp_ops, act_ops = step.results.get("ops"), (results or {}).get("ops")
    if isinstance(exp_ops, dict) and isinstance(act_ops, dict):
        for op in sorted(set(exp_ops) | set(act_ops)):
            if exp_ops.get(op, 0) != act_ops.get(op, 0):
                out.append(Difference(f"ops.{op}", exp_ops.get(op, 0), act_ops.get(op, 0)))
        graph_changed = bool(out) or any(step.results.get(k) != (results or {}).get(k) for k in ("nodes", "tensors"))
    else:  # a build records fingerprints only
        graph_changed = True
    recorded = ((header or {}).get("tool_versions") or {}).get("torch")
    now = tool_versions().get("torch")
    if graph_changed and recorded and now and recorded != now:
        out.insert(0, Difference("graph differs between torch versions", f"torch {recorded}", f"torch {now}"))
    return out


def built_here(session: Session, index: int, now: dict[int, dict | None]) -> dict[str, Any]:
    """Recorded keys of step `index` (0-based) whose expected value comes from this replay: a bound
    library an earlier step of this replay wrote (an export or a kernel build) is held to the sha256
    that step reported now, not to the recording's, since a compiled DSO's bytes depend on the machine
    (the CuTe DSL compiles for the GPU it sees, and a fresh checkout's export differed from the
    recording's on the same CPU). None: nothing to hold it to. `now`: earlier steps' results, by index."""
    step = session.steps[index]
    lib = step.params.get("library")
    if "library_sha256" not in REGISTRY[step.action].recorded_keys or lib is None:
        return {}
    for j in range(index - 1, -1, -1):
        earlier = session.steps[j]
        if lib in (earlier.params.get(k) for k in REGISTRY[earlier.action].output_params):
            return {"library_sha256": (now.get(j) or {}).get("library_sha256")}
    return {}


def compare_step(
    step: Step,
    status: str,
    results: dict | None,
    error: str | None,
    header: dict | None = None,
    expected: dict[str, Any] | None = None,
) -> list[Difference]:
    """Differences between a recorded step and what it did now; `header` (the session's) lets a
    fingerprint difference name the torch versions involved; `expected` (built_here) replaces
    recorded values of recorded keys (None: not compared)."""
    diffs = _compare_step(step, status, results, error, expected or {})
    if any(d.field.startswith("fingerprint") for d in diffs):
        diffs += graph_note(step, results, header)
    return diffs


def compare_in_session(
    session: Session, index: int, status: str, results: dict | None, error: str | None, now: dict[int, dict | None]
) -> list[Difference]:
    """compare_step for step `index` (0-based) of `session`, with what earlier steps returned `now`
    (by index): the one comparison the headless replay and the TUI guide both make."""
    step = session.steps[index]
    return compare_step(step, status, results, error, session.header, built_here(session, index, now))


def _compare_step(
    step: Step, status: str, results: dict | None, error: str | None, expected: dict[str, Any]
) -> list[Difference]:
    if step.status == "not_run":  # nothing recorded to compare with: it must run (its gate is checked apart)
        return (
            [Difference("status", f"ok (not recorded: {step.error})", f"error: {error}")] if status == "error" else []
        )
    if step.status == "error" or status == "error":
        if step.status != status:
            exp = "ok" if step.status == "ok" else f"error: {step.error}"
            act = "ok" if status == "ok" else f"error: {error}"
            return [Difference("status", exp, act)]
        return [] if step.error == error else [Difference("error", step.error, error)]
    out = []
    spec = REGISTRY[step.action]
    for key in spec.stable_keys + tuple(k for k in spec.recorded_keys if k in step.results):
        if key in expected:  # what this replay built, not the recording (built_here)
            if expected[key] is not None:
                out.extend(compare(key, expected[key], (results or {}).get(key, "(absent)")))
        elif key == "verdict":  # a recording older than recorded verdicts says it through `passed`
            out.extend(compare(key, verdict_of(step.action, step.results), verdict_of(step.action, results)))
        else:
            out.extend(compare(key, step.results.get(key, "(absent)"), (results or {}).get(key, "(absent)")))
    return out


def require_empty_workdir(wd: Path) -> None:
    """The one rule for where a replay may write (headless and TUI): a new or empty folder."""
    if wd.exists() and (not wd.is_dir() or any(wd.iterdir())):
        raise UserError(f"{wd}: replay workdir must be a new or empty folder (recorded steps write fresh files)")


def check_session(
    session: Session,
    workdir: Path,
    trust_libraries: Path | None = None,
    native_confirmed: bool = False,
    device: str | None = None,
) -> None:
    """Before any step runs: every path the session names stays inside `workdir`, and a step that
    would load native code has the user's say-so (a trusted library folder, or the TUI's prompt);
    a step this machine skips (it needs CUDA) loads nothing."""
    name = str(session.path) if session.path is not None else "session"
    for i, step in enumerate(session.steps, 1):
        where = f"{name}: step {i} ({step.action})"
        check_step_paths(step.action, step.params, workdir, where)
        if step.requires == "cuda" and not cuda_here(device):
            continue
        field_ = REGISTRY[step.action].trust_needed(step.params)
        if field_ and trust_libraries is None and not native_confirmed:
            what = "loads native code" if field_ == REGISTRY[step.action].native_param else "runs a script"
            raise UserError(
                f"{where} {what} through field {field_} ({step.params[field_]}); "
                f"pass {TRUST_FLAG} DIR naming the folder (inside the workdir, e.g. `.`) "
                f"whose libraries and scripts you trust"
            )


def trusted_folder(workdir: Path, trust_libraries: str | os.PathLike | None) -> Path | None:
    """--trust-libraries DIR: relative to the workdir (a session's libraries can only live there)."""
    if trust_libraries is None:
        return None
    p = Path(trust_libraries).expanduser()
    p = (p if p.is_absolute() else Path(workdir) / p).resolve()
    root = Path(workdir).resolve()
    if p != root and root not in p.parents:
        raise UserError(
            f"{TRUST_FLAG} {trust_libraries}: folder {p} is outside the replay workdir {root}, where "
            f"every library a session loads lives; name a folder inside it (e.g. `.`)"
        )
    return p


EXIT_REPRODUCED = 3


def cuda_here(device: str | None) -> bool:
    """Whether a step that requires CUDA can run here (with `device` as the replay forces it)."""
    if device is not None and not str(device).startswith("cuda"):
        return False
    import torch

    return torch.cuda.is_available()


SKIP_NOTE = "needs CUDA; skipped on this machine"

OnStep = Callable[[int, Step, StepOutcome | None], None]


def replay(
    session_path: str | os.PathLike | Session,
    workdir: str | os.PathLike,
    progress: Progress | None = None,
    on_step: OnStep | None = None,
    *,
    log: Callable[[str], None] | None = None,
    on_sample: Callable[[str, int, float], None] | None = None,
    device: str | None = None,
    require_empty: bool = True,
    keep_going: bool = False,
    trust_libraries: str | os.PathLike | None = None,
) -> ReplayReport:
    """Re-execute the steps of a session in `workdir` and compare stable results.

    Stops after the first failing step (a difference, a changed gate verdict included) unless
    `keep_going`: later steps build on it, and a perf gate takes a minute.

    `on_step(index, step, None)` is called before a step runs and `on_step(index, step, outcome)`
    after it (index is 1-based). Bad input (unreadable/invalid session, a non-empty workdir when
    `require_empty`, a path outside the workdir, a step that loads native code without
    `trust_libraries`) raises UserError; cancellation through `progress` raises Cancelled.

    The session is someone else's data: its paths are confined to the workdir and its steps load
    DSOs only from `trust_libraries` (a folder inside the workdir, relative to it).
    """
    session = session_path if isinstance(session_path, Session) else Session.load(session_path)
    wd = Path(workdir).expanduser()
    if require_empty:
        require_empty_workdir(wd)
    trusted = trusted_folder(wd, trust_libraries)
    check_session(session, wd, trusted, device=device)
    prog = progress or NO_PROGRESS
    report = ReplayReport(session.title, session.path, wd, total_steps=len(session.steps))
    runner = _StepRunner(session, wd, trusted, prog, log, on_sample, device)
    for i, step in enumerate(session.steps, 1):
        prog.check()
        if on_step is not None:
            on_step(i, step, None)
        if step.requires == "cuda" and not cuda_here(device):
            outcome = _skipped(i, step)
        else:
            outcome = runner.run(i, step, report)
        report.outcomes.append(outcome)
        if on_step is not None:
            on_step(i, step, outcome)
        if outcome.failing and not keep_going:
            break
    prog.report("replay finished", 1.0)
    return report


def _skipped(i: int, step: Step) -> StepOutcome:
    """A step this machine cannot run (it needs CUDA): reported, never failing the replay."""
    return StepOutcome(
        index=i, action=step.action, title=step.title, recorded_status=step.status, status="skipped", error=SKIP_NOTE
    )


@dataclass(frozen=True)
class _StepRunner:
    """Runs one recorded step as the session's (confined) params say, and compares what it did."""

    session: Session
    workdir: Path
    trusted: Path | None
    progress: Progress
    log: Callable[[str], None] | None
    on_sample: Callable[[str, int, float], None] | None
    device: str | None

    def context(self, i: int, step: Step) -> ActionContext:
        n = len(self.session.steps)
        prog = self.progress

        def step_report(s: str, f: float) -> None:
            prog.report(f"step {i}/{n} {step.action}: {s}", (i - 1 + f) / n)

        return ActionContext(
            workdir=self.workdir,
            progress=Progress(step_report, prog.token),
            on_sample=self.on_sample,
            log=self.log,
            device=self.device,
            confined=True,
            where=f"step {i} ({step.action}): ",
            trusted_libraries=self.trusted,
        )

    def run(self, i: int, step: Step, report: ReplayReport) -> StepOutcome:
        ctx = self.context(i, step)
        report.workdir = ctx.workdir
        t0 = time.perf_counter()
        results: dict | None = None
        error: str | None = None
        try:
            results = json.loads(json.dumps(REGISTRY[step.action].fn(ctx, **step.params).to_dict(), default=str))
            status = "ok"
        except (Cancelled, KeyboardInterrupt):
            raise
        except UserError as e:
            status, error = "error", ctx.error_text(e)
        except Exception as e:  # noqa: BLE001 - a bug must show as a difference, not kill the report
            status, error = "error", ctx.error_text(Exception(f"internal error: {type(e).__name__}: {e}"))
        outcome = StepOutcome(
            index=i,
            action=step.action,
            title=step.title,
            recorded_status=step.status,
            status=status,
            differences=compare_in_session(
                self.session, i - 1, status, results, error, {o.index - 1: o.results for o in report.outcomes}
            ),
            compared=REGISTRY[step.action].stable_keys if status == "ok" and step.status == "ok" else (),
            results=results,
            error=error,
            seconds=time.perf_counter() - t0,
        )
        if step.status == "ok":
            outcome.recorded_verdict = verdict_of(step.action, step.results)
        return outcome
