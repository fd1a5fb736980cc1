"""The workbench's shared plain types: the state the screens show and an action's outcome.

Kept apart from the app so screens, the registry and outputs can name them without importing
the app (tests/test_workbench_imports.py keeps the workbench free of import cycles).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .results import (
    BundleBuilt,
    Captured,
    Correctness,
    LogitsGated,
    Output,
    PerfGated,
    Record,
    ReferenceChecked,
    result_json,
)

if TYPE_CHECKING:  # pragma: no cover
    from mcore import PartialProfile, ProfileReport, Receipt, Snapshot, WatchRound

DEFAULT_BUILD_ARGS = {
    "model": "demo:qwen3-tiny",
    "precision": "fp32",
    "max_cache_length": 256,
    "decoder_engine_layout": "split",
}

R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class Applied(Generic[R]):
    """An action's typed result as the state keeps it, with the action and the params it ran with
    (a screen shows the thresholds a gate was run with, the prompt an output came from)."""

    action: str
    params: dict[str, Any]
    result: R


@dataclass(frozen=True)
class Listing:
    """The last list_nodes: its filter and the IDs it listed."""

    match: str | None
    last: int | None
    ids: tuple[str, ...]


@dataclass(frozen=True)
class LastPrompt:
    """The prompt (and decode steps) of the last run, so the Verify screen offers it again."""

    prompt: str | None
    max_new_tokens: int | None


@dataclass
class WorkbenchState:
    """What the screens show; changed only on the UI thread (apply_results)."""

    workdir: Path
    # free exploration starts from the tutorials' build arguments (same cache length, same graph)
    build_args: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_BUILD_ARGS))
    device: str | None = None  # None = auto (the bundle's device, else CUDA when present)
    engine_role: str | None = None
    family_kind: str | None = None  # "decoder" / "encoder" once known
    snapshot: Snapshot | None = None
    snapshot_path: str | None = None
    capture_results: Captured | None = None
    marked: list[str] = field(default_factory=list)
    listing: Listing | None = None
    receipt: Receipt | None = None
    receipt_path: str | None = None
    library: str | None = None
    stub_path: str | None = None
    stub_text: str | None = None
    export_output: list[str] = field(default_factory=list)
    manifest: str | None = None
    bundles: dict[str, Applied[BundleBuilt]] = field(default_factory=dict)  # "native" / "slot"
    outputs: dict[str, Applied[Output]] = field(default_factory=dict)  # "native" / "external"
    correctness: Applied[Correctness] | None = None  # the last gate_tokens / gate_embeddings
    perf: Applied[PerfGated] | None = None
    reference: ReferenceChecked | None = None  # the last verify_reference
    logits: LogitsGated | None = None  # the last gate_logits (decoders)
    profile: ProfileReport | None = None  # the last profile report, read back from its file
    profile_path: str | None = None
    profile_partial: PartialProfile | None = None  # what a running profile has attributed so far
    chat: bool = False  # generate through the checkpoint's chat template
    trusted: set[str] = field(default_factory=set)
    samples: dict[str, list[float]] = field(default_factory=lambda: {"native": [], "external": []})
    log: list[str] = field(default_factory=list)
    last_prompt: LastPrompt | None = None
    watch_rounds: list[WatchRound] = field(default_factory=list)  # the Kernel screen's watch, a round each
    # the watch's gate settings (mcore.WatchConfig fields); the perf gate's as the Verify screen runs it
    watch_settings: dict[str, Any] = field(default_factory=lambda: {"pairs": 3, "warmup": 1, "max_new_tokens": 8})

    @overload
    def path(self, p: str) -> Path: ...
    @overload
    def path(self, p: None) -> None: ...
    def path(self, p: str | None) -> Path | None:
        if p is None:
            return None
        q = Path(p)
        return q if q.is_absolute() else self.workdir / q

    def show_path(self, p: str | None) -> str:
        """A path as shown on screen: relative to the workdir when inside it (no tmp paths)."""
        if not p:
            return "-"
        q = Path(p)
        if q.is_absolute():
            try:
                return str(q.resolve().relative_to(self.workdir.resolve()))
            except ValueError:
                return str(q)
        return str(q)

    @property
    def is_decoder(self) -> bool:
        if self.family_kind:
            return self.family_kind == "decoder"
        from mcore import family_kind, model_kind

        if self.snapshot is not None and self.snapshot.family:
            return family_kind(self.snapshot.family) == "decoder"
        return model_kind(str(self.build_args.get("model", ""))) == "decoder"


@dataclass
class ActionOutcome:
    """How an action ended: its typed result (ok), or the one-line error and why it did not finish."""

    action: str
    params: dict[str, Any]
    result: Record | None = None
    error: str | None = None  # the one-line text shown (and recorded)
    kind: str = "ok"  # ok | user | cancelled | bug

    @property
    def results(self) -> dict[str, Any] | None:
        """The result as a session records it (plain JSON), None without one."""
        return None if self.result is None else result_json(self.result)
