"""Verify screen: the correctness gate (decoders: generate native + external, gate_tokens;
encoders: embed both, gate_embeddings), the performance gate (the CLI's `mcore verify perf`: the
same action, options and defaults) with a live plot of every pair for native vs external
(gate_perf streams samples) and of each pair's ratio with the gate's interval and threshold, and
the verdict: PROMOTE only when both gates pass, REJECT when one fails, INCONCLUSIVE when the perf
gate cannot tell. `r` checks the native bundle against transformers (verify_reference) and `h`
toggles the checkpoint's chat template for generation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Input, Label, Static

from mcore import PERF_DEFAULTS, EmbeddingsGate

from ..messages import ActionSample, ActionStarted
from ..outputs import fresh_name
from ..results import Correctness, EmbeddingsGated, Gated, Generated, Interval, PerfGated
from ..state import Applied, LastPrompt
from ..widgets.plot import VERDICT_STYLE, ErrorPlot, ThroughputPlot
from .base import WorkbenchScreen, on_action

if TYPE_CHECKING:  # pragma: no cover
    from ..state import WorkbenchState

DEFAULT_PROMPT = "Explain grouped-query attention, KV caching, and decode latency."
DEFAULT_ENCODER_PROMPT = "The quick brown fox jumps over the lazy dog."
# auto: a pair at a time until the interval decides (the CLI's --pairs auto, its --max-pairs)
DEFAULT_PAIRS = "auto"
# the first run of each arm pays cold caches (page cache, allocator, compiled kernels): it runs
# as a warm-up pair that is measured by nobody, so what is counted is what would run in service
WARMUP_PAIRS = 1


def embedding_errors(state: WorkbenchState, correctness: Applied[Correctness]) -> list[float] | None:
    """Per-element |native - external| of the two embedding files the gate compared (None if unreadable or of
    different lengths: the gate fails those, and a truncated plot would hide why)."""
    import json

    params = correctness.params
    try:
        a = json.loads(state.path(params["native"]).read_text(encoding="utf-8"))["embedding"]
        b = json.loads(state.path(params["external"]).read_text(encoding="utf-8"))["embedding"]
        return [abs(float(x) - float(y)) for x, y in zip(a, b, strict=True)]
    except (KeyError, OSError, ValueError, TypeError):
        return None


def guided_perf_params(guide) -> dict[str, Any] | None:
    """The perf gate step's params of a guided session (what will really run), if it has one."""
    if guide is None:
        return None
    step = next((s for s in guide.session.steps if s.action == "gate_perf"), None)
    return dict(step.params) if step is not None else None


def verdict(correctness: Applied[Correctness] | None, perf: Applied[PerfGated] | None) -> tuple[str, str]:
    """("PROMOTE" | "REJECT" | "INCONCLUSIVE" | "PENDING", reason). PROMOTE only when both gates
    passed; INCONCLUSIVE when correctness passed but the perf gate's interval straddles its threshold."""
    if correctness is not None and not correctness.result.passed:
        return "REJECT", f"correctness gate failed: {_one_line(correctness.result.line)}"
    word = perf.result.word if perf is not None else None
    if word in ("REJECT", "FAIL"):
        assert perf is not None
        iv = _interval_text(perf.result)
        if iv and word == "REJECT":
            return "REJECT", f"performance: {iv} is below {_min_ratio(perf):g}"
        return "REJECT", f"performance gate failed: {_one_line(perf.result.line)}"
    missing = [name for name, r in (("correctness (c)", correctness), ("performance (p)", perf)) if r is None]
    if missing:
        return "PENDING", "run the " + " and ".join(missing) + " gate" + ("s" if len(missing) > 1 else "")
    assert perf is not None
    if word == "INCONCLUSIVE":
        return "INCONCLUSIVE", f"cannot tell: the interval straddles {_min_ratio(perf):g} (correctness passed)"
    ratio = perf.result.ratio
    tail = f"; ratio {ratio:.4f}" if isinstance(ratio, (int, float)) else ""
    return "PROMOTE", f"correctness and performance gates passed{tail}"


def _interval_text(perf: PerfGated) -> str:
    iv = perf.interval
    if iv is None:
        return ""
    return f"{iv.confidence * 100:.4g}% interval [{iv.low:.4f}, {iv.high:.4f}]"


