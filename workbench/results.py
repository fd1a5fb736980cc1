"""What each workbench action returns: one frozen dataclass per action (declared in the registry
beside the action), read by attribute on the screens and in the state.

Sessions hold results as JSON objects; `to_dict` writes exactly the object an action recorded
before results were typed (same keys, same order, so session files stay byte-identical) and
`from_dict` reads one back (a recorded session's results into the TUI's state). Replay compares
the JSON (ActionSpec.stable_keys), so a typed result never changes what a replay checks.
"""

from __future__ import annotations

import json
import types
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Self, Union, get_args, get_origin, get_type_hints

from mcore import UserError


@dataclass(frozen=True)
class Record:
    """A typed JSON object: fields in the order the object's keys are written."""

    KIND: ClassVar[str] = "result"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        """A recorded object back into its type; a missing field with a default takes it (older
        recordings lack some), one without is a one-line error naming it."""
        if not isinstance(d, dict):
            raise UserError(f"{cls.KIND}: expected a JSON object, got {type(d).__name__}")
        hints = _hints(cls)
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in d:
                kw[f.name] = _typed(hints[f.name], d[f.name])
            elif f.default is MISSING and f.default_factory is MISSING:
                raise UserError(f"{cls.KIND}: field {f.name} is missing")
        return cls(**kw)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _plain(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _typed(hint: Any, v: Any) -> Any:
    """A JSON value as the field's type says: nested records, tuples of them, optional ones."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        if v is None:
            return None
        inner = [a for a in get_args(hint) if a is not type(None)]
        return _typed(inner[0], v) if len(inner) == 1 else v
    if origin is tuple and isinstance(v, list):
        args = get_args(hint)
        return tuple(_typed(args[0], x) for x in v) if args else tuple(v)
    if origin is dict and isinstance(v, dict):
        vt = get_args(hint)[1] if get_args(hint) else Any
        return {k: _typed(vt, x) for k, x in v.items()}
    if isinstance(hint, type) and is_dataclass(hint) and issubclass(hint, Record) and isinstance(v, dict):
        return hint.from_dict(v)
    return v


Json = dict[str, Any]
VERDICTS = ("PASS", "FAIL", "PROMOTE", "REJECT", "INCONCLUSIVE")


def result_json(result: Record) -> Json:
    """A typed result as a session records it: plain JSON (paths and other objects as text); a
    non-finite number cannot be recorded and is a one-line error."""
    try:
        out = json.loads(json.dumps(result.to_dict(), allow_nan=False, default=str))
    except ValueError:
        raise UserError(f"{type(result).__name__}: a result holds a non-finite number; it cannot be recorded") from None
    assert isinstance(out, dict)
    return out


# ---------------------------------------------------------------------------- graph and region


@dataclass(frozen=True)
class Captured(Record):
    """capture_graph: the snapshot written and its size; `ops` (op -> count) says what changed
    when a replay's fingerprint differs."""

    fingerprint: str
    nodes: int
    tensors: int
    recipes: int
    snapshot: str
    ops: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeRow(Record):
    id: str
    instance: str
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class Recipes(Record):
    """list_recipes."""

    recipes: tuple[RecipeRow, ...]
    count: int


@dataclass(frozen=True)
class NodeRow(Record):
    id: str
    op: str
    category: str
    module_path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Nodes(Record):
    """list_nodes: display only."""

    ids: tuple[str, ...]
    count: int
    nodes: tuple[NodeRow, ...] = ()
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Selected(Record):
    """select_recipe / select_nodes: the receipt written and its ABI."""

    binding_id: str
    abi_sha256: str
    node_ids: tuple[str, ...]
    input_tensor_ids: tuple[str, ...]
    output_tensor_ids: tuple[str, ...]
    receipt: str
    abi_lines: tuple[str, ...] = ()


# ---------------------------------------------------------------------------- kernels


@dataclass(frozen=True)
class KernelBuilt(Record):
    """build_kernel: a shipped kernel compiled into a DSO."""

    library: str
    variant: str | None = None
    function: str = "run"
    description: str | None = None
    library_sha256: str | None = None


@dataclass(frozen=True)
class StubWritten(Record):
    """kernel_stub: the exporter written; `body` is "generated" (a known op) or "scaffold"."""

    path: str
    binding_id: str
    abi_sha256: str
    body: str
    op: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Exported(Record):
    """export_kernel: the DSO an exporter wrote."""

    library: str
    binding_id: str | None
    abi_sha256: str | None
    arch: str | None = None
    library_sha256: str | None = None


@dataclass(frozen=True)
class BindingsWritten(Record):
    """write_bindings: the manifest binding the receipt's slot to the library (pinned by sha256)."""

    manifest: str
    binding_id: str
    abi_sha256: str
    library: str
    library_sha256: str | None = None


@dataclass(frozen=True)
class KernelSlotRow(Record):
    binding_id: str
    abi_sha256: str


@dataclass(frozen=True)
class BundleBuilt(Record):
    """build_bundle: the bundle, its roles' fingerprints and its kernel slots."""

    bundle: str
    fingerprints: dict[str, str]
    kernel_slots: tuple[KernelSlotRow, ...]
    receipt: str | None = None
    abi_lines: tuple[str, ...] = ()


# ---------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Generated(Record):
    """generate: the greedy tokens and text (and the JSONL written, when asked)."""

    KIND: ClassVar[str] = "generate"

    tokens: tuple[int, ...]
    text: str
    output: str | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class Embedded(Record):
    """embed: how many values, where they went and how they were pooled."""

    KIND: ClassVar[str] = "embed"

    values: int
    output: str | None = None
    pooling: str | None = None
    normalize: bool | None = None
    pooling_from: str | None = None


# ---------------------------------------------------------------------------- gates


@dataclass(frozen=True)
class Gated(Record):
    """A gate's verdict (PASS/FAIL, the perf gate PROMOTE/REJECT/INCONCLUSIVE), its line and the
    lines before it; the gates below add their numbers."""

    passed: bool
    verdict: str = ""
    line: str = ""
    info: tuple[str, ...] = ()

    @property
    def word(self) -> str:
        """The verdict word; a recording from before verdicts were recorded says it through `passed`
        (as registry.verdict_of reads a recorded step)."""
        return self.verdict if self.verdict in VERDICTS else ("PASS" if self.passed else "FAIL")


@dataclass(frozen=True)
class TokensGated(Gated):
    """gate_tokens: exact token equality."""


@dataclass(frozen=True)
class EmbeddingsGated(Gated):
    """gate_embeddings: max |a-b| and cosine against the thresholds."""

    values: int | None = None
    max_abs: float | None = None
    cosine: float | None = None


@dataclass(frozen=True)
class ReferenceChecked(Gated):
    """verify_reference: the engine against transformers, step by step."""

    first_diverging_step: int | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    min_cosine: float | None = None


@dataclass(frozen=True)
class LogitsGated(Gated):
    """gate_logits: the worst |a-b| of each step's logits, in lockstep."""

    steps: tuple[float, ...] = ()
    max_abs: float | None = None
    first_divergence: int | None = None


@dataclass(frozen=True)
class Interval(Record):
    """The perf gate's t-interval of the ratio."""

    low: float
    high: float
    confidence: float
    t: float | None = None
    sd_log: float | None = None


@dataclass(frozen=True)
class PerfPair(Record):
    """One native/external pair: both throughputs, their ratio and which ran first."""

    native: float
    external: float
    ratio: float
    first: str


@dataclass(frozen=True)
class PerfGated(Gated):
    """gate_perf: the verdict, every pair, the interval and the rule."""

    ratio: float | None = None
    median_ratio: float | None = None
    interval: Interval | None = None
    rule: str | None = None
    metric: str | None = None
    min_ratio: float | None = None
    stop: str | None = None
    pairs: tuple[PerfPair, ...] = ()
    native: float | None = None
    external: float | None = None
    unit: str | None = None
    samples: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def word(self) -> str:
        """Recorded before verdicts, the gate was decided by the median ratio alone: PROMOTE/REJECT,
        or FAIL when its line names no ratio (a run that failed)."""
        if self.verdict in VERDICTS:
            return self.verdict
        if self.passed:
            return "PROMOTE"
        return "REJECT" if "median ratio" in self.line else "FAIL"

    @property
    def pair_count(self) -> int:
        return len(self.pairs) or len(self.samples.get("native", ()))


# ---------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class Profiled(Record):
    """profile: the report written (read back as mcore's ProfileReport) and which candidates exist;
    a candidate here is its identity without timings (kind, recipe/instance or module_path, node_ids)."""

    role: str
    context: int | None  # None: an encoder (its length is the prompt's)
    engine: str
    profile: str
    candidates: tuple[Json, ...] = ()
    ranked: tuple[Json, ...] = ()
    step_seconds: float | None = None


Correctness = TokensGated | EmbeddingsGated
Output = Generated | Embedded
