"""`mcore kernel list | build | stub`: the shipped TVM-FFI kernels and the CuTe DSL exporter stub."""

from __future__ import annotations

import argparse
import sys

from ..dso import library_sha256
from ..exporters import SHIPPED_EXPORTERS, run_exporter
from ..kernels import CUDA_MODES, KERNELS, build_kernel
from ..stubgen import write_exporter

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

    ls = sub.add_parser("list", help="list the kernels `mcore kernel build` can build")
    ls.set_defaults(func=cmd_list)

    b = sub.add_parser(
        "build",
        help="build a shipped kernel into a TVM-FFI DSO exporting `run`",
        description="Build a shipped kernel (see `mcore kernel list`) into a TVM-FFI DSO.",
    )
    b.add_argument("name", metavar="NAME", help=f"kernel name: {', '.join(sorted(KERNELS))}")
    b.add_argument("-o", "--output", required=True, metavar="PATH", help="DSO to write, e.g. work/kernel.so")
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
    s.add_argument("selection", metavar="RECEIPT", help="selection receipt (.selection.json)")
    s.add_argument("--snapshot", required=True, metavar="SNAPSHOT", help="the graph snapshot the receipt was made from")
    s.add_argument("-o", "--output", required=True, metavar="PATH", help="exporter to write, e.g. kernels/my_kernel.py")
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
    e.add_argument("exporter", metavar="EXPORTER", help="shipped exporter name or exporter script (.py)")
    e.add_argument("--selection", required=True, metavar="RECEIPT", help="selection receipt (.selection.json)")
    e.add_argument("--snapshot", metavar="SNAPSHOT", help="graph snapshot the receipt was made from (also checked)")
    e.add_argument("-o", "--output", required=True, metavar="PATH", help="DSO to write (never replaced)")
    e.set_defaults(func=cmd_export)


def cmd_list(args: argparse.Namespace) -> int:
    width = max(len(n) for n in KERNELS)
    for name in sorted(KERNELS):
        k = KERNELS[name]
        print(f"{name:<{width}}  {k.description}")
        print(f"{'':<{width}}  ABI: {k.abi}")
        print(f"{'':<{width}}  dtypes: {', '.join(k.dtypes)}; sources: {', '.join('kernels/' + s for s in k.sources)}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    def progress(step: str, fraction: float) -> None:
        print(f"[{fraction * 100:3.0f}%] {step}", file=sys.stderr)

    built = build_kernel(args.name, args.output, cuda=args.cuda, progress=progress, overwrite=args.force)
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


def cmd_export(args: argparse.Namespace) -> int:
    res = run_exporter(
        args.exporter, args.selection, args.output, snapshot=args.snapshot, log=lambda line: print(line, flush=True)
    )
    print(f"exported {res.library}")
    print(f"library_sha256={res.library_sha256}  (a bindings manifest entry may pin it)")
    print(TRUST_NOTE)
    return 0
