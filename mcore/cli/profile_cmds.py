"""`mcore profile`: where the time goes, in the model's own terms; `mcore profile diff`."""

from __future__ import annotations

import argparse
import sys

from ..common.errors import UserError
from ..common.fileio import check_overwrite, write_json
from .args import path_arg
from .progress_lines import stderr_progress


def cmd_profile(ns: argparse.Namespace) -> int:
    if ns.bundle == "diff":
        if len(ns.rest) != 2:
            raise UserError("mcore profile diff A.json B.json: give two profile files")
        from ..profile.profiler import diff_lines, load_profile

        a, b = (load_profile(p) for p in ns.rest)
        for line in diff_lines(a, b, ns.rest):
            print(line)
        return 0
    if ns.rest:
        raise UserError(f"unexpected argument(s) {' '.join(ns.rest)}; see `mcore profile --help`")
    if ns.top < 1:
        raise UserError(f"--top {ns.top} must be at least 1")
    if ns.output:
        check_overwrite(ns.output, ns.force)  # before the profile runs
    from ..families import bundle_kind
    from ..profile.profiler import check_bundle_request, profile_pipeline, top_lines
    from ..runtime.bindings import open_bound_bundle
    from ..runtime.pipeline import DecoderPipeline, EncoderPipeline

    bundle = open_bound_bundle(ns.bundle, ns.kernel_bindings)
    encoder = bundle_kind(bundle.runnable()) == "encoder"
    # each kind reads one of the two: the other, given, would change nothing
    if encoder and ns.context is not None:
        raise UserError(f"--context {ns.context} sizes a decoder's cache; an encoder's profile runs --prompt's tokens")
    if not encoder and ns.prompt is not None:
        raise UserError("--prompt is an encoder's text; a decoder's profile times random tokens at --context N")
    ns.context = 128 if ns.context is None else ns.context
    role = check_bundle_request(bundle, ns.role, ns.context, ns.steps, ns.engine)  # before any graph loads
    cls = EncoderPipeline if encoder else DecoderPipeline
    pipe = cls(  # op by op: the profiler needs the graph, and compiles the profiled role itself
        ns.bundle,
        kernel_bindings=ns.kernel_bindings,
        device=ns.device,
        engine="torch",
        progress=stderr_progress(),
        bundle=bundle,
    )
    report = profile_pipeline(
        pipe, role, ns.context, ns.steps, ns.prompt, progress=stderr_progress(), fusion=ns.fusion, engine=ns.engine
    )
    for line in top_lines(report, ns.top):
        print(line)
    if ns.output:
        write_json(ns.output, report.to_dict())
        print(f"profile written to {ns.output}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="attribute the time of the engine that runs to nodes, modules, recipe instances and slots; "
        "rank the regions worth a kernel (`mcore profile diff A B` compares two)",
    )
    p.add_argument("bundle", type=path_arg, help="a bundle, or `diff` followed by two profile files")
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--kernel-bindings", type=path_arg, default=None)
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: the bundle's, else auto)")
    p.add_argument(
        "--engine",
        default="auto",
        help="auto | compiled | torch: the engine to profile (auto: the one the pipeline runs, compiled on "
        "CUDA and op by op on the CPU); compiled times each kernel of the compiled step",
    )
    p.add_argument("--role", default=None, help="decode | prefill | encoder (default: decode, or encoder)")
    p.add_argument("--prompt", default=None, help="encoder text (decoders profile random tokens)")
    p.add_argument(
        "--context", type=int, default=None, help="decoders: cached tokens for decode, prompt length for prefill (128)"
    )
    p.add_argument("--steps", type=int, default=5, help="steps timed, 1..1000 (the median is reported)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument(
        "--fusion",
        action="store_true",
        help="op by op: also compile the graph once more and report what the compiled engine fuses, and which "
        "fused kernels a slot over each candidate region would split (a compiled profile always has them)",
    )
    p.add_argument("-o", "--output", type=path_arg, default=None, help="write the profile JSON here")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.set_defaults(func=cmd_profile)
