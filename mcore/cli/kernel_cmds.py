"""`mcore kernel list | build | stub`: the shipped TVM-FFI kernels and the CuTe DSL exporter stub."""

from __future__ import annotations

import argparse
import sys

from ..common.errors import UserError
from ..kernels.dso import library_sha256
from ..kernels.exporters import SHIPPED_EXPORTERS, kernel_catalog, run_exporter
from ..kernels.shipped import CUDA_MODES, KERNELS, build_kernel
from ..kernels.stubgen import write_exporter
from ..verify.perf import METRICS, PERF_DEFAULTS
from ..verify.verdicts import EXIT_CODES, EXIT_INCONCLUSIVE
from .args import path_arg
from .progress_lines import ProgressLines

TRUST_NOTE = "note: a DSO runs native code when it is loaded; bind only libraries you trust."


def register(subparsers) -> None:
    from .main import Parser

    p = subparsers.add_parser(
        "kernel",
        help="build the shipped kernels, generate a CuTe DSL exporter stub",
        description="Build the shipped TVM-FFI kernels or generate a CuTe DSL exporter stub.",
    )
    sub = p.add_subparsers(dest="kernel_verb", metavar="ACTION", parser_class=Parser)
    sub.required = True

    ls = sub.add_parser(
        "list", help="list the shipped kernels: those `kernel build` builds and those `kernel export` exports"
    )
    ls.set_defaults(func=cmd_list)

    b = sub.add_parser(
        "build",
        help="build a shipped kernel into a TVM-FFI DSO exporting `run`",
        description="Build a shipped kernel (see `mcore kernel list`) into a TVM-FFI DSO.",
    )
    b.add_argument("name", metavar="NAME", help=f"kernel name: {', '.join(sorted(KERNELS))}")
    b.add_argument(
        "-o", "--output", type=path_arg, required=True, metavar="PATH", help="DSO to write, e.g. work/kernel.so"
    )
    b.add_argument(
        "--cuda",
        choices=CUDA_MODES,
        default="auto",
        help="auto: build the CUDA path when a CUDA toolkit is found (default); on: require it; off: CPU only",
    )
    b.add_argument("--force", action="store_true", help="replace an existing output")
    b.set_defaults(func=cmd_build)

    s = sub.add_parser(
        "stub",
        help="generate a CuTe DSL exporter for a selection receipt",
        description="Generate a self-contained CuTe DSL exporter (Python) for a selection receipt.",
    )
    s.add_argument("selection", type=path_arg, metavar="RECEIPT", help="selection receipt (.selection.json)")
    s.add_argument(
        "--snapshot",
        type=path_arg,
        required=True,
        metavar="SNAPSHOT",
        help="the graph snapshot the receipt was made from",
    )
    s.add_argument(
        "-o",
        "--output",
        type=path_arg,
        required=True,
        metavar="PATH",
        help="exporter to write, e.g. kernels/my_kernel.py",
    )
    s.add_argument("--force", action="store_true", help="replace an existing output")
    s.set_defaults(func=cmd_stub)

    e = sub.add_parser(
        "export",
        help="run a kernel exporter (a shipped one or a stub) for a selection receipt",
        description="Run a kernel exporter for a selection receipt: it compiles the kernel and writes "
        "one TVM-FFI DSO. EXPORTER is a shipped exporter's name "
        f"({', '.join(SHIPPED_EXPORTERS)}) or an exporter script such as "
        "`mcore kernel stub` writes.",
    )
    e.add_argument("exporter", type=path_arg, metavar="EXPORTER", help="shipped exporter name or exporter script (.py)")
    e.add_argument(
        "--selection", type=path_arg, required=True, metavar="RECEIPT", help="selection receipt (.selection.json)"
    )
    e.add_argument(
        "--snapshot", type=path_arg, metavar="SNAPSHOT", help="graph snapshot the receipt was made from (also checked)"
    )
    e.add_argument("-o", "--output", type=path_arg, required=True, metavar="PATH", help="DSO to write")
    e.add_argument("--force", action="store_true", help="replace an existing output (once the export succeeded)")
    e.set_defaults(func=cmd_export)
    _register_watch(sub)


