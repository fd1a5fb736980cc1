"""The edit-export-verify loop: `mcore kernel watch` and the workbench Kernel screen's watch mode.

Each round re-exports the kernel (the exporter script, or a shipped exporter by name) into a new
DSO, writes a bindings manifest for it, and runs the gates on a NEW pipeline bound to that DSO (a
running pipeline is never rebound: every round constructs its own, so the previous round's library
is never touched): the correctness gate in lockstep (`mcore verify logits` for decoders, `mcore
verify embeddings` on both pipelines' embeddings for encoders), then, when it passes, the perf gate
(`mcore verify perf` on fresh-process benchmark commands). The first round runs at once; each later
one when the watched file's content changes. Everything is cancellable through `progress`; a
failing export or gate ends its round, never the watch. A GPU kernel (its exporter reports `arch=`)
watched on a CPU run is exported and checked by its exporter each round, and the round says EXPORTED:
its gates cannot run there, and no verdict is guessed.

Round files go to a folder that is new or empty when the watch starts (`round-N.so`,
`round-N.bindings.json`): nothing is replaced, and each round's library has its own path.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.errors import Cancelled, UserError
from ..common.progress import NO_PROGRESS, Progress
from .details import EmbeddingsDetails, LogitsDetails, PerfDetails
from .perf import PERF_DEFAULTS
from .verdicts import GateResult

LineFn = Callable[[str], None]
# A round whose GPU kernel exported but whose gates could not run on this device: no verdict on it.
EXPORTED = "EXPORTED"


@dataclass
class WatchConfig:
    """What a watch runs: the exporter and its receipt, the two bundles, and the gates' settings."""

    exporter: str  # a shipped exporter's name or an exporter script (.py)
    selection: Path  # the receipt the exporter compiles for (the slot bundle's slot)
    native_bundle: Path
    slot_bundle: Path
    out_dir: Path
    prompt: str
    snapshot: Path | None = None
    max_new_tokens: int = 8
    max_abs: float | None = None  # None: 0 for decoders (bit-identical logits), 0.02 for encoders
    min_cosine: float = 0.999  # encoders
    perf: bool = True
    pairs: int = 3  # fewer than the CLI gate's 6: a round should be quick (at least 2: a spread)
    min_ratio: float = PERF_DEFAULTS.min_ratio
    warmup: int = 1
    bench_warmup: int = 2
    bench_runs: int = 5
    metric: str = PERF_DEFAULTS.metric
    device: str | None = None
    engine: str = "auto"
    function: str = "run"


@dataclass
class WatchRound:
    """One round's outcome: the row a watch shows (round, time, max_abs, ratio, verdict)."""

    index: int
    started: float  # time.time()
    verdict: str = "ERROR"  # PROMOTE | REJECT | INCONCLUSIVE | PASS (perf off) | EXPORTED (no GPU) | ERROR
    note: str = ""  # the line that decided it, or the error
    max_abs: float | None = None
    ratio: float | None = None
    correctness: str | None = None  # the correctness gate's verdict word
    perf: str | None = None  # the perf gate's verdict word (None: not run)
    library: Path | None = None
    manifest: Path | None = None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def clock(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.started))

    def line(self) -> str:
        """The one line a round prints (`mcore kernel watch`)."""
        num = "-" if self.max_abs is None else f"{self.max_abs:.6g}"
        ratio = "-" if self.ratio is None else f"{self.ratio:.4f}"
        return (
            f"round {self.index} {self.clock} max_abs={num} ratio={ratio} verdict={self.verdict} "
            f"({self.seconds:.1f}s) {self.note}"
        ).rstrip()

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.index,
            "time": self.clock,
            "max_abs": self.max_abs,
            "ratio": self.ratio,
            "verdict": self.verdict,
            "correctness": self.correctness,
            "perf": self.perf,
            "note": self.note,
            "library": str(self.library) if self.library else None,
            "seconds": round(self.seconds, 2),
        }


def gate_verdict(result: Any) -> str:
    """A gate's verdict word: its own `verdict` when it has one (PASS / FAIL / INCONCLUSIVE), else
    PASS or FAIL from `passed`. Read generically so a gate that gains a verdict needs no change here."""
    word = getattr(result, "verdict", None)
    if isinstance(word, str) and word:
        return word.upper()
    return "PASS" if result.passed else "FAIL"


