"""Workbench actions: every step a person takes, as a function over mcore's public API.

Each action is ``ACTION(ctx: ActionContext, **params) -> RESULT`` (docs/workbench-actions.md), its
result a frozen dataclass of workbench/results.py that the registry declares beside it; sessions
record ``RESULT.to_dict()``. Params are plain JSON; paths in params are relative to ``ctx.workdir`` (absolute
paths work while exploring, but a replay refuses them: a replayed session's paths must stay
inside its workdir, ``confine``) and paths in results are written relative to it, so a
recorded session replays in any fresh workdir. Each action is declared once in
workbench/registry.py, whose ``stable_keys`` name the results that replay compares; the rest
(paths, timings, measured throughput) are shown only.

Errors: ``mcore.UserError`` propagates with its one line; ``dispatch.run_action`` turns it into
recordable text with the workdir stripped out of paths (``ctx.error_text``).
Running an action by name, with its params and paths checked, is workbench/dispatch.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcore import PERF_DEFAULTS, EmbeddingsGate, Progress, ReferenceGate, UserError

from . import results as R

if TYPE_CHECKING:
    from mcore import GateResult, PartialProfile, PerfDetails, ProfileCandidate, Receipt

SampleFn = Callable[[str, int, float], None]  # (arm "native"|"external", index, value)
LogFn = Callable[[str], None]


@dataclass
class ActionContext:
    """What an action runs with.

    workdir   folder that relative paths in params resolve against (created if missing)
    progress  mcore Progress (report + cancellation); long actions report through it
    on_sample optional (arm, index, value) callback: the perf gate streams each measured run
    on_partial optional callback: the profile streams what it has attributed after each step
    log       optional one-line text log (also receives the "loading native code" notice)
    device    optional device for pipelines ("cpu", "cuda", "cuda:N"); None = the bundle's, else auto
    confined  the params are someone else's (a replayed session): every path must stay inside the
              workdir (`confine`), named in errors as `where`
    trusted_libraries
              with `confined`: the folder whose DSOs a step may load (None: a step that would
              load one fails). The TUI checks a session's paths when it opens it and asks
              before it loads each library
    """

    workdir: Path
    progress: Progress = field(default_factory=Progress)
    on_sample: SampleFn | None = None
    on_partial: Callable[[PartialProfile], None] | None = None
    log: LogFn | None = None
    device: str | None = None
    confined: bool = False
    where: str = ""
    trusted_libraries: Path | None = None

    def __post_init__(self) -> None:
        wd = Path(self.workdir).expanduser()
        if wd.exists() and not wd.is_dir():
            raise UserError(f"{wd}: workdir is not a folder")
        wd.mkdir(parents=True, exist_ok=True)
        self.workdir = wd.resolve()

    # paths ---------------------------------------------------------------
    def path(self, p: Any, what: str = "path") -> Path:
        """A param path resolved against the workdir."""
        if not isinstance(p, str) or not p.strip():
            raise UserError(f"{what} must be a non-empty path string, got {p!r}")
        if self.confined:
            return confine(self.workdir, p, f"{self.where}field {what}")
        q = Path(p).expanduser()
        return q if q.is_absolute() else self.workdir / q

    def check_native(self, manifest: str | None, what: str = "kernel_bindings") -> None:
        """Before a step loads (or has a benchmark process load) the DSOs a manifest names: in a
        replayed session, only libraries inside the trusted folder, and only when one was named."""
        if manifest is None or not self.confined:
            return
        from mcore import load_bindings_manifest

        self._require_trusted(what, f"loads native code through field {what} ({manifest})", "libraries")
        for b in load_bindings_manifest(self.path(manifest, what)):
            self._require_inside_trusted(b.library_path, what, "library ")

    def check_code(self, script: Path, what: str) -> None:
        """Before a step runs a Python script from the workdir (an exporter): in a replayed session,
        only from inside the trusted folder, and only when one was named."""
        if not self.confined:
            return
        self._require_trusted(what, f"runs code through field {what} ({self.rel(script)})", "code")
        self._require_inside_trusted(script.resolve(), what, "")

    def _require_trusted(self, what: str, does: str, kind: str) -> None:
        if self.trusted_libraries is None:
            raise UserError(
                f"{self.where}{does}; pass {TRUST_FLAG} DIR naming the folder (inside the workdir) of {kind} you trust"
            )

    def _require_inside_trusted(self, path: Path, what: str, label: str) -> None:
        """The one trust rule for native code and scripts: inside the folder the user named."""
        assert self.trusted_libraries is not None
        trusted = self.trusted_libraries.resolve()
        try:
            path.relative_to(trusted)
        except ValueError:
            raise UserError(
                f"{self.where}field {what}: {label}{self.rel(path)} is outside the trusted folder "
                f"{self.rel(trusted)}; pass {TRUST_FLAG} naming its folder if you trust it"
            ) from None

    def rel(self, p: Any) -> str | None:
        """A path as recorded in results: relative to the workdir when inside it."""
        if p is None:
            return None
        q = Path(p)
        if not q.is_absolute():
            q = self.workdir / q
        try:
            return q.resolve().relative_to(self.workdir).as_posix()
        except ValueError:
            return str(q)

    def strip(self, text: str) -> str:
        """`text` with the workdir removed from the paths in it (recorded text stays portable)."""
        for root in {str(self.workdir), os.path.realpath(self.workdir)}:
            text = text.replace(root + os.sep, "").replace(root, ".")
        return text

    def error_text(self, e: BaseException) -> str:
        """The one-line text recorded for an error, with the workdir stripped from paths."""
        return self.strip(str(e) or type(e).__name__)

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    def announce(self, line: str) -> None:
        """The once-per-library notice that a DSO (native code) is being loaded."""
        if self.log is not None:
            self.log(line)
        else:
            print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- helpers

TRUST_FLAG = "--trust-libraries"


def confine(root: Path, p: str, where: str) -> Path:
    """The one rule for a path a session names: relative, and inside `root` once `..` and
    symlinks are resolved. Returns the resolved path; else a one-line error naming `where`."""
    from mcore import check_path_text

    check_path_text(p, where)
    if os.path.isabs(p) or p.startswith("~"):
        raise UserError(f"{where}: {p!r} is an absolute path; a session names paths relative to its workdir")
    root = Path(root).resolve()
    q = (root / p).resolve()
    if q != root and root not in q.parents:
        raise UserError(f"{where}: {p!r} leaves the workdir; a session names paths inside its workdir")
    return q


def parse_build_args(d: Any):
    """A step's build_args as `mcore build` parses its flags (mcore.BuildArgs, validated)."""
    from mcore import BuildArgs

    if not isinstance(d, dict):
        raise UserError(f"build_args must be an object like {{\"model\": \"demo:qwen3-tiny\"}}, got {type(d).__name__}")
    if "model" not in d:
        raise UserError('build_args must name a model, like {"model": "demo:qwen3-tiny"}')
    try:
        return BuildArgs.from_dict(d)
    except TypeError as e:
        raise UserError(f"build_args: {e}") from None