def _register_watch(sub) -> None:
    w = sub.add_parser(
        "watch",
        help="the edit-export-verify loop: re-export on every save, then the gates on a new pipeline",
        description="Export EXPORTER for the receipt, bind the DSO to a NEW pipeline of the slot bundle and run "
        "the correctness gate in lockstep against the native bundle (`verify logits`; encoders: the embeddings "
        "gate), then the perf gate (`verify perf`). Again each time the exporter file's content changes, one "
        "line per round. Ctrl-C stops. Exit 0 when the last round promoted (or passed, with --no-perf), 3 when "
        "it was INCONCLUSIVE, else 1.",
    )
    w.add_argument(
        "exporter", type=path_arg, metavar="EXPORTER", help="exporter script (.py, the file watched) or shipped name"
    )
    w.add_argument(
        "--selection",
        type=path_arg,
        required=True,
        metavar="RECEIPT",
        help="the receipt the slot bundle was built from",
    )
    w.add_argument("--bundle", type=path_arg, required=True, metavar="SLOT_BUNDLE", help="the slot-ready bundle")
    w.add_argument("--native", type=path_arg, required=True, metavar="NATIVE_BUNDLE", help="its native twin")
    w.add_argument(
        "--snapshot", type=path_arg, metavar="SNAPSHOT", help="graph snapshot the receipt was made from (for stubs)"
    )
    w.add_argument("--prompt", default=WATCH_PROMPT, help=f"the text both pipelines run (default {WATCH_PROMPT!r})")
    w.add_argument("--max-new-tokens", type=int, default=8, help="decoder steps compared and generated (default 8)")
    w.add_argument(
        "--max-abs", type=float, default=None, help="largest allowed abs difference (default 0; encoders 0.02)"
    )
    w.add_argument("--no-perf", dest="perf", action="store_false", help="correctness only (no perf gate)")
    w.add_argument("--pairs", type=int, default=None, help="perf gate pairs, at least 2 (default 3)")
    w.add_argument(
        "--min-ratio",
        type=float,
        default=None,
        help=f"perf gate: lowest allowed ratio (default {PERF_DEFAULTS.min_ratio:g})",
    )
    w.add_argument("--warmup", type=int, default=None, help="perf gate warm-up runs of each arm (default 1)")
    w.add_argument("--bench-warmup", type=int, default=None, help="each benchmark run's own warm-up (default 2)")
    w.add_argument("--bench-runs", type=int, default=None, help="each benchmark run's measured runs (default 5)")
    w.add_argument(
        "--metric",
        choices=METRICS,
        default=None,
        help=f"as `verify perf` (default {PERF_DEFAULTS.metric})",
    )
    w.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: the bundle's, else auto)")
    w.add_argument("--engine", default="auto", help="auto | compiled | torch (default auto)")
    w.add_argument(
        "--out-dir", default=None, metavar="DIR", help="new or empty folder for the rounds' DSOs and manifests"
    )
    w.add_argument("--rounds", type=int, default=None, metavar="N", help="stop after N rounds (default: until Ctrl-C)")
    w.add_argument("--poll", type=float, default=0.5, metavar="SECONDS", help="how often the file is checked (0.5)")
    w.set_defaults(func=cmd_watch)


