"""`mcore verify tokens|embeddings|perf`: the correctness and no-regression gates.

Exit codes: 0 PASS, 1 FAIL, 2 bad input (through UserError in main)."""

from __future__ import annotations

import argparse

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


def cmd_perf(ns: argparse.Namespace) -> int:
    result = perf_gate(ns.native, ns.external, pairs=ns.pairs, min_ratio=ns.min_ratio, warmup=ns.warmup,
                       on_line=lambda line: print(line, flush=True))
    return _report(result, printed_info=True)


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

    p = vs.add_parser("perf", help="alternating fresh-process benchmark pairs; median external/native ratio")
    p.add_argument("--native", required=True, metavar="CMD", help="shell command printing the native benchmark line")
    p.add_argument("--external", required=True, metavar="CMD", help="shell command printing the external benchmark line")
    p.add_argument("--pairs", type=int, default=6, help="measured pairs (default 6)")
    p.add_argument("--min-ratio", type=float, default=0.98, help="lowest allowed median ratio (default 0.98)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up runs of each command first (default 1)")
    p.set_defaults(func=cmd_perf)
