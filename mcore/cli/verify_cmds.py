"""`mcore verify tokens|embeddings|perf|reference|logits`: the correctness and no-regression gates.

Each command builds its gate from the flags (mcore/verify/gates.py, whose classes hold the defaults the
flags show) and runs it as the workbench's gate actions do.

Exit codes (mcore/verify/verdicts.py): 0 PASS or PROMOTE, 1 FAIL or REJECT, 2 bad input (through UserError
in main), 3 INCONCLUSIVE (the perf gate's interval straddles its threshold)."""

from __future__ import annotations

import argparse

from ..verify import perf as P
from ..verify.gates import (
    ENGINES,
    EmbeddingsGate,
    GateHooks,
    LogitsGate,
    PerfGate,
    PerfOptions,
    ReferenceGate,
    TokensGate,
)
from ..verify.verdicts import GateResult
from .args import path_arg

Sub = argparse._SubParsersAction
CHAT_HELP = "wrap the prompt in the checkpoint's chat template"
DEVICE_HELP = "cpu | cuda | cuda:N (default: the bundle's, else auto)"


def _report(result: GateResult, printed_info: bool = False) -> int:
    if not printed_info:
        for line in result.info:
            print(line)
    print(result.line, flush=True)
    return result.exit_code


def _progress_hooks() -> GateHooks:
    from .progress_lines import stderr_progress

    return GateHooks(progress=stderr_progress())


def cmd_tokens(ns: argparse.Namespace) -> int:
    return _report(TokensGate(ns.native, ns.external).run())


def cmd_embeddings(ns: argparse.Namespace) -> int:
    return _report(EmbeddingsGate(ns.native, ns.byok, max_abs=ns.max_abs, min_cosine=ns.min_cosine).run())


def pairs_arg(text: str) -> int | str:
    """--pairs N or auto (the gate checks the value: one line, exit 2)."""
    return int(text) if text.strip().lstrip("+-").isdigit() else text


def perf_options(ns: argparse.Namespace) -> PerfOptions:
    return PerfOptions(
        pairs=pairs_arg(ns.pairs),
        min_ratio=ns.min_ratio,
        confidence=ns.confidence,
        max_pairs=ns.max_pairs,
        budget_s=ns.budget_s,
        warmup=ns.warmup,
        metric=ns.metric,
    )


def cmd_perf(ns: argparse.Namespace) -> int:
    gate = PerfGate(ns.native, ns.external, perf_options(ns))
    result = gate.run(GateHooks(on_line=lambda line: print(line, flush=True)))
    return _report(result, printed_info=True)


def cmd_reference(ns: argparse.Namespace) -> int:
    gate = ReferenceGate(
        ns.bundle,
        ns.checkpoint,
        ns.prompt,
        max_new_tokens=ns.max_new_tokens,
        chat=ns.chat,
        kernel_bindings=ns.kernel_bindings,
        device=ns.device,
        min_cosine=ns.min_cosine,
        max_abs=ns.max_abs,
        max_rel=ns.max_rel,
    )
    return _report(gate.run(_progress_hooks()))


def cmd_logits(ns: argparse.Namespace) -> int:
    gate = LogitsGate(
        ns.native,
        ns.external,
        ns.kernel_bindings,
        ns.prompt,
        max_new_tokens=ns.max_new_tokens,
        max_abs=ns.max_abs,
        chat=ns.chat,
        device=ns.device,
        engine=ns.engine,
    )
    return _report(gate.run(_progress_hooks()))


# ---------------------------------------------------------------------------- the parsers


def register(sub: Sub) -> None:
    from .main import Parser

    v = sub.add_parser("verify", help="promotion gates: exact tokens, embedding numerics, no perf regression")
    vs = v.add_subparsers(dest="verify_verb", metavar="GATE", parser_class=Parser)
    vs.required = True
    _tokens_parser(vs)
    _embeddings_parser(vs)
    _perf_parser(vs)
    _reference_parser(vs)
    _logits_parser(vs)


def _tokens_parser(vs: Sub) -> None:
    p = vs.add_parser("tokens", help="compare `mcore run --output` JSONL files token by token")
    p.add_argument("native", type=path_arg, help="native.jsonl")
    p.add_argument("external", type=path_arg, help="external.jsonl (the same prompts, in the same order)")
    p.set_defaults(func=cmd_tokens)


def _embeddings_parser(vs: Sub) -> None:
    d = EmbeddingsGate
    p = vs.add_parser("embeddings", help="the numerical gate on `mcore embed` outputs (max abs diff, cosine)")
    p.add_argument("native", type=path_arg, help="native.json")
    p.add_argument("byok", type=path_arg, help="byok.json")
    p.add_argument(
        "--max-abs", type=float, default=d.max_abs, help=f"largest allowed absolute difference (default {d.max_abs})"
    )
    p.add_argument(
        "--min-cosine",
        type=float,
        default=d.min_cosine,
        help=f"smallest allowed cosine similarity (default {d.min_cosine})",
    )
    p.set_defaults(func=cmd_embeddings)


