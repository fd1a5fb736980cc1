"""`mcore build`, `mcore run`, `mcore embed`, `mcore inspect`."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ..common.errors import UserError
from ..common.fileio import atomic_write, check_overwrite
from ..graph.display import abi_lines, versions_line
from ..model.buildargs import add_build_args, build_args_from_namespace
from ..model.tokenization import check_prompt
from .args import path_arg
from .progress_lines import stderr_progress


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_build(ns: argparse.Namespace) -> int:
    from ..bundle.build import build_bundle

    args = build_args_from_namespace(ns)
    res = build_bundle(
        args,
        ns.output,
        recipe=tuple(ns.recipe) if ns.recipe else None,
        graph_patch=ns.graph_patch,
        device=ns.device,
        progress=stderr_progress(),
        workspace_bytes=ns.workspace_bytes,
        overwrite=ns.force,
    )
    m = res.manifest
    print(f"bundle written to {res.bundle_path}")
    for role, r in m.roles.items():
        print(f"role {role}: fingerprint={r.fingerprint}")
    if res.receipt:  # the first kernel slot's receipt: present whenever there are slots
        for line in abi_lines(res.receipt):
            print(line)
        if len(m.kernel_slots) > 1:
            print(
                f"kernel slots: {len(m.kernel_slots)} of binding {res.receipt.binding_id} "
                f"(one bindings-manifest entry binds them all): "
                + ", ".join(s.instance for s in m.kernel_slots if s.instance)
            )
    for path in res.receipt_paths:
        print(f"selection receipt written to {path}")
    if not m.kernel_slots:
        print("kernel slots: none (native bundle)")
    return 0


def _pipeline(ns: argparse.Namespace, kind: str, prompts: tuple[str, ...] = ()):
    from ..runtime.bindings import open_bound_bundle
    from ..runtime.pipeline import DecoderPipeline, EncoderPipeline, check_prompts_fit

    bundle = open_bound_bundle(ns.bundle, ns.kernel_bindings)
    if kind == "decoder":
        check_prompts_fit(bundle, prompts, ns.max_new_tokens, ns.chat)
    cls = DecoderPipeline if kind == "decoder" else EncoderPipeline
    pipe = cls(
        ns.bundle,
        kernel_bindings=ns.kernel_bindings,
        device=ns.device,
        engine=ns.engine,
        progress=stderr_progress(),
        bundle=bundle,
    )
    for line in pipe.engine_lines():
        log(line)
    return pipe


def check_sampling(ns: argparse.Namespace) -> None:
    """Values that would crash deep inside sampling: refused up front with the flag's name."""
    import math

    given = [
        flag
        for flag, v in (("--temperature", ns.temperature), ("--top-k", ns.top_k), ("--seed", ns.seed))
        if v is not None
    ]
    if ns.greedy and given:  # greedy takes the most likely token: these would change nothing
        raise UserError(f"{', '.join(given)} shape sampling, and --greedy does not sample; drop one or the other")
    if ns.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {ns.max_new_tokens}")
    # a flag not given keeps Pipeline.generate's default (sampling_kwargs passes given ones only)
    if ns.temperature is not None and (not math.isfinite(ns.temperature) or ns.temperature <= 0):
        raise UserError(f"--temperature must be a finite number > 0, got {ns.temperature}")
    if ns.top_k is not None and ns.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0: no top-k), got {ns.top_k}")
    if ns.seed is not None and not 0 <= ns.seed < 2**63:
        raise UserError(f"--seed must be in 0..{2**63 - 1}, got {ns.seed}")


def sampling_kwargs(ns: argparse.Namespace) -> dict:
    """`run`'s decoding flags as Pipeline.generate's keywords: the sampling ones only where given."""
    kw = {"temperature": ns.temperature, "top_k": ns.top_k, "seed": ns.seed}
    return {"greedy": ns.greedy, "stop_at_eos": not ns.ignore_eos, **{k: v for k, v in kw.items() if v is not None}}


def check_benchmark(ns: argparse.Namespace) -> None:
    """--benchmark and --warmup of `run` and `embed`: a 0 would silently skip the benchmark."""
    if ns.benchmark is not None and ns.benchmark < 1:
        raise UserError(f"--benchmark N needs N >= 1, got {ns.benchmark}")
    if ns.warmup is not None and ns.benchmark is None:  # the untimed runs before the timed ones: no timed ones
        raise UserError(
            f"--warmup {ns.warmup} applies to --benchmark N (untimed runs before the timed ones); add --benchmark N or drop --warmup"
        )
    ns.warmup = 0 if ns.warmup is None else ns.warmup
    if ns.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {ns.warmup}")