def _int(v: Any, name: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise UserError(f"{name} must be an integer >= {lo}, got {v!r}")
    return v


def _num(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UserError(f"{name} must be a number, got {v!r}")
    return float(v)


def _bool(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise UserError(f"{name} must be true or false, got {v!r}")
    return v


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str) or not v:
        raise UserError(f"{name} must be a non-empty string, got {v!r}")
    return v


def _output(ctx: ActionContext, p: Any, what: str, overwrite: Any) -> Path:
    """An output path under the one overwrite rule (mcore.check_overwrite), checked before the work."""
    from mcore import check_overwrite

    return check_overwrite(ctx.path(p, what), _bool(overwrite, "overwrite"), flag="overwrite: true")


def _opt_path(ctx: ActionContext, p: Any, what: str) -> str | None:
    return None if p is None else str(ctx.path(p, what))


def _rel(ctx: ActionContext, p: Any) -> str:
    """A path written by the action, as recorded (relative to the workdir when inside it)."""
    rel = ctx.rel(p)
    assert rel is not None
    return rel


def _receipt_results(ctx: ActionContext, receipt: Receipt, path: Path) -> R.Selected:
    return R.Selected(
        binding_id=receipt.binding_id,
        abi_sha256=receipt.abi_sha256,
        node_ids=tuple(receipt.node_ids),
        input_tensor_ids=tuple(receipt.input_tensor_ids),
        output_tensor_ids=tuple(receipt.output_tensor_ids),
        receipt=_rel(ctx, path),
        abi_lines=tuple(receipt.abi_lines()),
    )


def _pipeline(
    ctx: ActionContext,
    kind: str | None,
    bundle: str,
    kernel_bindings: str | None,
    engine: str = "auto",
    check: Callable[[Any], object] | None = None,
):
    """The pipeline over `bundle`: the class for `kind` (the verb's: a wrong bundle is refused with
    the verb to use), or with kind None the class the bundle's family kind calls for. `check` sees the
    opened bundle before the pipeline loads (what would fail after it, refused first)."""
    from mcore import DecoderPipeline, EncoderPipeline, open_bound_bundle, open_pipeline

    bpath = str(ctx.path(bundle, "bundle"))
    ctx.check_native(kernel_bindings)
    manifest = _opt_path(ctx, kernel_bindings, "kernel_bindings")
    b = open_bound_bundle(bpath, manifest)
    if check is not None:
        check(b)
    dev, prog, say = ctx.device, ctx.progress, ctx.announce
    if kind is None:
        pipe = open_pipeline(b, manifest, device=dev, engine=engine, progress=prog, announce=say)
    else:
        cls = DecoderPipeline if kind == "decoder" else EncoderPipeline
        pipe = cls(bpath, kernel_bindings=manifest, device=dev, engine=engine, progress=prog, announce=say, bundle=b)
    for line in pipe.engine_lines():  # which engine ran (compiled on CUDA, op by op on CPU)
        ctx.say(line)
    return pipe


# ---------------------------------------------------------------------------- actions


def capture_graph(
    ctx: ActionContext, build_args: dict, engine_role: str, snapshot: str, overwrite: bool = False
) -> R.Captured:
    """`mcore graph inspect`: capture one engine role's graph and write its snapshot."""
    from mcore import capture, write_json

    args = parse_build_args(build_args)
    out = _output(ctx, snapshot, "snapshot", overwrite)
    cap = capture(args, _str(engine_role, "engine_role"), ctx.progress)
    snap = cap.snapshot
    write_json(out, snap.to_dict())
    ctx.say(f"captured {cap.role}: {len(snap.nodes)} nodes, fingerprint {snap.fingerprint[:12]}…")
    ops: dict[str, int] = {}
    for n in snap.nodes:
        ops[n.op] = ops.get(n.op, 0) + 1
    # `ops` is not compared; replay shows it when a fingerprint differs, to say what changed.
    return R.Captured(
        fingerprint=snap.fingerprint,
        nodes=len(snap.nodes),
        tensors=len(snap.tensors),
        recipes=len(snap.recipe_rows),
        snapshot=_rel(ctx, out),
        ops=dict(sorted(ops.items())),
    )


def list_recipes(ctx: ActionContext, snapshot: str) -> R.Recipes:
    """`mcore graph recipes`: the recipe instances the family published for this graph."""
    from mcore import load_snapshot, recipe_rows

    snap = load_snapshot(ctx.path(snapshot, "snapshot"))
    rows = tuple(R.RecipeRow(r.id, r.instance, tuple(r.node_ids)) for r in recipe_rows(snap))
    return R.Recipes(recipes=rows, count=len(rows))


def list_nodes(ctx: ActionContext, snapshot: str, match: str | None = None, last: int | None = None) -> R.Nodes:
    """`mcore graph list [--match GLOB] | tail -n LAST`: display only, never selects anything."""
    from mcore import load_snapshot, node_matches, node_row

    if match is not None:
        _str(match, "match")
    snap = load_snapshot(ctx.path(snapshot, "snapshot"))
    nodes = [n for n in snap.nodes if node_matches(n, match)]
    if last is not None:
        nodes = nodes[-_int(last, "last", 1) :]
    return R.Nodes(
        ids=tuple(n.id for n in nodes),
        count=len(nodes),
        nodes=tuple(
            R.NodeRow(n.id, n.op, n.category or "", n.module_path, tuple(n.inputs), tuple(n.outputs)) for n in nodes
        ),
        lines=tuple(node_row(snap, n) for n in nodes),
    )


def select_recipe(
    ctx: ActionContext,
    snapshot: str,
    recipe_id: str,
    instance: str,
    receipt: str,
    binding_id: str | None = None,
    workspace_bytes: int | None = None,
    overwrite: bool = False,
) -> R.Selected:
    """Resolve one recipe instance through select_region() and write its receipt (`workspace_bytes`
    replaces the recipe's, as `mcore graph select --recipe ... --workspace-bytes N`)."""
    from mcore import load_snapshot, write_json
    from mcore import select_recipe as _select

    snap = load_snapshot(ctx.path(snapshot, "snapshot"))
    out = _output(ctx, receipt, "receipt", overwrite)
    rec = _select(snap, _str(recipe_id, "recipe_id"), _str(instance, "instance"), binding_id, workspace_bytes)
    write_json(out, rec.to_dict())
    return _receipt_results(ctx, rec, out)


def select_nodes(
    ctx: ActionContext,
    snapshot: str,
    node_ids: list[str],
    binding_id: str,
    receipt: str,
    workspace_bytes: int = 0,
    extra_args: list | None = None,
    output_shape_input: int | None = None,
    overwrite: bool = False,
) -> R.Selected:
    """`mcore graph select --nodes ...`: validate a hand-picked region and write its receipt."""
    from mcore import load_snapshot, select_region, write_json

    if not isinstance(node_ids, list) or not node_ids or not all(isinstance(n, str) for n in node_ids):
        raise UserError(f"node_ids must be a non-empty list like [\"node:12\"], got {node_ids!r}")
    snap = load_snapshot(ctx.path(snapshot, "snapshot"))
    out = _output(ctx, receipt, "receipt", overwrite)
    rec = select_region(snap, node_ids, binding_id, workspace_bytes, list(extra_args or []), output_shape_input)
    write_json(out, rec.to_dict())
    return _receipt_results(ctx, rec, out)


def build_kernel(
    ctx: ActionContext, name: str, output: str, cuda: str = "auto", overwrite: bool = False
) -> R.KernelBuilt:
    """`mcore kernel build`: compile a shipped kernel into a TVM-FFI DSO."""
    from mcore import build_kernel as _build
    from mcore import library_sha256

    out = ctx.path(output, "output")
    k = _build(_str(name, "name"), out, cuda=cuda, progress=ctx.progress, overwrite=_bool(overwrite, "overwrite"))
    variant = getattr(k, "variant", None)
    describe = k.describe() if hasattr(k, "describe") else str(variant)
    ctx.say(f"built {name}: {describe}")
    return R.KernelBuilt(
        library=_rel(ctx, k),
        variant=variant,
        function=getattr(k, "function", "run"),
        description=describe,
        library_sha256=library_sha256(k),
    )


def kernel_stub(ctx: ActionContext, receipt: str, snapshot: str, output: str, overwrite: bool = False) -> R.StubWritten:
    """`mcore kernel stub`: write a CuTe DSL exporter for the receipt's ABI. For a single known op
    (copy, cast, add, sub, mul) the kernel body is generated; otherwise it is a scaffold to fill in."""
    from mcore import write_exporter

    out = ctx.path(output, "output")
    r = write_exporter(
        ctx.path(receipt, "receipt"), ctx.path(snapshot, "snapshot"), out, overwrite=_bool(overwrite, "overwrite")
    )
    body = "generated" if r.known is not None else "scaffold"
    ctx.say(
        f"exporter written: {ctx.rel(r.path)} (kernel body {body}"
        + (f": {r.known.summary})" if r.known is not None else f"; {r.reason})")
    )
    return R.StubWritten(
        path=_rel(ctx, r.path),
        binding_id=r.binding_id,
        abi_sha256=r.abi_sha256,
        body=body,
        op=r.known.summary if r.known is not None else None,
        reason=ctx.strip(r.reason),
    )


def export_kernel(
    ctx: ActionContext,
    exporter: str,
    receipt: str,
    output: str,
    snapshot: str | None = None,
    overwrite: bool = False,
) -> R.Exported:
    """`mcore kernel export`: run an exporter (a shipped one by name, or a script such as kernel_stub
    writes) for the receipt; it compiles the kernel and writes one TVM-FFI DSO. A script in a
    replayed session is someone else's code: it runs only from the trusted folder."""
    from mcore import run_exporter, shipped_exporter

    exporter = _str(exporter, "exporter")
    if shipped_exporter(exporter) is None:
        script = ctx.path(exporter, "exporter")
        ctx.check_code(script, "exporter")
        exporter_arg: str = str(script)
    else:
        exporter_arg = exporter
    r = run_exporter(
        exporter_arg,
        ctx.path(receipt, "receipt"),
        ctx.path(output, "output"),
        snapshot=_opt_path(ctx, snapshot, "snapshot"),
        progress=ctx.progress,
        log=ctx.log,
        cwd=ctx.workdir,
        overwrite=_bool(overwrite, "overwrite"),
    )
    ctx.say(f"exported {ctx.rel(r.library)} ({r.arch or 'arch not printed'})")
    return R.Exported(
        library=_rel(ctx, r.library),
        binding_id=r.binding_id,
        abi_sha256=r.abi_sha256,
        arch=r.arch,
        library_sha256=r.library_sha256,
    )


def write_bindings(
    ctx: ActionContext, receipt: str, library: str, manifest: str, function: str = "run", overwrite: bool = False
) -> R.BindingsWritten:
    """Write a kernel bindings manifest binding the receipt's slot to a DSO next to it."""
    from mcore import BINDINGS_SCHEMA_VERSION, BindingsManifest, library_sha256, load_receipt, write_json

    rec = load_receipt(ctx.path(receipt, "receipt"))
    mpath = _output(ctx, manifest, "manifest", overwrite)
    lib = ctx.path(library, "library")
    if not lib.is_file():  # a manifest naming nothing would fail only when a pipeline loads it
        raise UserError(f"library {library}: no such file; build or export the kernel first, then write the bindings")
    try:
        rel_lib = os.path.relpath(lib, mpath.parent)
    except ValueError:  # other drive (Windows)
        rel_lib = str(lib)
    if rel_lib == ".." or rel_lib.startswith(".." + os.sep) or os.path.isabs(rel_lib):
        raise UserError(
            f"library {library} is outside the manifest's folder {ctx.rel(mpath.parent) or '.'}; "
            "copy the DSO next to the manifest"
        )
    rel_lib = "./" + Path(rel_lib).as_posix()
    entry = {
        "id": rec.binding_id,
        "abi_sha256": rec.abi_sha256,
        "library": rel_lib,
        "function": _str(function, "function"),
    }
    # pin the DSO's bytes: the manifest binds this build, not whatever is at the path later
    lib_sha = entry["library_sha256"] = library_sha256(lib)
    data = {"schema_version": BINDINGS_SCHEMA_VERSION, "bindings": [entry]}
    # the same strict check a pipeline applies (loads no DSO), before anything is written
    write_json(mpath, BindingsManifest.from_dict(data, mpath).to_dict())
    return R.BindingsWritten(
        manifest=_rel(ctx, mpath),
        binding_id=rec.binding_id,
        abi_sha256=rec.abi_sha256,
        library=rel_lib,
        library_sha256=lib_sha,
    )


def build_bundle(
    ctx: ActionContext,
    build_args: dict,
    output: str,
    recipe: list[str] | None = None,
    graph_patch: str | None = None,
    device: str | None = None,
    workspace_bytes: int | None = None,
    overwrite: bool = False,
) -> R.BundleBuilt:
    """`mcore build`: native (no recipe/patch) or slot-ready (recipe or graph_patch) bundle;
    `workspace_bytes` with a recipe as `--workspace-bytes N`."""
    from mcore import build_bundle as _build

    args = parse_build_args(build_args)
    if recipe is not None and (
        not isinstance(recipe, (list, tuple)) or len(recipe) < 2 or not all(isinstance(x, str) for x in recipe)
    ):
        raise UserError(
            f"recipe must be [RECIPE_ID, INSTANCE, ...] (or [RECIPE_ID, \"all-instances\"]), got {recipe!r}"
        )
    out = ctx.path(output, "output")
    res = _build(
        args,
        out,
        recipe=tuple(recipe) if recipe else None,
        graph_patch=_opt_path(ctx, graph_patch, "graph_patch"),
        device=device,
        progress=ctx.progress,
        workspace_bytes=workspace_bytes,
        overwrite=_bool(overwrite, "overwrite"),
    )
    m = res.manifest
    receipt_path = res.receipt_path or (ctx.path(graph_patch) if graph_patch else None)
    ctx.say(f"bundle written: {ctx.rel(res.bundle_path)} ({len(m.kernel_slots)} kernel slot(s))")
    return R.BundleBuilt(
        bundle=_rel(ctx, res.bundle_path),
        fingerprints={role: r.fingerprint for role, r in m.roles.items()},
        kernel_slots=tuple(R.KernelSlotRow(s.binding_id, s.abi_sha256) for s in m.kernel_slots),
        receipt=ctx.rel(receipt_path),
        abi_lines=tuple(res.receipt.abi_lines()) if res.receipt else (),
    )


def generate(
    ctx: ActionContext,
    bundle: str,
    prompt: str,
    max_new_tokens: int,
    output: str | None = None,
    kernel_bindings: str | None = None,
    chat: bool = False,
    overwrite: bool = False,
) -> R.Generated:
    """`mcore run --greedy [--chat] [--output FILE]`: greedy generation; writes JSONL {prompt, tokens, text}."""
    from mcore import atomic_write

    _str(prompt, "prompt")
    n = _int(max_new_tokens, "max_new_tokens", 1)
    out = _output(ctx, output, "output", overwrite) if output is not None else None
    pipe = _pipeline(ctx, "decoder", bundle, kernel_bindings)
    pipe.chat = _bool(chat, "chat")
    t0 = time.perf_counter()
    r = pipe.generate(prompt, n, greedy=True)
    seconds = time.perf_counter() - t0
    if out is not None:
        line = json.dumps({"prompt": r.prompt, "tokens": r.tokens, "text": r.text}) + "\n"
        atomic_write(out, lambda f: f.write(line))
    return R.Generated(tokens=tuple(r.tokens), text=r.text, output=ctx.rel(out), seconds=round(seconds, 4))


def embed(
    ctx: ActionContext,
    bundle: str,
    prompt: str,
    output: str | None = None,
    kernel_bindings: str | None = None,
    pooling: str | None = None,
    overwrite: bool = False,
) -> R.Embedded:
    """`mcore embed [--pooling P]`: the embedding (pooled as the checkpoint declares unless `pooling`
    says otherwise); writes {"embedding": [...]} like the CLI's stdout."""
    from mcore import atomic_write

    _str(prompt, "prompt")
    out = _output(ctx, output, "output", overwrite) if output is not None else None
    pipe = _pipeline(ctx, "encoder", bundle, kernel_bindings)
    mode, normalize, why = pipe.pooling(pooling)
    values = pipe.embed(prompt, mode, normalize)
    if out is not None:
        text = json.dumps({"embedding": values}) + "\n"
        atomic_write(out, lambda f: f.write(text))
    return R.Embedded(values=len(values), output=ctx.rel(out), pooling=mode, normalize=normalize, pooling_from=why)


def _hooks(ctx: ActionContext) -> Any:
    """Where a gate reports in the workbench: the action's progress, the log, the live samples."""
    from mcore import GateHooks

    return GateHooks(
        progress=ctx.progress,
        announce=ctx.announce,
        on_line=lambda line: ctx.say(ctx.strip(line)),
        on_sample=ctx.on_sample,
    )


def _say_gate(ctx: ActionContext, r: Any) -> None:
    for line in r.info + [r.line]:
        ctx.say(ctx.strip(line))


def _gated(ctx: ActionContext, r: Any) -> dict[str, Any]:
    """The fields every gate's result starts with (results.Gated)."""
    return {
        "passed": bool(r.passed),
        "verdict": r.verdict,
        "line": ctx.strip(r.line),
        "info": tuple(ctx.strip(x) for x in r.info),
    }


def verify_reference(
    ctx: ActionContext,
    bundle: str,
    checkpoint: str,
    prompt: str,
    max_new_tokens: int = 8,
    chat: bool = False,
    kernel_bindings: str | None = None,
    min_cosine: float = ReferenceGate.min_cosine,
    max_abs: float | None = None,
    max_rel: float = ReferenceGate.max_rel,
) -> R.ReferenceChecked:
    """`mcore verify reference`: the engine against transformers on the same checkpoint, per step
    (the CLI's gate and options: mcore.ReferenceGate)."""
    from mcore import ReferenceGate

    ctx.check_native(kernel_bindings)
    gate = ReferenceGate(
        str(ctx.path(bundle, "bundle")),
        _str(checkpoint, "checkpoint"),
        _str(prompt, "prompt"),
        max_new_tokens=_int(max_new_tokens, "max_new_tokens", 1),
        chat=_bool(chat, "chat"),
        kernel_bindings=_opt_path(ctx, kernel_bindings, "kernel_bindings"),
        device=ctx.device,
        min_cosine=_num(min_cosine, "min_cosine"),
        max_abs=None if max_abs is None else _num(max_abs, "max_abs"),
        max_rel=_num(max_rel, "max_rel"),
    )
    r = gate.run(_hooks(ctx))
    _say_gate(ctx, r)
    w = r.details.worst  # None: the weights or the token IDs differed before any step ran
    return R.ReferenceChecked(
        **_gated(ctx, r),
        first_diverging_step=None if w is None else w.first_diverging_step,
        max_abs=None if w is None else w.max_abs,
        max_rel=None if w is None else w.max_rel,
        min_cosine=None if w is None else w.min_cosine,
    )


def gate_logits(
    ctx: ActionContext,
    native_bundle: str,
    external_bundle: str,
    prompt: str,
    max_new_tokens: int = 16,
    kernel_bindings: str | None = None,
    chat: bool = False,
    max_abs: float = 0.0,
    engine: str = "auto",
) -> R.LogitsGated:
    """`mcore verify logits`: both bundles stepped on the native greedy tokens, logits compared per
    step (the CLI's gate and options: mcore.LogitsGate)."""
    from mcore import LogitsGate

    ctx.check_native(kernel_bindings)
    gate = LogitsGate(
        str(ctx.path(native_bundle, "native_bundle")),
        str(ctx.path(external_bundle, "external_bundle")),
        _opt_path(ctx, kernel_bindings, "kernel_bindings"),
        _str(prompt, "prompt"),
        max_new_tokens=_int(max_new_tokens, "max_new_tokens", 1),
        max_abs=_num(max_abs, "max_abs"),
        chat=_bool(chat, "chat"),
        device=ctx.device,
        engine=_str(engine, "engine"),
    )
    r = gate.run(_hooks(ctx))
    _say_gate(ctx, r)
    d = r.details
    return R.LogitsGated(
        **_gated(ctx, r),
        steps=tuple(s.max_abs for s in d.steps),
        max_abs=d.max_abs,
        first_divergence=d.first_divergence,
    )


def gate_tokens(ctx: ActionContext, native: str, external: str) -> R.TokensGated:
    """Exact token equality of two `run --output` JSONL files (the tutorial's diff)."""
    from mcore import TokensGate

    r = TokensGate(ctx.path(native, "native"), ctx.path(external, "external")).run()
    ctx.say(r.line)
    return R.TokensGated(**_gated(ctx, r))


def gate_embeddings(
    ctx: ActionContext,
    native: str,
    external: str,
    max_abs: float = EmbeddingsGate.max_abs,
    min_cosine: float = EmbeddingsGate.min_cosine,
) -> R.EmbeddingsGated:
    """max |a-b| and cosine similarity of two embeddings against the tutorial's thresholds."""
    from mcore import EmbeddingsGate

    gate = EmbeddingsGate(
        ctx.path(native, "native"),
        ctx.path(external, "external"),
        max_abs=_num(max_abs, "max_abs"),
        min_cosine=_num(min_cosine, "min_cosine"),
    )
    r = gate.run()
    for line in r.info + [r.line]:
        ctx.say(line)
    d = r.details
    return R.EmbeddingsGated(**_gated(ctx, r), values=d.values, max_abs=d.max_abs, cosine=d.cosine)


# an encoder arm's default benchmark calls: calls are few and short, and a fastest-call metric needs
# enough of them to find undisturbed ones on a loaded CPU (decoders: 5 generations)
ENCODER_BENCH_RUNS = 200


def gate_perf(
    ctx: ActionContext,
    native_bundle: str,
    external_bundle: str,
    kernel_bindings: str | None,
    prompt: str,
    max_new_tokens: int | None = None,
    pairs: int | str = PERF_DEFAULTS.pairs,
    min_ratio: float = PERF_DEFAULTS.min_ratio,
    warmup: int = 1,
    bench_warmup: int = 2,
    bench_runs: int | None = None,
    metric: str = PERF_DEFAULTS.metric,
    max_pairs: int | None = None,
    budget_s: float | None = None,
    confidence: float = PERF_DEFAULTS.confidence,
    engine: str | None = None,
) -> R.PerfGated:
    """`mcore verify perf` on two bundles: `warmup` runs of each arm, then alternating fresh-process
    native/external pairs (`mcore run|embed --warmup bench_warmup --benchmark bench_runs [--engine E]`;
    bench_runs defaults to 5 generations for a decoder, 200 calls for an encoder), a fixed
    count or `pairs="auto"` (bounded by max_pairs / budget_s), decided by the t-interval of the pairs'
    log-ratios: PROMOTE, REJECT or INCONCLUSIVE. The gate, its options and defaults are the CLI's
    (mcore.PerfGate). Replay compares the verdict with the recording; the numbers are shown only."""
    from mcore import BenchArms, PerfGate, PerfOptions, bundle_kind, open_bundle

    nb, eb = ctx.path(native_bundle, "native_bundle"), ctx.path(external_bundle, "external_bundle")
    ctx.check_native(kernel_bindings)
    kind = bundle_kind(open_bundle(nb).runnable())
    if kind == "decoder":
        _int(max_new_tokens, "max_new_tokens", 1)
    runs = bench_runs if bench_runs is not None else (5 if kind == "decoder" else ENCODER_BENCH_RUNS)
    arms = BenchArms(
        kind,
        _str(prompt, "prompt"),
        max_new_tokens,
        _int(bench_warmup, "bench_warmup", 0),
        _int(runs, "bench_runs", 1),
        ctx.device,  # the device the other steps use
        None if engine is None else _str(engine, "engine"),
    )
    options = PerfOptions(pairs, min_ratio, confidence, max_pairs, budget_s, warmup, metric)
    gate = PerfGate.for_bundles(arms, nb, eb, _opt_path(ctx, kernel_bindings, "kernel_bindings"), options)
    r = gate.run(_hooks(ctx))
    ctx.say(r.line)
    return _perf_results(ctx, r)


def _perf_results(ctx: ActionContext, r: GateResult[PerfDetails]) -> R.PerfGated:
    """What a perf gate step records: the verdict, every pair, the interval and the rule."""
    d, dec = r.details, r.details.decision  # dec None: a run failed before the gate decided
    pairs = tuple(
        R.PerfPair(native=n, external=e, ratio=q, first=o[0])
        # a run that failed mid-pair leaves one arm a value longer: the pairs are the complete ones
        for n, e, q, o in zip(d.native, d.external, d.ratios, d.order, strict=False)
    )
    iv = None if dec is None else dec.interval
    return R.PerfGated(
        **_gated(ctx, r),
        ratio=None if dec is None else dec.ratio,
        median_ratio=None if dec is None else dec.median_ratio,
        interval=None if iv is None else R.Interval(iv.low, iv.high, iv.confidence, iv.t, iv.sd_log),
        rule=None if dec is None else dec.rule,
        metric=None if dec is None else dec.metric,
        min_ratio=d.min_ratio,
        stop=None if dec is None else dec.stop,
        pairs=pairs,
        native=None if dec is None else dec.native_median,
        external=None if dec is None else dec.external_median,
        unit=None if dec is None else dec.unit,
        samples={"native": d.native, "external": d.external},
    )


def profile(
    ctx: ActionContext,
    bundle: str,
    output: str,
    role: str | None = None,
    context: int = 128,
    steps: int = 3,
    prompt: str | None = None,
    kernel_bindings: str | None = None,
    fusion: bool = False,
    engine: str = "auto",
    overwrite: bool = False,
) -> R.Profiled:
    """`mcore profile -o OUTPUT [--engine E] [--fusion]`: the time of the engine the pipeline runs
    (`auto`: compiled on CUDA, op by op on the CPU) per node, module, recipe instance and slot, the
    time between kernels of a compiled step, and the ranked candidate regions (with the fused kernels
    a slot over each would split). Timings are measured: replay compares only which candidates exist."""
    from mcore import check_bundle_request, profile_pipeline, write_json

    out = _output(ctx, output, "output", overwrite)
    role = _str(role, "role") if role is not None else None
    context, steps, engine = _int(context, "context", 1), _int(steps, "steps", 1), _str(engine, "engine")
    asked: dict[str, str] = {}

    def check(b: Any) -> None:  # the role, context and steps against the bundle, before its graph loads
        asked["role"] = check_bundle_request(b, role, context, steps, engine)

    # op by op: the profiler needs the graph, and compiles the profiled role itself for `compiled`
    pipe = _pipeline(ctx, None, bundle, kernel_bindings, engine="torch", check=check)  # the family kind decides
    report = profile_pipeline(
        pipe,
        asked["role"],
        context,
        steps,
        prompt,
        progress=ctx.progress,
        on_partial=ctx.on_partial,
        fusion=_bool(fusion, "fusion"),
        engine=engine,
    )
    write_json(out, report.to_dict())
    ctx.say(
        f"profile written: {ctx.rel(out)} (engine {report.engine.name}, {len(report.candidates)} candidate regions)"
    )
    ident = [_candidate_ident(c) for c in report.candidates]
    return R.Profiled(
        role=report.role,
        context=report.context,
        engine=report.engine.name,
        profile=_rel(ctx, out),
        # which candidates exist is a fact of the graph; their order follows measured headroom
        candidates=tuple(sorted(ident, key=lambda c: json.dumps(c, sort_keys=True))),
        ranked=tuple(ident),
        step_seconds=report.step_seconds,
    )


def _candidate_ident(c: ProfileCandidate) -> dict:
    """A candidate region without its timings: what it is and the nodes it covers."""
    if c.kind == "recipe":
        what = {"kind": c.kind, "recipe": c.recipe, "instance": c.instance}
    else:
        what = {"kind": c.kind, "module_path": c.module_path}
    return {**what, "node_ids": list(c.node_ids)}