def _append_decided(t: Text, perf: Applied[PerfGated], iv: Interval) -> None:
    """A decided perf gate in two rows (80 columns): the verdict with its ratio, interval, pairs and
    metric, then the rule that turned the interval into the verdict."""
    r = perf.result
    word = r.word
    conf = f"{iv.confidence * 100:.4g}%"
    t.append(f"{word}", style=VERDICT_STYLE.get(word, "bold"))
    n = r.pair_count
    t.append(f" ratio {r.ratio:.4f}" if isinstance(r.ratio, (int, float)) else "")
    t.append(f" · {conf} [{iv.low:.4f}, {iv.high:.4f}] · {n} pairs")  # the metric: the plot's unit
    mr = _min_ratio(perf)
    t.append(f"\n rule: PROMOTE if the {conf} interval ≥ {mr:g} · REJECT if below · else INCONCLUSIVE", style="dim")


def _min_ratio(perf: Applied[PerfGated]) -> float:
    return float(perf.result.min_ratio or perf.params.get("min_ratio") or PERF_DEFAULTS.min_ratio)


def _append_gate(t: Text, result: Gated) -> None:
    """A gate's verdict word, then its line without the repeated prefix."""
    line = _one_line(result.line)
    word, _, rest = line.partition(": ")
    if word not in ("PASS", "FAIL", "PROMOTE", "REJECT", "INCONCLUSIVE"):
        word, rest = ("PASS" if result.passed else "FAIL"), line
    style = {"PASS": "bold green", "FAIL": "bold red"}.get(word) or VERDICT_STYLE[word]
    t.append(f"{word} ", style=style)
    t.append(rest)


Steps = list[tuple[str, dict[str, Any]]]


def _arm_outputs(st: WorkbenchState, ext: str) -> tuple[str, str, str, str]:
    """The two bundles and two fresh output names (a second run of the gate replaces nothing:
    workbench/outputs.py)."""
    native, slot = st.bundles["native"].result.bundle, st.bundles["slot"].result.bundle
    return native, slot, fresh_name(st, f"native.{ext}"), fresh_name(st, f"external.{ext}")


def decoder_correctness_steps(st: WorkbenchState, prompt: str, n: int) -> Steps:
    """Generate on both arms, compare the tokens, and step both in lockstep for the logits."""
    native, slot, a_out, b_out = _arm_outputs(st, "jsonl")
    chat = {"chat": True} if st.chat else {}
    run = {"prompt": prompt, "max_new_tokens": n}
    external = {"kernel_bindings": st.manifest}
    return [
        ("generate", {"bundle": native, **run, "output": a_out, **chat}),
        ("generate", {"bundle": slot, **external, **run, "output": b_out, **chat}),
        ("gate_tokens", {"native": a_out, "external": b_out}),
        # how far the logits drift per step, and where the greedy picks first part
        ("gate_logits", {"native_bundle": native, "external_bundle": slot, **external, **run, **chat}),
    ]


def encoder_correctness_steps(st: WorkbenchState, prompt: str) -> Steps:
    """Embed on both arms, then the numerical gate at its default thresholds."""
    native, slot, a_out, b_out = _arm_outputs(st, "json")
    limits = {"max_abs": EmbeddingsGate.max_abs, "min_cosine": EmbeddingsGate.min_cosine}
    return [
        ("embed", {"bundle": native, "prompt": prompt, "output": a_out}),
        ("embed", {"bundle": slot, "kernel_bindings": st.manifest, "prompt": prompt, "output": b_out}),
        ("gate_embeddings", {"native": a_out, "external": b_out, **limits}),
    ]