def _perf_parser(vs: Sub) -> None:
    p = vs.add_parser(
        "perf",
        help="alternating fresh-process benchmark pairs; PROMOTE/REJECT/INCONCLUSIVE from a t-interval of the ratios",
    )
    p.add_argument("--native", required=True, metavar="CMD", help="shell command printing the native benchmark line")
    p.add_argument(
        "--external", required=True, metavar="CMD", help="shell command printing the external benchmark line"
    )
    _perf_decision_args(p)
    _perf_auto_args(p)
    _perf_run_args(p)
    p.set_defaults(func=cmd_perf)


def _perf_decision_args(p: argparse.ArgumentParser) -> None:
    """How many pairs, the threshold and the interval's confidence."""
    d = PerfOptions
    p.add_argument(
        "--pairs",
        default=str(d.pairs),
        metavar="N|auto",
        help=f"measured pairs, 2 or more (default {d.pairs}); auto: check after each pair from "
        f"pair {P.FIRST_LOOK} on and stop once decided (bounded by --max-pairs and --budget-s)",
    )
    p.add_argument(
        "--min-ratio",
        type=float,
        default=d.min_ratio,
        help=f"external/native threshold the interval must clear (default {d.min_ratio})",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=d.confidence,
        help=f"two-sided confidence of the interval (default {d.confidence}; with --pairs auto, "
        "overall, split over the checks)",
    )


def _perf_auto_args(p: argparse.ArgumentParser) -> None:
    """--pairs auto's bounds."""
    p.add_argument(
        "--max-pairs",
        type=int,
        default=PerfOptions.max_pairs,
        help=f"--pairs auto: measure at most this many pairs (default {P.DEFAULT_MAX_PAIRS})",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=PerfOptions.budget_s,
        metavar="SECONDS",
        help=f"--pairs auto: start no new pair after this many seconds (the first {P.FIRST_LOOK} always run; default: no limit)",
    )


def _perf_run_args(p: argparse.ArgumentParser) -> None:
    """The warm-up runs and what each run is measured by."""
    d = PerfOptions
    p.add_argument(
        "--warmup", type=int, default=d.warmup, help=f"warm-up runs of each command first (default {d.warmup})"
    )
    p.add_argument(
        "--metric",
        choices=P.METRICS,
        default=d.metric,
        help="auto (default): device where the lines carry device_step_ms (CUDA), else min-step, else throughput; "
        "device: the device time per step; min-step: each run's fastest step (steady on a loaded CPU); "
        "throughput: the wall-clock tokens/s the tutorial compares",
    )


def _reference_parser(vs: Sub) -> None:
    d = ReferenceGate
    p = vs.add_parser("reference", help="the engine against transformers on the same checkpoint and prompt")
    p.add_argument("bundle", type=path_arg, help="a bundle built from --checkpoint")
    p.add_argument(
        "--checkpoint",
        type=path_arg,
        required=True,
        help="the checkpoint folder (or demo:NAME) the bundle was built from",
    )
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.max_new_tokens,
        help=f"decoder steps compared (default {d.max_new_tokens})",
    )
    p.add_argument("--chat", action="store_true", help=CHAT_HELP)
    p.add_argument(
        "--kernel-bindings", type=path_arg, default=None, help="bind the bundle's kernel slots (checks the kernel too)"
    )
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument(
        "--min-cosine",
        type=float,
        default=d.min_cosine,
        help=f"smallest allowed cosine per step (default {d.min_cosine})",
    )
    p.add_argument(
        "--max-abs", type=float, default=d.max_abs, help="largest allowed abs difference (default: not gated)"
    )
    p.add_argument(
        "--max-rel",
        type=float,
        default=d.max_rel,
        help=f"largest allowed relative error per step: max_abs over the reference's largest magnitude (default {d.max_rel})",
    )
    p.set_defaults(func=cmd_reference)


def _logits_parser(vs: Sub) -> None:
    d = LogitsGate
    p = vs.add_parser(
        "logits", help="a native and a slot bundle in lockstep: per-step logit max_abs and the first greedy divergence"
    )
    p.add_argument("native", type=path_arg, help="the native bundle (no kernel slots)")
    p.add_argument("external", type=path_arg, help="its slot twin (the same model and BUILD_ARGS)")
    p.add_argument(
        "--kernel-bindings", type=path_arg, default=None, help="the manifest binding the external bundle's slots"
    )
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--max-new-tokens", type=int, default=d.max_new_tokens, help=f"steps compared (default {d.max_new_tokens})"
    )
    p.add_argument(
        "--max-abs",
        type=float,
        default=d.max_abs,
        help="largest allowed abs difference at any step (default 0: bit-identical)",
    )
    _chat_device_args(p)
    p.add_argument("--engine", default=d.engine, help=f"{' | '.join(ENGINES)} (default {d.engine})")
    p.set_defaults(func=cmd_logits)


def _chat_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat", action="store_true", help=CHAT_HELP)
    p.add_argument("--device", default=None, help=DEVICE_HELP)