def benchmark_command(
    kind: str,
    bundle: Path,
    kernel_bindings: str | None,
    prompt: str,
    max_new_tokens: int | None,
    warmup: int,
    runs: int,
    device: str | None = None,
    engine: str | None = None,
) -> str:
    """The fresh-process benchmark command for one arm (`mcore run|embed ... --benchmark N`), as the
    perf gate runs it; this checkout's mcore when the package is not installed. `device` and
    `engine` (None: the run's defaults) keep the arms on what the rest of the check used."""
    prefix = ""
    try:
        from importlib import metadata

        metadata.version("byok-workbench")
    except Exception:  # noqa: BLE001 - not installed: run mcore from this checkout
        root = str(Path(__file__).resolve().parent.parent.parent)
        prefix = f"PYTHONPATH={shlex.quote(root)}${{PYTHONPATH:+:$PYTHONPATH}} "
    cmd = [sys.executable, "-m", "mcore", "run" if kind == "decoder" else "embed", str(bundle), "--prompt", prompt]
    if kind == "decoder":
        cmd += ["--max-new-tokens", str(max_new_tokens), "--greedy"]
    if kernel_bindings is not None:
        cmd += ["--kernel-bindings", kernel_bindings]
    if device is not None:
        cmd += ["--device", device]
    if engine is not None:
        cmd += ["--engine", engine]
    cmd += ["--warmup", str(warmup), "--benchmark", str(runs)]
    return prefix + " ".join(shlex.quote(c) for c in cmd)


# ---------------------------------------------------------------- checks before the first round


def check_watch(cfg: WatchConfig) -> tuple[str, Any]:
    """Everything a round needs, checked once before the first (one-line errors): the exporter, the
    receipt and its slot in the slot bundle, the two bundles' kind, the gate settings, the device and
    the round folder (new or empty). Returns (family kind, receipt)."""
    from ..bundle.container import open_bundle
    from ..families import bundle_kind
    from ..kernels.exporters import check_snapshot_given, exporter_script
    from ..runtime.pipeline import resolve_device
    from ..selection.region import load_receipt
    from .compare import check_threshold
    from .logits import check_native, check_same_build
    from .perf import check_plan

    exporter_script(cfg.exporter)
    check_snapshot_given(cfg.exporter, cfg.snapshot)
    receipt = load_receipt(cfg.selection)
    nm, sm = open_bundle(cfg.native_bundle).runnable(), open_bundle(cfg.slot_bundle).runnable()
    check_native(nm, cfg.native_bundle, "the native bundle must be one without slots, the slot bundle its twin")
    if not any(s.binding_id == receipt.binding_id and s.abi_sha256 == receipt.abi_sha256 for s in sm.kernel_slots):
        raise UserError(
            f"{cfg.slot_bundle}: no kernel slot of binding {receipt.binding_id} with abi_sha256 "
            f"{receipt.abi_sha256[:16]}… ({cfg.selection}); build the slot bundle from this receipt"
        )
    kind = bundle_kind(nm)
    if bundle_kind(sm) != kind or sm.model != nm.model:
        raise UserError(f"{cfg.slot_bundle} is not the slot twin of {cfg.native_bundle} (another model or kind)")
    check_same_build(nm, sm, cfg.native_bundle, cfg.slot_bundle)  # another precision would FAIL every round
    if not cfg.prompt.strip():
        raise UserError("--prompt is empty; give the text both pipelines run")
    if cfg.max_new_tokens < 1 or cfg.bench_runs < 1 or cfg.bench_warmup < 0:
        raise UserError("--max-new-tokens and --bench-runs must be >= 1; --bench-warmup >= 0")
    if cfg.max_abs is not None:
        check_threshold("--max-abs", cfg.max_abs, 0.0)
    resolve_device(cfg.device)  # a device this machine lacks would end every round as ERROR
    # the perf gate's own checks of its settings (pairs, warmup, min ratio, metric), before round 1
    check_plan(
        "native", "external", cfg.pairs, cfg.min_ratio, cfg.warmup, cfg.metric, None, None, PERF_DEFAULTS.confidence
    )
    _check_out_dir(cfg.out_dir)
    return kind, receipt


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: not a folder; --out-dir names the folder the rounds' DSOs go to")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"{out}: the rounds' folder is not empty; give a new or empty --out-dir (nothing is replaced)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create the rounds' folder ({e.strerror or e})") from None


def default_out_dir(exporter: str, selection: Path) -> Path:
    """A new folder beside the receipt: NAME.watch, NAME.watch-2, ..."""
    stem = Path(exporter).stem if exporter.endswith(".py") else exporter
    base = selection.parent / f"{stem}.watch"
    out, n = base, 1
    while out.exists() and (not out.is_dir() or any(out.iterdir())):
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


