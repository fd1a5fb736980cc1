"""Each gate's numbers (`GateResult.details`), typed: what the CLI, the workbench's gate actions and the
kernel watch read as fields.

`to_dict()` is the JSON object the gates returned before they were typed, key for key and in the
same order (a field that a case does not measure is left out, as it was; tests/test_gate_details.py
pins every case), and `from_dict()` reads it back. Sequences are tuples here and lists in JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]


def _set(out: Json, **fields: Any) -> Json:
    """`out` with the fields that are not None (the cases that do not measure one leave it out)."""
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


def _pair(d: Json, a: str, b: str) -> tuple[Any, Any] | None:
    return (d[a], d[b]) if a in d else None


@dataclass(frozen=True)
class TokensDetails:
    """compare_tokens: the records compared, and then the tokens (PASS), where the first difference is
    (`first_record`, `first_position` and each side's token there, an int or "<end>"). `counts` (each
    side's record count) is read from sessions recorded before unequal counts became a usage error."""

    records: int
    tokens: int | None = None
    first_record: int | None = None
    first_position: int | None = None
    differing: tuple[int | str, int | str] | None = None
    counts: tuple[int, int] | None = None
    labels: tuple[str, str] = ("native", "external")

    def to_dict(self) -> Json:
        la, lb = self.labels
        out = _set({"records": self.records}, tokens=self.tokens)
        _set(out, first_record=self.first_record, first_position=self.first_position)
        if self.differing is not None:
            out[la], out[lb] = self.differing
        if self.counts is not None:
            out[f"{la}_records"], out[f"{lb}_records"] = self.counts
        return out

    @classmethod
    def from_dict(cls, d: Json, labels: tuple[str, str] = ("native", "external")) -> TokensDetails:
        la, lb = labels
        return cls(
            d["records"],
            d.get("tokens"),
            d.get("first_record"),
            d.get("first_position"),
            _pair(d, la, lb),
            _pair(d, f"{la}_records", f"{lb}_records"),
            labels,
        )


@dataclass(frozen=True)
class EmbeddingsDetails:
    """compare_embeddings: the values compared, each side's length (they differ), the numbers, the
    limits they were held to, and why it failed."""

    values: int
    counts: tuple[int, int] | None = None
    max_abs: float | None = None
    cosine: float | None = None
    max_abs_limit: float | None = None
    min_cosine: float | None = None
    reason: str | None = None
    labels: tuple[str, str] = ("native", "byok")

    def to_dict(self) -> Json:
        la, lb = self.labels
        out: Json = {"values": self.values}
        if self.counts is not None:
            out[f"{la}_values"], out[f"{lb}_values"] = self.counts
        return _set(
            out,
            max_abs=self.max_abs,
            cosine=self.cosine,
            max_abs_limit=self.max_abs_limit,
            min_cosine=self.min_cosine,
            reason=self.reason,
        )

    @classmethod
    def from_dict(cls, d: Json, labels: tuple[str, str] = ("native", "byok")) -> EmbeddingsDetails:
        la, lb = labels
        return cls(
            d["values"],
            _pair(d, f"{la}_values", f"{lb}_values"),
            d.get("max_abs"),
            d.get("cosine"),
            d.get("max_abs_limit"),
            d.get("min_cosine"),
            d.get("reason"),
            labels,
        )


@dataclass(frozen=True)
class LogitsStep:
    """One lockstep step: max |native - external| (inf when not finite) and both greedy picks."""

    step: int
    max_abs: float
    native: int
    external: int

    def to_dict(self) -> Json:
        return {"step": self.step, "max_abs": self.max_abs, "native": self.native, "external": self.external}


@dataclass(frozen=True)
class LogitsDetails:
    """lockstep_logits: every step, the worst max_abs, the first step the greedy picks differ (None:
    none), the native greedy tokens both sides were fed, the limit, and the engine and device."""

    steps: tuple[LogitsStep, ...]
    max_abs: float
    first_divergence: int | None
    tokens: tuple[int, ...]
    limit: float
    engine: str
    device: str

    def to_dict(self) -> Json:
        return {
            "steps": [s.to_dict() for s in self.steps],
            "max_abs": self.max_abs,
            "first_divergence": self.first_divergence,
            "tokens": list(self.tokens),
            "limit": self.limit,
            "engine": self.engine,
            "device": self.device,
        }

    @classmethod
    def from_dict(cls, d: Json) -> LogitsDetails:
        steps = tuple(LogitsStep(s["step"], s["max_abs"], s["native"], s["external"]) for s in d["steps"])
        return cls(steps, d["max_abs"], d["first_divergence"], tuple(d["tokens"]), d["limit"], d["engine"], d["device"])


@dataclass(frozen=True)
class ReferenceStep:
    """One reference step: the engine against transformers (the tokens are None for an encoder)."""

    step: int
    max_abs: float
    rel: float
    cosine: float
    engine_token: int | None
    reference_token: int | None

    def to_dict(self) -> Json:
        return {
            "step": self.step,
            "max_abs": self.max_abs,
            "rel": self.rel,
            "cosine": self.cosine,
            "engine_token": self.engine_token,
            "reference_token": self.reference_token,
        }


@dataclass(frozen=True)
class ReferenceWorst:
    """Over every step: the first whose tokens differ (None: none) and the worst numbers."""

    first_diverging_step: int | None
    min_cosine: float
    max_abs: float
    max_rel: float


@dataclass(frozen=True)
class ReferenceDetails:
    """reference_check: the tensors whose weights differ from the checkpoint's (then nothing ran), or
    the prompt's token count, where the token IDs first differ (then no step ran), every step and the
    worst of them."""

    prompt_tokens: int | None = None
    steps: tuple[ReferenceStep, ...] = ()
    token_mismatch_at: int | None = None
    worst: ReferenceWorst | None = None
    weights_differ: tuple[str, ...] | None = None

    def to_dict(self) -> Json:
        if self.weights_differ is not None:
            return {"weights_differ": list(self.weights_differ)}
        out: Json = {"prompt_tokens": self.prompt_tokens, "steps": [s.to_dict() for s in self.steps]}
        _set(out, token_mismatch_at=self.token_mismatch_at)
        if self.worst is not None:
            w = self.worst
            out.update(first_diverging_step=w.first_diverging_step, min_cosine=w.min_cosine)
            out.update(max_abs=w.max_abs, max_rel=w.max_rel)
        return out

    @classmethod
    def from_dict(cls, d: Json) -> ReferenceDetails:
        if "weights_differ" in d:
            return cls(weights_differ=tuple(d["weights_differ"]))
        steps = tuple(ReferenceStep(**s) for s in d["steps"])
        worst = None
        if "max_rel" in d:
            worst = ReferenceWorst(d["first_diverging_step"], d["min_cosine"], d["max_abs"], d["max_rel"])
        return cls(d["prompt_tokens"], steps, d.get("token_mismatch_at"), worst)


@dataclass(frozen=True)
class PerfInterval:
    """The t-interval the perf gate decided by: bounds, confidence, the t quantile, the log-ratios' sd."""

    low: float
    high: float
    confidence: float
    t: float
    sd_log: float

    def to_dict(self) -> Json:
        return {"low": self.low, "high": self.high, "confidence": self.confidence, "t": self.t, "sd_log": self.sd_log}


@dataclass(frozen=True)
class PerfDecision:
    """What a perf gate that measured every pair it needed decided by: the interval's ratio estimate,
    the median ratio, the interval, the rule, why auto stopped (None: a fixed count), both arms'
    medians in `unit`, the metric, and the native arm's generated tokens (None: an encoder)."""

    ratio: float
    median_ratio: float
    interval: PerfInterval
    rule: str
    stop: str | None
    native_median: float
    external_median: float
    unit: str | None
    metric: str | None
    generated_tokens_mean: float | None

    def to_dict(self) -> Json:
        return {
            "ratio": self.ratio,
            "median_ratio": self.median_ratio,
            "interval": self.interval.to_dict(),
            "rule": self.rule,
            "stop": self.stop,
            "native_median": self.native_median,
            "external_median": self.external_median,
            "unit": self.unit,
            "metric": self.metric,
            "generated_tokens_mean": self.generated_tokens_mean,
        }

    @classmethod
    def from_dict(cls, d: Json) -> PerfDecision:
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k != "interval"}
        return cls(interval=PerfInterval(**d["interval"]), **fields)


