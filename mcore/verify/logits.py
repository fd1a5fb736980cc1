"""`mcore verify logits`: a native and a slot pipeline in lockstep, logits compared per step.

The token gate says whether two greedy runs agree; this says by how much their logits differ at
every step before that, and where the greedy pick first diverges. Both pipelines are fed the same
tokens (the native run's greedy tokens), so a divergence at one step does not change what the
later steps see. The default threshold is 0: bit-identical logits, the compiled engine's contract
for a slot whose kernel computes exactly what the region did (an identity copy, for one)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..common.errors import UserError, first_few
from ..common.progress import NO_PROGRESS, Progress
from .compare import GateResult, check_threshold
from .details import LogitsDetails, LogitsStep

if TYPE_CHECKING:
    from ..bundle.manifest import BundleManifest


def lockstep_logits(
    native_bundle: str,
    external_bundle: str,
    kernel_bindings: str | None,
    prompt: str,
    max_new_tokens: int = 16,
    max_abs: float = 0.0,
    chat: bool = False,
    device: str | None = None,
    engine: str = "auto",
    progress: Progress = NO_PROGRESS,
    announce=None,
) -> GateResult[LogitsDetails]:
    """PASS when every step's max |native - external| over the vocabulary is at most `max_abs`."""
    from ..runtime.bindings import check_bindings
    from ..runtime.pipeline import DecoderPipeline, check_prompts_fit

    max_abs = check_threshold("--max-abs", max_abs, 0.0)
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens} must be at least 1")
    nb, eb = _open_twins(native_bundle, external_bundle)
    # what would fail once the native pipeline is loaded (an 8B model: a minute), said before it loads
    check_prompts_fit(nb, [prompt], max_new_tokens, chat)
    check_bindings(kernel_bindings, eb.runnable().kernel_slots)
    progress.report("loading the native pipeline", 0.0)
    native = DecoderPipeline(native_bundle, device=device, engine=engine, progress=progress.part(0.0, 0.4), bundle=nb)
    native.chat = chat
    ids = native.encode(prompt)
    progress.report("loading the external pipeline", 0.4)
    external = DecoderPipeline(
        external_bundle,
        kernel_bindings=kernel_bindings,
        device=device,
        engine=engine,
        progress=progress.part(0.4, 0.8),
        announce=announce,
        bundle=eb,
    )
    progress.report("native greedy run", 0.8)
    tokens = native.generate(prompt, max_new_tokens, greedy=True, stop_at_eos=False).tokens
    forced = tokens[:-1]  # the logits after the prompt pick tokens[0], after tokens[k-1] pick tokens[k]
    progress.report("stepping both pipelines in lockstep", 0.9)
    steps, first = _compare_steps(native.step_logits(ids, forced), external.step_logits(ids, forced))
    return _lockstep_result(steps, first, tokens, max_abs, native.engine_name, str(native.device))


def _open_twins(native_bundle: str, external_bundle: str):
    """Both bundles, refused before any DSO loads unless the first has no slots and they share the
    model, the KV capacity and the rest of the build (check_same_build)."""
    from ..bundle.container import open_bundle

    nb, eb = open_bundle(native_bundle), open_bundle(external_bundle)
    nm, em = nb.runnable(), eb.runnable()
    check_native(nm, native_bundle, "the first bundle must be the native one (no slots), the second its slot twin")
    if em.model != nm.model or em.graph_args.get("max_cache_length") != nm.graph_args.get("max_cache_length"):
        raise UserError(
            f"{external_bundle} is not built from the same model and KV capacity as {native_bundle}; "
            "compare a slot bundle with its native twin"
        )
    check_same_build(nm, em, native_bundle, external_bundle)
    return nb, eb


def check_native(nm: BundleManifest, path: object, usage: str) -> None:
    """The native side of a gate is loaded without bindings: a slot bundle there (swapped arguments) would
    fail only once it runs, naming a slot, or in `kernel watch` after each round's export. Refused first."""
    if nm.kernel_slots:
        names = sorted({s.label for s in nm.kernel_slots})
        raise UserError(f"{path} has kernel slots ({len(nm.kernel_slots)}: {first_few(names)}); {usage}")


def check_same_build(nm: BundleManifest, em: BundleManifest, native_bundle: object, external_bundle: object) -> None:
    """Twins differ only by their slots: the graph args (precision, capacity, layout, sequence length) and
    the weights (checkpoint, or random with the same seed) must match, or a gate FAIL would blame a
    kernel for two different builds."""
    keys = sorted(set(nm.graph_args) | set(em.graph_args))
    recorded = [(k, nm.graph_args.get(k), em.graph_args.get(k)) for k in keys]
    nw, ew = nm.build_args.get("weights"), em.build_args.get("weights")
    recorded.append(("weights", nw, ew))
    if nw == ew == "random":
        recorded.append(("seed", nm.build_args.get("seed"), em.build_args.get("seed")))
    for key, a, b in recorded:
        if a != b:
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{external_bundle} is built with {flag} {_shown(b)} but {native_bundle} with {flag} {_shown(a)}; "
                "build the native bundle and its slot twin with the same BUILD_ARGS"
            )


def _shown(value: object) -> str:
    return "(not recorded)" if value is None else str(value)


def _compare_steps(a, b) -> tuple[list[dict], int | None]:
    """Per step: max |a - b| (inf when either side is not finite) and both greedy picks; the first step they differ."""
    steps, first = [], None
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        x, y = x.reshape(-1), y.reshape(-1)
        diff = (x - y).abs()
        m = float(diff.max()) if bool(diff.isfinite().all()) else math.inf
        pick_a, pick_b = int(x.argmax()), int(y.argmax())
        steps.append({"step": k, "max_abs": m, "native": pick_a, "external": pick_b})
        if first is None and pick_a != pick_b:
            first = k
    return steps, first


def _lockstep_result(
    steps: list[dict], first: int | None, tokens: list[int], max_abs: float, engine: str, device: str
) -> GateResult[LogitsDetails]:
    """The verdict line, one info line per step, and the details the CLI and the TUI read."""
    worst = max(s["max_abs"] for s in steps)
    per_step = tuple(LogitsStep(s["step"], s["max_abs"], s["native"], s["external"]) for s in steps)
    details = LogitsDetails(per_step, worst, first, tuple(tokens), max_abs, engine, device)
    info = [
        f"step {s['step']}: max_abs {s['max_abs']:.6g} greedy native={s['native']} external={s['external']}"
        + ("  <- first divergence" if s["step"] == first else "")
        for s in steps
    ]
    where = "no greedy divergence" if first is None else f"greedy picks first differ at step {first}"
    verdict = "PASS" if worst <= max_abs else "FAIL"
    limit = "bit-identical" if max_abs == 0 else f"<= {max_abs:g}"
    line = (
        f"{verdict}: logits over {len(steps)} steps in lockstep: worst max_abs {worst:.6g} (limit {limit}); "
        f"{where} (engine {engine}, {device})"
    )
    return GateResult(worst <= max_abs, line, details, info)