# ---------------------------------------------------------------- the loop


def watch_kernel(
    cfg: WatchConfig,
    rounds: int | None = None,
    progress: Progress = NO_PROGRESS,
    on_round: Callable[[WatchRound], None] | None = None,
    log: LineFn | None = None,
    announce: LineFn | None = None,
    poll_s: float = 0.5,
    on_start: Callable[[], None] | None = None,
) -> list[WatchRound]:
    """Run rounds until `rounds` are done (None: until cancelled): the first at once, then one each
    time the exporter file's content changes. `on_start` runs once the inputs passed their checks.
    Returns the rounds' outcomes."""
    from ..kernels.exporters import exporter_script

    kind, receipt = check_watch(cfg)
    if on_start is not None:
        on_start()
    watched = exporter_script(cfg.exporter)
    history: list[WatchRound] = []
    seen: str | None = None
    while rounds is None or len(history) < rounds:
        seen = wait_for_change(watched, seen, progress, poll_s, first=not history)
        r = run_round(cfg, kind, receipt, len(history) + 1, progress, log, announce)
        history.append(r)
        if on_round is not None:
            on_round(r)
    return history


def file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise UserError(f"{path}: cannot read the watched exporter ({e.strerror or e})") from None


def wait_for_change(path: Path, seen: str | None, progress: Progress, poll_s: float, first: bool) -> str:
    """The file's digest once it differs from `seen` (at once for the first round). An editor's save
    that leaves the content as it was starts no round."""
    while True:
        digest = file_digest(path)
        if first or digest != seen:
            return digest
        progress.report(f"watching {path.name}: save it to start the next round", 0.0)
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline:
            progress.check()
            time.sleep(min(0.05, poll_s))


def run_round(
    cfg: WatchConfig,
    kind: str,
    receipt: Any,
    index: int,
    progress: Progress,
    log: LineFn | None,
    announce: LineFn | None,
) -> WatchRound:
    """One round: export, bind, correctness, perf. A user error, or a kernel that raises when it runs
    (the code being edited), ends the round as ERROR and the watch goes on; cancellation propagates."""
    r = WatchRound(index, time.time())
    t0 = time.monotonic()
    try:
        progress.report(f"round {index}: exporting", 0.0)
        r.library, r.manifest, arch = _export_and_bind(cfg, receipt, index, progress.part(0.0, 0.3), log)
        off_gpu = _no_gpu_for(arch, cfg.device)
        if off_gpu:  # a GPU kernel on a CPU run: the export's checks ran; the gates cannot judge it here
            r.verdict, r.note = EXPORTED, off_gpu
            return r
        correct = _correctness(cfg, kind, r.manifest, progress.part(0.3, 0.6), announce)
        r.correctness, r.max_abs = gate_verdict(correct), correct.details.max_abs
        r.details["correctness"] = correct.line
        if r.correctness != "PASS" or not cfg.perf:
            r.verdict = "REJECT" if r.correctness != "PASS" else "PASS"
            r.note = correct.line if r.correctness != "PASS" else "correctness PASS; perf gate off"
        else:
            perf = _perf(cfg, kind, r.manifest, progress.part(0.6, 1.0), log)
            # the ratio the verdict is decided by (the interval's estimate); a run that failed has none
            r.perf, r.ratio = gate_verdict(perf), perf.details.ratio
            r.details["perf"] = perf.line
            r.verdict = {"PASS": "PROMOTE", "FAIL": "REJECT"}.get(r.perf, r.perf)
            r.note = perf.line
    except UserError as e:
        r.verdict, r.note = "ERROR", str(e)
    except Cancelled:
        raise
    except Exception as e:  # noqa: BLE001 - the kernel under edit failed inside a pipeline: say so, go on
        r.verdict, r.note = "ERROR", f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
    finally:
        r.seconds = time.monotonic() - t0
    return r


def _no_gpu_for(arch: str | None, device: str | None) -> str | None:
    """Why this round's gates cannot run, when the exporter built a GPU kernel (it reported `arch=`;
    a kernel with a CPU path reports none) and the watch's pipelines run on the CPU; else None."""
    if not arch:
        return None
    from ..runtime.pipeline import resolve_device

    if resolve_device(device).type == "cuda":
        return None
    import torch

    # worded for the CLI (--device) and the TUI (the Model screen's device) alike
    where = (
        ", though this machine has one: watch it on device cuda"
        if torch.cuda.is_available()
        else " (no CUDA GPU here): watch it on a GPU machine"
    )
    return f"exported for {arch}; its gates need a CUDA device and this watch runs on cpu{where}"