def _device_field(seconds: float | None) -> str:
    """On CUDA, the benchmark line's device time per step (`verify perf --metric device` reads it);
    named so that the tutorial's `tokens_per_sec=` pattern still finds the wall-clock throughput."""
    return "" if seconds is None else f" device_step_ms={seconds * 1e3:.5f}"


def cmd_run(ns: argparse.Namespace) -> int:
    from ..runtime.pipeline import percentile

    check_benchmark(ns)
    check_sampling(ns)
    for prompt in ns.prompt:
        check_prompt(prompt)
    if ns.output:
        check_overwrite(ns.output, ns.force)  # before the model loads, not after generating
    pipe = _pipeline(ns, "decoder", tuple(ns.prompt))
    pipe.chat = ns.chat
    prompts = ns.prompt
    kw = sampling_kwargs(ns)
    if ns.benchmark:
        for _ in range(ns.warmup):
            pipe.generate(prompts[0], ns.max_new_tokens, timed=True, **kw)
        runs = [pipe.generate(prompts[0], ns.max_new_tokens, timed=True, **kw) for _ in range(ns.benchmark)]
        gen = [len(r.tokens) for r in runs]
        total_t = sum(r.total_s for r in runs)
        steps = [s * 1e3 for r in runs for s in r.step_s]
        ttft = [r.ttft_s * 1e3 for r in runs]
        print(
            f"generated_tokens_mean={statistics.mean(gen):.2f} runs={len(runs)} "
            f"tokens_per_sec={sum(gen) / total_t:.2f} ttft_ms_p50={percentile(ttft, 0.5):.3f} "
            f"decode_ms_p50={percentile(steps, 0.5):.3f} decode_ms_p90={percentile(steps, 0.9):.3f} "
            f"decode_ms_p99={percentile(steps, 0.99):.3f} "
            # the fastest step: what `verify perf --metric min-step` (auto off CUDA) compares
            + (f"decode_ms_min={min(steps):.4f} " if steps else "")
            + f"device={pipe.device} engine={pipe.engine_name}"
            + _device_field(pipe.device_step_seconds(min(pipe.capacity - 1, len(runs[0].prompt_tokens) + gen[0] // 2))),
            flush=True,
        )
        return 0
    results = [pipe.generate(p, ns.max_new_tokens, **kw) for p in prompts]
    if ns.output:

        def write(f):
            for r in results:
                f.write(json.dumps({"prompt": r.prompt, "tokens": r.tokens, "text": r.text}) + "\n")

        try:
            atomic_write(ns.output, write)
        except UserError as e:  # the generation is lost with the process: say how to get it again
            raise UserError(f"{e}; rerun the same `mcore run` with --output naming a writable file") from None
        log(f"wrote {len(results)} record(s) to {ns.output}")
    for r in results:
        print(r.text if ns.output is None else f"generated {len(r.tokens)} tokens", flush=True)
    return 0


def cmd_embed(ns: argparse.Namespace) -> int:
    from ..runtime.pipeline import percentile, sync

    check_benchmark(ns)
    check_prompt(ns.prompt)
    pipe = _pipeline(ns, "encoder")
    if ns.benchmark:
        for _ in range(ns.warmup):
            pipe.hidden_states(ns.prompt)
        sync(pipe.device)
        lat = []
        for _ in range(ns.benchmark):
            t = time.perf_counter()
            pipe.hidden_states(ns.prompt)
            sync(pipe.device)
            lat.append(time.perf_counter() - t)
        log(
            f"embeddings_per_sec={len(lat) / sum(lat):.2f} runs={len(lat)} latency_ms_p50={percentile(lat, 0.5) * 1e3:.3f} "
            f"latency_ms_p90={percentile(lat, 0.9) * 1e3:.3f} latency_ms_min={min(lat) * 1e3:.4f} "
            f"device={pipe.device} engine={pipe.engine_name}" + _device_field(pipe.device_call_seconds(ns.prompt))
        )
    pooling, normalize, why = pipe.pooling(ns.pooling, ns.normalize)
    emb = pipe.embed(ns.prompt, pooling, normalize)
    log(f"embedding values={len(emb)} pooling={pooling} normalize={str(normalize).lower()} (from {why})")
    sys.stdout.write(json.dumps({"embedding": emb}) + "\n")
    return 0


def cmd_inspect(ns: argparse.Namespace) -> int:
    from ..bundle.container import open_bundle
    from ..bundle.contents import check_family
    from ..graph.display import printable
    from ..selection.patch import slot_groups

    b = open_bundle(ns.bundle)
    if ns.json:
        print(json.dumps(b.manifest, indent=2))  # JSON escapes control characters itself
        return 0
    m = b.runnable()
    check_family(m, ns.bundle)

    def out(line: str) -> None:  # names come from someone's file: no terminal escapes
        print(printable(line))

    out(f"bundle {ns.bundle}: integrity OK")
    out(f"engine={m.engine} family={m.family} model={m.model.spec} revision={m.model.revision}")
    out(
        "engines: graphs captured for the torch family of engines; `mcore run/embed --engine auto` (the default) "
        "runs them compiled (Inductor, CUDA-graph replay) on CUDA and op by op on CPU; --engine torch|compiled picks one"
    )
    out("build_args: " + " ".join(f"{k}={v}" for k, v in m.build_args.items() if v is not None))
    out(versions_line(m.tool_versions or {}))
    w = m.weights
    out(f"weights: {w['kind']}" + (f" (seed {w['seed']})" if w["kind"] == "random" else ""))
    for role, r in m.roles.items():
        out(f"role {role}: fingerprint={r.fingerprint} inputs={len(r.inputs)} outputs={','.join(r.outputs)}")
    if not m.kernel_slots:
        out("kernel_slots: none (native bundle)")
    for bid, group in slot_groups(m.kernel_slots).items():
        out(f"kernel_binding {bid} abi_sha256={group[0].abi_sha256} serves {len(group)} slot(s)")
        for s in group:
            out(
                f"kernel_slot {s.binding_id} role={s.engine_role} abi_sha256={s.abi_sha256}"
                + (f" recipe={s.recipe.id}:{s.recipe.instance}" if s.recipe else "")
            )
        for line in group[0].call_lines():
            out("  " + line)
    out("members: " + ", ".join(b.names()))
    return 0


def _runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=path_arg)
    p.add_argument("--kernel-bindings", type=path_arg, default=None, help="bindings manifest binding every kernel slot")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: the bundle's, else auto)")
    p.add_argument(
        "--engine",
        default="auto",
        help="auto (compiled on CUDA, torch on CPU) | compiled (Inductor + CUDA graphs) | torch (op by op)",
    )
    p.add_argument("--warmup", type=int, default=None, help="with --benchmark: untimed runs first (default 0)")
    p.add_argument("--benchmark", type=int, default=None, metavar="N")


def register(sub: argparse._SubParsersAction) -> None:
    _register_build(sub)
    _register_run(sub)
    _register_embed(sub)
    _register_inspect(sub)


def _register_build(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build a native or slot-ready bundle")
    add_build_args(p)
    p.add_argument(
        "--recipe",
        nargs="+",
        metavar=("RECIPE", "INSTANCE"),
        default=None,
        help="RECIPE INSTANCE [INSTANCE ...]: each instance becomes its own slot of one binding "
        "(same binding ID and ABI); the literal instance all-instances names every instance",
    )
    p.add_argument(
        "--workspace-bytes",
        type=int,
        default=None,
        metavar="N",
        help="with --recipe: the scratch bytes each slot's kernel gets (replaces the recipe's; in the ABI hash)",
    )
    p.add_argument("--graph-patch", type=path_arg, default=None, metavar="SELECTION_JSON")
    p.add_argument("--device", default=None, help="default device recorded for the bundle's runs (cpu | cuda | cuda:N)")
    p.add_argument("-o", "--output", type=path_arg, required=True)
    p.add_argument("--force", action="store_true", help="replace an existing bundle (and its selection receipts)")
    p.set_defaults(func=cmd_build)


def _register_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate with a decoder bundle")
    _runtime_flags(p)
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for several)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--greedy", action="store_true", help="greedy decoding (else sampling)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (default 0: all)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default 0)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--output", type=path_arg, default=None, help="write JSONL records {prompt, tokens, text}")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap each prompt in the checkpoint's chat template (tokenizer_config.json), as transformers does",
    )
    p.set_defaults(func=cmd_run)


def _register_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="embed a prompt with an encoder bundle (JSON on stdout)")
    _runtime_flags(p)
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--pooling",
        default=None,
        choices=["none", "mean", "cls", "max"],
        help="default: the checkpoint's sentence-embedding pooling (modules.json), else none",
    )
    p.add_argument(
        "--normalize",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="L2-normalize the pooled vector (default: as the checkpoint declares; off with --pooling)",
    )
    p.set_defaults(func=cmd_embed)


def _register_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show what a bundle holds (checks integrity)")
    p.add_argument("bundle", type=path_arg)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)