def cmd_list(args: argparse.Namespace) -> int:
    rows = kernel_catalog()
    width = max(len(r.name) for r in rows)
    for r in rows:
        print(f"{r.name:<{width}}  {r.description}")
        if r.kind == "build":
            k = KERNELS[r.name]
            print(f"{'':<{width}}  ABI: {k.abi}")
            print(
                f"{'':<{width}}  dtypes: {', '.join(k.dtypes)}; sources: {', '.join('kernels/' + s for s in k.sources)}"
            )
        else:
            print(f"{'':<{width}}  exporter: {r.detail}")
        print(f"{'':<{width}}  {r.command}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    built = build_kernel(args.name, args.output, cuda=args.cuda, progress=ProgressLines(), overwrite=args.force)
    print(f"built {built.kernel}: {built.resolve()}")
    print(f"variant: {built.describe()}")
    print(f"function: {built.function}  (ABI: {KERNELS[built.kernel].abi})")
    print(f"library_sha256={library_sha256(built)}  (a bindings manifest entry may pin it)")
    print(TRUST_NOTE)
    return 0


def cmd_stub(args: argparse.Namespace) -> int:
    res = write_exporter(args.selection, args.snapshot, args.output, overwrite=args.force)
    print(f"wrote {res.path}")
    print(f"binding_id={res.binding_id}")
    print(f"abi_sha256={res.abi_sha256}")
    if res.known:
        print(f"kernel body: generated ({res.known.summary}; {res.known.op})")
    else:
        print(
            f"kernel body: not generated ({res.reason}); write region_kernel in {res.path}, "
            "then set KERNEL_IMPLEMENTED = True"
        )
    if res.example:
        print(
            f"worked example: {res.example} implements this kind of region; try it first: "
            f"python {res.example} --selection {args.selection} --snapshot {args.snapshot} --output KERNEL.so"
        )
    print(f"next: python {res.path} --snapshot {args.snapshot} --selection {args.selection} --output KERNEL.so")
    return 0


WATCH_PROMPT = "Explain grouped-query attention in one sentence."


def cmd_watch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..verify.watch import EXPORTED, WatchConfig, default_out_dir, watch_kernel

    if args.rounds is not None and args.rounds < 1:
        raise UserError(f"--rounds {args.rounds} must be at least 1")
    if not (0 < args.poll <= 60):
        raise UserError(f"--poll {args.poll} must be a number of seconds in (0, 60]")
    # the perf gate's flags, where given (WatchConfig holds their defaults); with --no-perf they would do nothing
    perf_flags = ("pairs", "min_ratio", "warmup", "bench_warmup", "bench_runs", "metric")
    tuned = {k: getattr(args, k) for k in perf_flags if getattr(args, k) is not None}
    if tuned and not args.perf:
        named = ", ".join("--" + k.replace("_", "-") for k in tuned)
        raise UserError(f"{named} tune the perf gate, and --no-perf turns it off; drop one or the other")
    selection = Path(args.selection)
    out = Path(args.out_dir) if args.out_dir else default_out_dir(args.exporter, selection)
    cfg = WatchConfig(
        args.exporter,
        selection,
        Path(args.native),
        Path(args.bundle),
        out,
        args.prompt,
        snapshot=Path(args.snapshot) if args.snapshot else None,
        max_new_tokens=args.max_new_tokens,
        max_abs=args.max_abs,
        perf=args.perf,
        device=args.device,
        engine=args.engine,
        **tuned,
    )

    def err(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    def start() -> None:  # once the inputs passed their checks
        print(
            f"watching {args.exporter}: rounds go to {out}; save it for the next round (Ctrl-C stops)", file=sys.stderr
        )
        print(TRUST_NOTE, file=sys.stderr)

    history = watch_kernel(
        cfg,
        rounds=args.rounds,
        on_round=lambda r: print(r.line(), flush=True),
        log=err,
        announce=err,
        poll_s=args.poll,
        on_start=start,
    )
    # the last round's verdict, with `verify`'s exit codes (0 PROMOTE/PASS, 1 REJECT, 3 INCONCLUSIVE);
    # 3 also for EXPORTED (no gate could judge it here), ERROR 1
    last = history[-1].verdict if history else "ERROR"
    return EXIT_INCONCLUSIVE if last == EXPORTED else EXIT_CODES.get(last, 1)


def cmd_export(args: argparse.Namespace) -> int:
    res = run_exporter(
        args.exporter,
        args.selection,
        args.output,
        snapshot=args.snapshot,
        log=lambda line: print(line, flush=True),
        overwrite=args.force,
    )
    print(f"exported {res.library}")
    print(f"library_sha256={res.library_sha256}  (a bindings manifest entry may pin it)")
    print(TRUST_NOTE)
    return 0