def _export_and_bind(
    cfg: WatchConfig, receipt: Any, index: int, progress: Progress, log: LineFn | None
) -> tuple[Path, Path, str | None]:
    """round-N.so from the exporter, and round-N.bindings.json binding the receipt's slot to it;
    the GPU architecture the exporter reported (None: none)."""
    from ..common.fileio import check_overwrite, write_json
    from ..kernels.exporters import run_exporter
    from ..runtime.bindings import BINDINGS_SCHEMA_VERSION, BindingsManifest

    so = check_overwrite(cfg.out_dir / f"round-{index}.so", False)
    manifest = check_overwrite(cfg.out_dir / f"round-{index}.bindings.json", False)
    res = run_exporter(cfg.exporter, cfg.selection, so, snapshot=cfg.snapshot, progress=progress, log=log)
    if res.abi_sha256 and res.abi_sha256 != receipt.abi_sha256:
        raise UserError(f"the exporter built for abi_sha256 {res.abi_sha256[:16]}…, not the receipt's")
    entry = {
        "id": receipt.binding_id,
        "abi_sha256": receipt.abi_sha256,
        "library": f"./{res.library.name}",
        "function": cfg.function,
    }
    if res.library_sha256:  # pin this round's bytes, as every manifest mcore writes for a DSO it made
        entry["library_sha256"] = res.library_sha256
    data = {"schema_version": BINDINGS_SCHEMA_VERSION, "bindings": [entry]}
    write_json(manifest, BindingsManifest.from_dict(data, manifest).to_dict())
    return res.library, manifest, res.arch


def _correctness(
    cfg: WatchConfig, kind: str, manifest: Path, progress: Progress, announce: LineFn | None
) -> GateResult[LogitsDetails] | GateResult[EmbeddingsDetails]:
    """`mcore verify logits` (decoders) or the embeddings gate on both pipelines (encoders), each
    pipeline constructed here, bound to this round's manifest."""
    from .gates import EmbeddingsGate, GateHooks, LogitsGate

    if kind == "decoder":
        gate = LogitsGate(
            str(cfg.native_bundle),
            str(cfg.slot_bundle),
            str(manifest),
            cfg.prompt,
            max_new_tokens=cfg.max_new_tokens,
            max_abs=LogitsGate.max_abs if cfg.max_abs is None else cfg.max_abs,
            device=cfg.device,
            engine=cfg.engine,
        )
        return gate.run(GateHooks(progress=progress, announce=announce))
    from ..runtime.pipeline import EncoderPipeline

    progress.report("loading the native pipeline", 0.0)
    native = EncoderPipeline(
        str(cfg.native_bundle), device=cfg.device, engine=cfg.engine, progress=progress.part(0, 0.4)
    )
    progress.report("loading the external pipeline", 0.4)
    slot = EncoderPipeline(
        str(cfg.slot_bundle),
        kernel_bindings=str(manifest),
        device=cfg.device,
        engine=cfg.engine,
        progress=progress.part(0.4, 0.8),
        announce=announce,
    )
    mode, normalize, _ = native.pooling()
    a, b = native.embed(cfg.prompt, mode, normalize), slot.embed(cfg.prompt, mode, normalize)
    limit = EmbeddingsGate.max_abs if cfg.max_abs is None else cfg.max_abs
    return EmbeddingsGate(a, b, max_abs=limit, min_cosine=cfg.min_cosine).run()


def _perf(
    cfg: WatchConfig, kind: str, manifest: Path, progress: Progress, log: LineFn | None
) -> GateResult[PerfDetails]:
    """The perf gate (`mcore verify perf`'s implementation) on fresh-process benchmark runs."""
    from .gates import BenchArms, GateHooks, PerfGate, PerfOptions

    n = cfg.max_new_tokens if kind == "decoder" else None
    arms = BenchArms(kind, cfg.prompt, n, cfg.bench_warmup, cfg.bench_runs, cfg.device, cfg.engine)
    options = PerfOptions(pairs=cfg.pairs, min_ratio=cfg.min_ratio, warmup=cfg.warmup, metric=cfg.metric)
    gate = PerfGate.for_bundles(arms, cfg.native_bundle, cfg.slot_bundle, str(manifest), options)
    return gate.run(GateHooks(progress=progress, on_line=log))
