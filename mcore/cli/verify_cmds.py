"""`mcore verify tokens|embeddings|perf|reference|logits`: the correctness and no-regression gates.

Exit codes (mcore/verdicts.py): 0 PASS or PROMOTE, 1 FAIL or REJECT, 2 bad input (through UserError
in main), 3 INCONCLUSIVE (the perf gate's interval straddles its threshold)."""

from __future__ import annotations

import argparse

from .. import verify_perf as P
from ..verify import GateResult, compare_embeddings, compare_tokens, perf_gate


def _report(result: GateResult, printed_info: bool = False) -> int:
    if not printed_info:
        for line in result.info:
            print(line)
    print(result.line, flush=True)
    return result.exit_code


def cmd_tokens(ns: argparse.Namespace) -> int:
    return _report(compare_tokens(ns.native, ns.external))


def cmd_embeddings(ns: argparse.Namespace) -> int:
    return _report(compare_embeddings(ns.native, ns.byok, max_abs=ns.max_abs, min_cosine=ns.min_cosine))


def pairs_arg(text: str) -> int | str:
    """--pairs N or auto (the gate checks the value: one line, exit 2)."""
    return int(text) if text.strip().lstrip("+-").isdigit() else text


def cmd_perf(ns: argparse.Namespace) -> int:
    result = perf_gate(
        ns.native,
        ns.external,
        pairs=pairs_arg(ns.pairs),
        min_ratio=ns.min_ratio,
        warmup=ns.warmup,
        on_line=lambda line: print(line, flush=True),
        metric=ns.metric,
        max_pairs=ns.max_pairs,
        budget_s=ns.budget_s,
        confidence=ns.confidence,
    )
    return _report(result, printed_info=True)


def cmd_reference(ns: argparse.Namespace) -> int:
    from ..tokenization import check_prompt
    from ..verify_reference import reference_check
    from .graph_cmds import stderr_progress

    check_prompt(ns.prompt)
    return _report(
        reference_check(
            ns.bundle,
            ns.checkpoint,
            ns.prompt,
            max_new_tokens=ns.max_new_tokens,
            chat=ns.chat,
            kernel_bindings=ns.kernel_bindings,
            device=ns.device,
            min_cosine=ns.min_cosine,
            max_abs=ns.max_abs,
            progress=stderr_progress(),
            max_rel=ns.max_rel,
        )
    )


def cmd_logits(ns: argparse.Namespace) -> int:
    from ..tokenization import check_prompt
    from ..verify_logits import lockstep_logits
    from .graph_cmds import stderr_progress

    check_prompt(ns.prompt)
    return _report(
        lockstep_logits(
            ns.native,
            ns.external,
            ns.kernel_bindings,
            ns.prompt,
            max_new_tokens=ns.max_new_tokens,
            max_abs=ns.max_abs,
            chat=ns.chat,
            device=ns.device,
            engine=ns.engine,
            progress=stderr_progress(),
        )
    )


def register(sub: argparse._SubParsersAction) -> None:
    from .main import Parser

    v = sub.add_parser("verify", help="promotion gates: exact tokens, embedding numerics, no perf regression")
    vs = v.add_subparsers(dest="verify_verb", metavar="GATE", parser_class=Parser)
    vs.required = True

    p = vs.add_parser("tokens", help="compare `mcore run --output` JSONL files token by token")
    p.add_argument("native", help="native.jsonl")
    p.add_argument("external", help="external.jsonl")
    p.set_defaults(func=cmd_tokens)

    p = vs.add_parser("embeddings", help="the numerical gate on `mcore embed` outputs (max abs diff, cosine)")
    p.add_argument("native", help="native.json")
    p.add_argument("byok", help="byok.json")
    p.add_argument("--max-abs", type=float, default=0.02, help="largest allowed absolute difference (default 0.02)")
    p.add_argument("--min-cosine", type=float, default=0.999, help="smallest allowed cosine similarity (default 0.999)")
    p.set_defaults(func=cmd_embeddings)

    p = vs.add_parser(
        "perf",
        help="alternating fresh-process benchmark pairs; PROMOTE/REJECT/INCONCLUSIVE from a t-interval of the ratios",
    )
    p.add_argument("--native", required=True, metavar="CMD", help="shell command printing the native benchmark line")
    p.add_argument(
        "--external", required=True, metavar="CMD", help="shell command printing the external benchmark line"
    )
    p.add_argument(
        "--pairs",
        default=str(P.DEFAULT_PAIRS),
        metavar="N|auto",
        help=f"measured pairs, 2 or more (default {P.DEFAULT_PAIRS}); auto: check after each pair from "
        f"pair {P.FIRST_LOOK} on and stop once decided (bounded by --max-pairs and --budget-s)",
    )
    p.add_argument(
        "--min-ratio",
        type=float,
        default=P.DEFAULT_MIN_RATIO,
        help=f"external/native threshold the interval must clear (default {P.DEFAULT_MIN_RATIO})",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=P.DEFAULT_CONFIDENCE,
        help=f"two-sided confidence of the interval (default {P.DEFAULT_CONFIDENCE}; with --pairs auto, "
        "overall, split over the checks)",
    )
    p.add_argument(
        "--max-pairs",
        type=int,
        default=None,
        help=f"--pairs auto: measure at most this many pairs (default {P.DEFAULT_MAX_PAIRS})",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"--pairs auto: start no new pair after this many seconds (the first {P.FIRST_LOOK} always run; default: no limit)",
    )
    p.add_argument("--warmup", type=int, default=1, help="warm-up runs of each command first (default 1)")
    p.add_argument(
        "--metric",
        choices=P.METRICS,
        default=P.DEFAULT_METRIC,
        help="auto (default): device where the lines carry device_step_ms (CUDA), else min-step, else throughput; "
        "device: the device time per step; min-step: each run's fastest step (steady on a loaded CPU); "
        "throughput: the wall-clock tokens/s the tutorial compares",
    )
    p.set_defaults(func=cmd_perf)

    p = vs.add_parser("reference", help="the engine against transformers on the same checkpoint and prompt")
    p.add_argument("bundle", help="a bundle built from --checkpoint")
    p.add_argument("--checkpoint", required=True, help="the checkpoint folder (or demo:NAME) the bundle was built from")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=8, help="decoder steps compared (default 8)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    p.add_argument("--kernel-bindings", default=None, help="bind the bundle's kernel slots (checks the kernel too)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: the bundle's, else auto)")
    p.add_argument("--min-cosine", type=float, default=0.999, help="smallest allowed cosine per step (default 0.999)")
    p.add_argument("--max-abs", type=float, default=None, help="largest allowed abs difference (default: not gated)")
    p.add_argument(
        "--max-rel",
        type=float,
        default=0.05,
        help="largest allowed relative error per step: max_abs over the reference's largest magnitude (default 0.05)",
    )
    p.set_defaults(func=cmd_reference)

    p = vs.add_parser(
        "logits", help="a native and a slot bundle in lockstep: per-step logit max_abs and the first greedy divergence"
    )
    p.add_argument("native", help="the native bundle")
    p.add_argument("external", help="its slot twin (same model and KV capacity)")
    p.add_argument("--kernel-bindings", default=None, help="the manifest binding the external bundle's slots")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=16, help="steps compared (default 16)")
    p.add_argument(
        "--max-abs",
        type=float,
        default=0.0,
        help="largest allowed abs difference at any step (default 0: bit-identical)",
    )
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: the bundle's, else auto)")
    p.add_argument("--engine", default="auto", help="auto | compiled | torch (default auto)")
    p.set_defaults(func=cmd_logits)