@dataclass(frozen=True)
class PerfDetails:
    """perf_gate: the complete pairs and the settings (pairs asked for: N or "auto"), every sample
    and ratio, which arm ran first in each pair, the verdict word, and the decision (None: a run
    failed before the gate could decide)."""

    pairs: int
    pairs_requested: int | str
    warmup: int
    min_ratio: float
    confidence: float
    native: tuple[float, ...]
    external: tuple[float, ...]
    ratios: tuple[float, ...]
    order: tuple[tuple[str, str], ...]
    verdict: str
    decision: PerfDecision | None = None

    @property
    def ratio(self) -> float | None:
        """The ratio the verdict was decided by (None: a run failed)."""
        return None if self.decision is None else self.decision.ratio

    def to_dict(self) -> Json:
        out: Json = {
            "pairs": self.pairs,
            "pairs_requested": self.pairs_requested,
            "warmup": self.warmup,
            "min_ratio": self.min_ratio,
            "confidence": self.confidence,
            "native": list(self.native),
            "external": list(self.external),
            "ratios": list(self.ratios),
            "order": [list(o) for o in self.order],
            "verdict": self.verdict,
        }
        if self.decision is not None:
            out.update(self.decision.to_dict())
        return out

    @classmethod
    def from_dict(cls, d: Json) -> PerfDetails:
        return cls(
            d["pairs"],
            d["pairs_requested"],
            d["warmup"],
            d["min_ratio"],
            d["confidence"],
            tuple(d["native"]),
            tuple(d["external"]),
            tuple(d["ratios"]),
            tuple((a, b) for a, b in d["order"]),
            d["verdict"],
            PerfDecision.from_dict(d) if "interval" in d else None,
        )


GateDetails = TokensDetails | EmbeddingsDetails | LogitsDetails | ReferenceDetails | PerfDetails
