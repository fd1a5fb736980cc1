"""One implementation of each gate for every caller: `mcore verify tokens|embeddings|perf|reference|
logits` (mcore/cli/verify_cmds.py), the workbench's gate actions and the kernel watch's rounds.

Each gate is a frozen dataclass holding its inputs and options, the defaults written once here
(the CLI's flags take their defaults from these classes, the workbench's action params too), and
`run(hooks)` checks them and runs the gate the same way for everyone. `GateHooks` carries what
differs between callers: where progress, loaded-library notices, info lines and perf samples go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..common.progress import NO_PROGRESS, Progress
from .details import EmbeddingsDetails, LogitsDetails, PerfDetails, ReferenceDetails, TokensDetails
from .perf import PERF_DEFAULTS
from .verdicts import GateResult

LineFn = Callable[[str], None]
SampleFn = Callable[[str, int, float], None]

# the embeddings gate's thresholds (the tutorial's); the reference check's cosine floor is the same
EMBEDDINGS_MAX_ABS = 0.02
MIN_COSINE = 0.999
REFERENCE_MAX_REL = 0.05  # bf16 engines stay near 0.01; a doubled final norm gives 1.0, lm_head x1.5 gives 0.5
ENGINES = ("auto", "compiled", "torch")


@dataclass(frozen=True)
class GateHooks:
    """Where a running gate reports: progress (and cancellation), the once-per-library notice that
    native code loads, each info line as it is produced (the perf gate), each measured sample."""

    progress: Progress = field(default_factory=lambda: NO_PROGRESS)
    announce: LineFn | None = None
    on_line: LineFn | None = None
    on_sample: SampleFn | None = None


NO_HOOKS = GateHooks()


@dataclass(frozen=True)
class TokensGate:
    """Exact token equality of two `mcore run --output` JSONL files."""

    native: str | Path
    external: str | Path

    def run(self, hooks: GateHooks = NO_HOOKS) -> GateResult[TokensDetails]:
        from .compare import compare_tokens

        return compare_tokens(self.native, self.external)


@dataclass(frozen=True)
class EmbeddingsGate:
    """The numerical gate on two embeddings (files, or the values themselves)."""

    native: str | Path | list[float]
    external: str | Path | list[float]
    max_abs: float = EMBEDDINGS_MAX_ABS
    min_cosine: float = MIN_COSINE

    def run(self, hooks: GateHooks = NO_HOOKS) -> GateResult[EmbeddingsDetails]:
        from .compare import compare_embeddings

        return compare_embeddings(self.native, self.external, max_abs=self.max_abs, min_cosine=self.min_cosine)


@dataclass(frozen=True)
class ReferenceGate:
    """The bundle's engine against transformers on the same checkpoint, step by step."""

    bundle: str
    checkpoint: str
    prompt: str
    max_new_tokens: int = 8
    chat: bool = False
    kernel_bindings: str | None = None
    device: str | None = None
    min_cosine: float = MIN_COSINE
    max_abs: float | None = None  # not gated unless given
    max_rel: float = REFERENCE_MAX_REL

    def run(self, hooks: GateHooks = NO_HOOKS) -> GateResult[ReferenceDetails]:
        from ..model.tokenization import check_prompt
        from .reference import reference_check

        check_prompt(self.prompt)
        return reference_check(
            self.bundle,
            self.checkpoint,
            self.prompt,
            max_new_tokens=self.max_new_tokens,
            chat=self.chat,
            kernel_bindings=self.kernel_bindings,
            device=self.device,
            min_cosine=self.min_cosine,
            max_abs=self.max_abs,
            progress=hooks.progress,
            announce=hooks.announce,
            max_rel=self.max_rel,
        )


@dataclass(frozen=True)
class LogitsGate:
    """A native and a slot bundle stepped in lockstep on the native greedy tokens, logits compared."""

    native: str
    external: str
    kernel_bindings: str | None
    prompt: str
    max_new_tokens: int = 16
    max_abs: float = 0.0  # bit-identical
    chat: bool = False
    device: str | None = None
    engine: str = "auto"

    def run(self, hooks: GateHooks = NO_HOOKS) -> GateResult[LogitsDetails]:
        from ..model.tokenization import check_prompt
        from .logits import lockstep_logits

        check_prompt(self.prompt)
        return lockstep_logits(
            self.native,
            self.external,
            self.kernel_bindings,
            self.prompt,
            max_new_tokens=self.max_new_tokens,
            max_abs=self.max_abs,
            chat=self.chat,
            device=self.device,
            engine=self.engine,
            progress=hooks.progress,
            announce=hooks.announce,
        )


@dataclass(frozen=True)
class PerfOptions:
    """The perf gate's decision options (mcore/verify/perf.py: pairs N or "auto", the threshold, the
    interval's confidence, auto's bounds, warm-up runs, the metric)."""

    pairs: int | str = PERF_DEFAULTS.pairs
    min_ratio: float = PERF_DEFAULTS.min_ratio
    confidence: float = PERF_DEFAULTS.confidence
    max_pairs: int | None = None  # --pairs auto: PERF_DEFAULTS.max_pairs
    budget_s: float | None = None
    warmup: int = 1
    metric: str = PERF_DEFAULTS.metric


@dataclass(frozen=True)
class PerfGate:
    """Alternating fresh-process pairs of two shell commands that print benchmark lines."""

    native: str
    external: str
    options: PerfOptions = field(default_factory=PerfOptions)

    @classmethod
    def for_bundles(
        cls,
        arms: BenchArms,
        native_bundle: str | Path,
        external_bundle: str | Path,
        kernel_bindings: str | None,
        options: PerfOptions | None = None,
    ) -> PerfGate:
        """The gate over two bundles: each arm `mcore run|embed BUNDLE ... --benchmark N`, the
        external one bound to `kernel_bindings` (as the workbench and the kernel watch run it)."""
        native, external = arms.command(native_bundle, None), arms.command(external_bundle, kernel_bindings)
        return cls(native, external, options or PerfOptions())

    def run(self, hooks: GateHooks = NO_HOOKS) -> GateResult[PerfDetails]:
        from .perf import perf_gate

        o = self.options
        return perf_gate(
            self.native,
            self.external,
            pairs=o.pairs,
            min_ratio=o.min_ratio,
            warmup=o.warmup,
            on_sample=hooks.on_sample,
            progress=hooks.progress,
            on_line=hooks.on_line,
            metric=o.metric,
            max_pairs=o.max_pairs,
            budget_s=o.budget_s,
            confidence=o.confidence,
        )


@dataclass(frozen=True)
class BenchArms:
    """What both arms of a perf gate over bundles run: the bundle kind's verb (run or embed), the
    prompt, decode steps (decoders), warm-up and measured runs, and the device and engine the rest
    of the check used (None: the run's defaults)."""

    kind: str  # "decoder" | "encoder"
    prompt: str
    max_new_tokens: int | None
    warmup: int
    runs: int
    device: str | None = None
    engine: str | None = None

    def command(self, bundle: str | Path, kernel_bindings: str | None) -> str:
        from .watch import benchmark_command

        return benchmark_command(
            self.kind,
            Path(bundle),
            kernel_bindings,
            self.prompt,
            self.max_new_tokens,
            self.warmup,
            self.runs,
            self.device,
            self.engine,
        )


Gate = TokensGate | EmbeddingsGate | ReferenceGate | LogitsGate | PerfGate