class VerifyScreen(WorkbenchScreen):
    SCREEN_NAME = "verify"
    BINDINGS = [
        Binding("c", "correctness", "correctness"),
        Binding("p", "perf", "performance"),
        Binding("v", "both", "both gates"),
        Binding("r", "reference", "vs transformers"),
        Binding("h", "chat", "chat template"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._prompt_kind: str | None = None
        self._synced: LastPrompt | None = None
        self._pairs_synced: tuple | None = None
        self._errors_for: int | None = None
        self.warmup = WARMUP_PAIRS

    def compose_body(self) -> Iterable[Widget]:
        with Horizontal(classes="form-row"):
            yield Label("prompt", classes="lbl lbl-tight")
            yield Input(DEFAULT_PROMPT, id="prompt", compact=True)
        with Horizontal(classes="form-row"):
            yield Label("tokens", classes="lbl lbl-tight")
            yield Input("16", id="max-new-tokens", compact=True)
            yield Label("pairs", classes="lbl lbl-tight")
            yield Input(str(DEFAULT_PAIRS), id="pairs", compact=True)  # kept as typed; _pairs() says what is wrong
            yield Static("", id="pairs-note")
        yield Static("", id="correctness")
        with Horizontal(id="plots"):
            yield ErrorPlot(id="error-plot")
            yield ThroughputPlot(id="plot")
        yield Static("", id="perf-line")
        yield Static("", id="verdict")

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_view()

    @on_action
    def on_action_sample(self, message: ActionSample) -> None:
        if self.is_mounted:
            self.query_one(ThroughputPlot).redraw()

    # ------------------------------------------------------------------ state -> widgets
    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        st = self.state
        dec = st.is_decoder
        kind = "decoder" if dec else "encoder"
        p = self.query_one("#prompt", Input)
        if self._prompt_kind != kind:
            self._prompt_kind = kind
            if p.value in (DEFAULT_PROMPT, DEFAULT_ENCODER_PROMPT, ""):
                p.value = DEFAULT_PROMPT if dec else DEFAULT_ENCODER_PROMPT
        if st.last_prompt and st.last_prompt != self._synced:
            # a step ran (guided or typed): show the prompt and token count it used
            self._synced = st.last_prompt
            p.value = st.last_prompt.prompt or p.value
            if st.last_prompt.max_new_tokens:
                self.query_one("#max-new-tokens", Input).value = str(st.last_prompt.max_new_tokens)
        self.query_one("#max-new-tokens", Input).disabled = not dec
        self.sync_pairs()
        self.show_plot()
        self.show_error_plot()
        self.show_correctness()
        self.show_perf()
        self.show_verdict()

    def show_plot(self) -> None:
        st, plot = self.state, self.query_one(ThroughputPlot)
        perf = st.perf
        plot.unit = (perf.result.unit if perf else None) or ("tokens/s" if st.is_decoder else "embeddings/s")
        plot.series = st.samples
        plot.min_ratio = _min_ratio(perf) if perf else PERF_DEFAULTS.min_ratio
        iv = perf.result.interval if perf else None
        plot.interval = (iv.low, iv.high, iv.confidence) if iv is not None else None
        plot.verdict = perf.result.word if perf else ""
        pairs = self.query_one("#pairs", Input).value or "?"
        plot.note = (
            f"pairs auto: a pair at a time from pair {PERF_DEFAULTS.first_check} until the interval decides "
            f"(at most {PERF_DEFAULTS.max_pairs}), after {self.warmup} warm-up"
            if pairs == "auto"
            else f"{pairs} measured pair(s) after {self.warmup} warm-up"
        )
        plot.redraw()

    def sync_pairs(self) -> None:
        """Show the pair count that runs: the last gate's, else the guided step's, else the default."""
        st = self.state
        src = st.perf.params if st.perf else guided_perf_params(self.wb.guide)
        key = (id(st.perf), id(self.wb.guide))
        if src and key != self._pairs_synced:
            self._pairs_synced = key
            if isinstance(src.get("pairs"), int) or src.get("pairs") == "auto":
                self.query_one("#pairs", Input).value = str(src["pairs"])
            if isinstance(src.get("warmup"), int):
                self.warmup = src["warmup"]
        w = self.warmup
        self.query_one("#pairs-note", Static).update(
            Text(
                f"measured, after {w} warm-up pair{'s' if w != 1 else ''} (not counted)"
                if w
                else "measured (no warm-up: the first pair runs cold)",
                style="dim",
            )
        )

    def show_error_plot(self) -> None:
        st = self.state
        ep = self.query_one(ErrorPlot)
        c = st.correctness
        ep.errors, ep.tokens = None, None
        if c is not None and isinstance(c.result, EmbeddingsGated):
            if self._errors_for != id(c):
                self._errors_for = id(c)
                self._errors = embedding_errors(st, c)
            ep.errors = self._errors
            ep.limits = _embedding_limits(c.params)
            ep.cosine = c.result.cosine
        elif c is not None:
            n, e = st.outputs.get("native"), st.outputs.get("external")
            if n and e and isinstance(n.result, Generated) and isinstance(e.result, Generated):
                ep.tokens = (list(n.result.tokens), list(e.result.tokens))
        ep.placeholder = "the correctness view appears here after the gate (c): " + (
            "token by token" if st.is_decoder else "the error of every element"
        )
        ep.redraw()

    def show_correctness(self) -> None:
        st = self.state
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("correctness", style="bold")
        for arm in ("native", "external"):
            o = st.outputs.get(arm)
            t.append(f"\n {arm:<9}", style="dim")
            if o is None:
                t.append("-", style="dim")
            elif isinstance(o.result, Generated):
                toks = o.result.tokens
                t.append(f"{len(toks)} tokens: " + " ".join(str(x) for x in toks))
            else:
                e = o.result
                pooled = f" ({e.pooling} pooling from {e.pooling_from})" if e.pooling not in (None, "none") else ""
                t.append(f"{e.values} values{pooled} → {st.show_path(e.output)}")
        if st.is_decoder:
            t.append("\n chat      ", style="dim")
            t.append(
                "on (checkpoint's chat template)" if st.chat else "off (h toggles)", style="" if st.chat else "dim"
            )
        t.append("\n reference ", style="dim")
        if st.reference is None:
            t.append("r compares the native bundle with transformers", style="dim")
        else:
            _append_gate(t, st.reference)
        c = st.correctness
        t.append("\n ")
        if c is None:
            t.append("c runs both arms and the gate", style="dim")
        else:
            _append_gate(t, c.result)
            r = c.result
            if isinstance(r, EmbeddingsGated) and isinstance(r.max_abs, (int, float)):
                # the numbers the gate judged, next to its thresholds (not only in the guide)
                max_abs, min_cosine = _embedding_limits(c.params)
                t.append(f" · max_abs {r.max_abs:.3g} (≤ {max_abs:g})")
                if isinstance(r.cosine, (int, float)):
                    t.append(f" · cosine {r.cosine:.7f} (≥ {min_cosine:g})")
        lg = st.logits
        if st.is_decoder and lg is not None:
            t.append("\n logits    ", style="dim")
            steps, worst = lg.steps, lg.max_abs
            t.append(
                "same bits at every step" if worst == 0 else f"worst max_abs {worst:.3g}",
                style="green" if worst == 0 else "yellow",
            )  # information: the token gate decides
            first = lg.first_divergence
            t.append(
                f" over {len(steps)} steps · "
                + ("greedy picks agree" if first is None else f"greedy picks first differ at step {first}")
            )
            if worst:
                t.append(" · per step " + " ".join(f"{v:.2g}" for v in steps), style="dim")
        self.query_one("#correctness", Static).update(t)

    def show_perf(self) -> None:
        p = self.state.perf
        t = Text()
        t.append("performance  ", style="bold")
        if self.wb.busy == "gate_perf":
            t.append("measuring… (fresh processes, alternating native/external; x cancels)", style="yellow")
        elif p is None:
            t.append(
                f"p runs the pairs; PROMOTE if the ratio's {PERF_DEFAULTS.confidence * 100:g}% interval clears "
                f"{PERF_DEFAULTS.min_ratio:g}",
                style="dim",
            )
        elif p.result.interval is not None and p.result.word != "FAIL":
            _append_decided(t, p, p.result.interval)
        else:  # a run failed (or a recording from before intervals): the gate's own line
            _append_gate(t, p.result)
        self.query_one("#perf-line", Static).update(t)

    def show_verdict(self) -> None:
        word, reason = verdict(self.state.correctness, self.state.perf)
        t = Text()
        style = {
            "PROMOTE": "bold reverse green",
            "REJECT": "bold reverse red",
            "INCONCLUSIVE": "bold reverse yellow",
        }.get(word, "bold reverse")
        t.append(f" {word} ", style=style)
        t.append(f" {reason}")
        v = self.query_one("#verdict", Static)
        v.update(t)
        v.set_class(word == "PROMOTE", "promote")
        v.set_class(word == "REJECT", "reject")

    # ------------------------------------------------------------------ parameters
    def _prompt(self) -> str | None:
        p = self.query_one("#prompt", Input).value.strip()
        if not p:
            self.wb.report_error("type a prompt first")
            return None
        return p

    def _pairs(self) -> int | str | None:
        text = self.query_one("#pairs", Input).value.strip()
        if text == "auto":
            return text
        if text.isdigit() and int(text) >= 2:
            return int(text)
        self.wb.report_error(f"perf pairs {text!r} must be auto or a whole number ≥ 2 (one pair has no spread)")
        return None

    def _int(self, wid: str, name: str) -> int | None:
        text = self.query_one(wid, Input).value.strip()
        try:
            v = int(text)
            if v < 1:
                raise ValueError
            return v
        except ValueError:
            self.wb.report_error(f"{name} {text!r} must be a whole number ≥ 1")
            return None

    def _ready(self) -> bool:
        st = self.state
        missing = []
        if "native" not in st.bundles:
            missing.append("the native bundle (F5, b)")
        if "slot" not in st.bundles:
            missing.append("the slot-ready bundle (F5, s)")
        if not st.manifest:
            missing.append("a bindings manifest (F4, w)")
        if missing:
            self.wb.report_error("first build " + ", ".join(missing))
            return False
        return True

    # ------------------------------------------------------------------ gates
    def action_correctness(self, then=None) -> None:
        """c: both arms, then the gate (decoders: generate, gate_tokens and gate_logits; encoders:
        embed and gate_embeddings)."""
        if not self._ready():
            return
        prompt = self._prompt()
        if prompt is None:
            return
        st = self.state
        if st.is_decoder:
            n = self._int("#max-new-tokens", "tokens")
            if n is None:
                return
            steps = decoder_correctness_steps(st, prompt, n)
        else:
            steps = encoder_correctness_steps(st, prompt)
        st.correctness = st.logits = None
        self.run_chain(steps, then)

    def action_perf(self, then=None) -> None:
        if not self._ready():
            return
        prompt = self._prompt()
        pairs = self._pairs()
        if prompt is None or pairs is None:
            return
        st = self.state
        params: dict[str, Any] = {
            "native_bundle": st.bundles["native"].result.bundle,
            "external_bundle": st.bundles["slot"].result.bundle,
            "kernel_bindings": st.manifest,
            "prompt": prompt,
            "pairs": pairs,
            "min_ratio": PERF_DEFAULTS.min_ratio,
            "warmup": max(WARMUP_PAIRS, self.warmup),
        }
        if st.is_decoder:
            n = self._int("#max-new-tokens", "tokens")
            if n is None:
                return
            params["max_new_tokens"] = n
        st.perf = None
        self.run_chain([("gate_perf", params)], then)

    def action_reference(self) -> None:
        """The native bundle against transformers on the checkpoint it was built from."""
        st = self.state
        if "native" not in st.bundles:
            self.wb.report_error("first build the native bundle (F5, b)")
            return
        prompt = self._prompt()
        if prompt is None:
            return
        params: dict[str, Any] = {
            "bundle": st.bundles["native"].result.bundle,
            "checkpoint": st.build_args["model"],
            "prompt": prompt,
        }
        if st.is_decoder:
            n = self._int("#max-new-tokens", "tokens")
            if n is None:
                return
            params.update(max_new_tokens=n, chat=st.chat)
        st.reference = None
        self.run_chain([("verify_reference", params)])

    def action_chat(self) -> None:
        self.state.chat = not self.state.chat
        self.refresh_view()

    def action_both(self) -> None:
        self.action_correctness(then=lambda: self.action_perf())

    def run_chain(self, steps: list[tuple[str, dict[str, Any]]], then=None) -> None:
        if not steps:
            if then is not None:
                then()
            return
        (action, params), rest = steps[0], steps[1:]
        self.wb.perform(action, params, on_done=lambda _r: self.run_chain(rest, then), label=action.replace("_", " "))

    @on_action
    def on_action_started(self, message: ActionStarted) -> None:
        self.refresh_view()


def _embedding_limits(params: dict[str, Any]) -> tuple[float, float]:
    """The thresholds an embeddings gate ran with (its params; the gate's defaults when absent)."""
    return (
        float(params.get("max_abs", EmbeddingsGate.max_abs)),
        float(params.get("min_cosine", EmbeddingsGate.min_cosine)),
    )


def _one_line(s: str) -> str:
    return " ".join(str(s).split())
