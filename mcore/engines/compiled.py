"""Engine `compiled`: the role graph compiled with Inductor, fixed-shape roles replayed as CUDA graphs.

This plays TensorRT's part with what runs here. At load, each role graph (the same prepared
graph the op-by-op engine runs, slots included) is compiled: Inductor fuses and picks kernels
freely, except that an `mcore::slot` node is an opaque op it cannot fuse across or reorder
around, as a TensorRT plugin. A role whose shapes are fixed for the pipeline's life (the
decode step, an encoder) is then captured once as a CUDA graph and replayed per call: one
launch per step, slot calls included (TVM-FFI launches on the current stream, also during
capture). Roles with a dynamic token count (prefill) run compiled with a dynamic dimension.

Compiled artifacts live in Inductor's cache under $MCORE_CACHE_DIR/inductor, keyed by the graph
Inductor sees (which covers the graph, the slot ops, the device and the torch version); a small
index beside it (compiled/<key>.json, our key: the role graph's structure, slot ABIs, device,
torch, options) says whether this pipeline was compiled on this machine before and how long that
took. Every folder is checked and every precompiled entry carries its record before it is
unpickled (mcore/common/cache.py); a role compiled by regions (regions.py, standalone.py) is one file
under one record.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config

from .. import __version__
from ..common import cache
from ..common.errors import UserError
from ..common.progress import NO_PROGRESS, Progress
from ..graph.snapshot import Snapshot
from ..ops import inductor, rope_attention
from ..ops.gemv import enabled as gemv_enabled
from ..ops.gemv import glu_enabled, norm_enabled
from ..selection.receipt import SlotRecord
from .fusion import fuse_sibling_projections, fuse_weights
from .gemv_pass import use_gemv
from .prefill_pass import rewrite_prefill, rows_enabled
from .prepared import PreparedGraph, RoleProgram, prepare_graph
from .regions import plan_regions
from .standalone import (
    CompiledRegions,
    compile_regions,
    is_regions,
    load_regions,
    regional,
    save_regions,
    standalone,
)
from .structure import RoleStructure, rebased, structure_key


def _torch_default_inductor_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return default_cache_dir()


def _use_mcore_inductor_cache() -> None:
    """Inductor's (and Triton's) cache under $MCORE_CACHE_DIR/inductor, checked like mcore's own.
    Importing torch._inductor.config already set TORCHINDUCTOR_CACHE_DIR to torch's default (the
    shared /tmp/torchinductor_$USER), so that value counts as not chosen; a folder the user chose is
    kept only when it is safe (one line, exit 2, otherwise). Inductor reads it at compile time."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and chosen != _torch_default_inductor_dir():
        problem = cache.check_dir(Path(chosen), "TORCHINDUCTOR_CACHE_DIR")
        if problem is not None and Path(chosen).exists():
            raise UserError(f"{problem}; or unset TORCHINDUCTOR_CACHE_DIR to use $MCORE_CACHE_DIR/inductor")
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.cache_dir("inductor"))


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} sm_{props.major}{props.minor} {props.multi_processor_count}SM"
    return "cpu"


def compile_key(structure: str, slots: Sequence[SlotRecord], device: torch.device) -> str:
    """What decides the compiled code: the hash of `made_from`."""
    return hashlib.sha256(json.dumps(made_from(structure, slots, device), sort_keys=True).encode()).hexdigest()


def made_from(structure: str, slots: Sequence[SlotRecord], device: torch.device) -> dict[str, Any]:
    """The inputs of a compile that a cached one must share: the role graph's structure
    (structure.py: the family, role, graph arguments and `Family.structure(config)`, not the
    model's identity, so a fine-tune shares it), the slots' ABIs, the device, torch, mcore and the
    compile options. Weights are not among them: the compiled code takes the weights as arguments
    (docs/trust.md)."""
    return {
        "structure": structure,
        "mcore": __version__,
        "slots": [[s.binding_id, s.abi_sha256, list(s.node_ids)] for s in slots],
        "device": device_label(device),
        "torch": torch.__version__,
        "options": [fuse_projections(), tuning()]
        + (["prefill-rows"] if rows_enabled() else [])
        + (["gemv"] if gemv_enabled(device) else [])
        + (["gemv-glu"] if gemv_enabled(device) and glu_enabled() else [])
        + (["gemv-norm"] if gemv_enabled(device) and norm_enabled() else [])
        + (["attn-rope"] if gemv_enabled(device) and rope_attention.enabled() else [])
        + inductor.settings(device)
        + (["regional"] if regional() else []),
    }


def fuse_projections() -> bool:
    """MCORE_FUSE_PROJECTIONS=0 keeps q/k/v and gate/up as separate matrix products."""
    return os.environ.get("MCORE_FUSE_PROJECTIONS", "1") != "0"


def tuning() -> bool:
    """MCORE_COMPILE_TUNING=1: coordinate-descent tuning instead of deterministic mode."""
    return os.environ.get("MCORE_COMPILE_TUNING", "0") == "1"


def precompiled(device: torch.device) -> bool:
    """Each role is compiled without Dynamo into one Inductor artifact file beside the index
    (compiled/<key>.<slot keys>.artifact; prefill with a symbolic token count), with a role record
    beside it (.role.json: the snapshot, the lifted state's names and the engine's weight fusions).
    A later load of the same pipeline reads those two files and neither captures the graph
    (torch.export.load) nor re-traces it (Dynamo). On CUDA by default (an 8B-sized reload on the H200:
    7.9 s, against 36 s through Dynamo); MCORE_PRECOMPILED=0 turns it off, =1 on for any device."""
    flag = os.environ.get("MCORE_PRECOMPILED", "")
    if flag in ("0", "1"):
        return flag == "1"
    # by default only where this torch has the API (2.8 and later); an older one compiles through Dynamo
    return device.type == "cuda" and hasattr(torch._inductor, "standalone_compile")


def _slots_tag(slot_keys: Sequence[str]) -> str:
    # Compiled code names its slots by key (mcore::slot(..., key)): a pipeline whose slots got other
    # keys (a second one in this process) must not run the first one's kernels.
    return hashlib.sha256(",".join(slot_keys).encode()).hexdigest()[:12]


def _precompiled_paths(key: str, slot_keys: Sequence[str]) -> tuple[Path, Path]:
    """(artifact, role record) of a role compiled under `key` for these slot keys."""
    stem = f"{key}.{_slots_tag(slot_keys)}"
    folder = cache.cache_dir("compiled")
    return folder / f"{stem}.artifact", folder / f"{stem}.role.json"


def compile_options(device: torch.device, fixed_shapes: bool) -> dict[str, Any]:
    """Inductor options. Deterministic mode skips every on-device benchmark whose pick changes the
    numbers (reduction launch shapes and the like), so each compile of a graph computes the same
    bits: a native and a slot pipeline agree in lockstep, and a reload matches the first run.
    MCORE_COMPILE_TUNING=1 trades that for coordinate-descent tuning of one-token kernels. The extra
    settings of mcore/ops/inductor.py (fewer, overlapped launches) go to fixed-shape roles alone (the
    decode step, replayed per token): the prefill pass is one launch sequence per prompt, and on the
    H200 they made its first token slower (26.9 -> 29.8 ms at 1k) and its cached reload 6 s longer."""
    options: dict[str, Any] = {}
    if tuning() and fixed_shapes and device.type == "cuda":
        options["coordinate_descent_tuning"] = True  # matrix-vector kernels by Inductor, tuned on the device
    elif hasattr(torch._inductor.config, "deterministic"):
        options["deterministic"] = True
    extra = inductor.settings(device) if fixed_shapes else []
    return options | {name: True for name in extra}


def rewrite(p: PreparedGraph, inputs: Sequence[torch.Tensor], device: torch.device, fixed_shapes: bool) -> None:
    """The rewrites of a role graph between its weight fusions and Inductor (a profile of the
    compiled engine makes the same ones): one-row products (the decode step) as mcore::gemv, and the
    prefill's attention context without its two copies."""
    if fixed_shapes and gemv_enabled(device):
        use_gemv(p, inputs)
    if not fixed_shapes:
        rewrite_prefill(p)


# Roles compiled through Dynamo in this process, by everything their code depends on: the compiled
# function takes the weights and caches as arguments, so a second pipeline of the same structure
# (a reload, a gate's other side, most tests) calls the first one's instead of tracing its graph
# again (about 1 s a role for the demo on a CPU, where Inductor's cache then hits anyway).
_DYNAMO: OrderedDict[tuple, Any] = OrderedDict()
_DYNAMO_MAX = 16
_DYNAMO_LOCK = threading.Lock()


def _dynamo_compiled(gm: torch.fx.GraphModule, key: str, slot_keys: Sequence[str], options: dict[str, Any]) -> Any:
    """torch.compile(gm), or the function compiled in this process for the same graph. Only graphs that
    hold no tensors of their own are shared (a get_attr would be the first pipeline's tensor); the
    graph's code is part of the key, so a rewrite that came out otherwise compiles afresh."""
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        return torch.compile(gm, fullgraph=True, options=options or None)
    # under this cache: a process that moved MCORE_CACHE_DIR compiles (and caches) there afresh
    share = (
        key,
        tuple(slot_keys),
        graph_sha256(gm),
        json.dumps(options, sort_keys=True),
        os.environ.get("MCORE_CACHE_DIR"),
    )
    with _DYNAMO_LOCK:
        fn = _DYNAMO.get(share)
        if fn is None:
            fn = _DYNAMO[share] = torch.compile(gm, fullgraph=True, options=options or None)
            while len(_DYNAMO) > _DYNAMO_MAX:
                _DYNAMO.popitem(last=False)
        _DYNAMO.move_to_end(share)
    return fn


class CompiledRoleRunner:
    """`prepared` is the role's graph (a PreparedGraph), or for a precompiled role loaded from its
    artifact the RoleProgram alone with `fn` already set. `snapshot`: the role's graph snapshot, kept
    in the role record that lets a later load skip capture (see `precompiled`); `made_from`: what
    the compile depends on (`made_from()`, whose hash is `key`), recorded with the artifact."""

    def __init__(
        self,
        prepared: RoleProgram,
        device: torch.device,
        key: str,
        snapshot: Snapshot | None = None,
        fn: Callable[..., Any] | None = None,
        made_from: dict[str, Any] | None = None,
    ):
        self.prepared = prepared
        self.device = device
        self.key = key
        self.made_from = made_from
        self.snapshot = snapshot
        self.fn: Callable[..., Any] | None = fn  # made by prepare(), which knows the role's shapes
        self.graphs: dict[tuple, _Replay] = {}
        self.compile_s: float | None = None
        self.cached: bool | None = None
        self.calls_compiled = 0  # calls that ran compiled code outside a CUDA graph
        self.artifact: Path | None = None  # the precompiled artifact this role runs (see `precompiled`)
        self.load_s = 0.0  # reading a precompiled role (artifact and record), counted in compile_s
        self.settings: list[str] = []  # Inductor settings beyond deterministic mode (describe() names them)
        self.compiled_beside = False  # compiled by a helper process while this one did another role

    # ------------------------------------------------------------------ running
    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        replay = self.graphs.get(_signature(inputs))
        if replay is not None:
            return replay(inputs)
        self.calls_compiled += 1
        return self._run(inputs)

    def _run(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        p = self.prepared
        if self.fn is None:
            self.fn = torch.compile(self._graph().gm, fullgraph=True)
        return p.run(self.fn, inputs)

    def _graph(self) -> PreparedGraph:
        if not isinstance(self.prepared, PreparedGraph):
            raise RuntimeError(f"the precompiled {self.prepared.role} role has no graph to compile")
        return self.prepared

    # ------------------------------------------------------------------ preparing
    def prepare(self, *inputs: torch.Tensor, progress: Progress = NO_PROGRESS, fixed_shapes: bool = True) -> None:
        """Compile for these inputs; with fixed_shapes on CUDA also capture a CUDA graph over these buffers.

        Runs the role once or twice on the given buffers (a decode step writes one cache position,
        which later steps overwrite before reading)."""
        p = self.prepared
        role = p.role
        marker = cache.cache_dir("compiled") / f"{self.key}.json"
        known = _read_marker(marker)
        options = compile_options(self.device, fixed_shapes)
        self.settings = sorted(k for k, v in options.items() if v is True and k != "deterministic")
        loaded = self.artifact is not None  # a precompiled role: its code came with it
        artifact = record = None
        if not loaded and precompiled(self.device):
            artifact, record = _precompiled_paths(self.key, p.slot_keys)
            known = None  # a usable artifact would have been loaded (load_role): this compiles one
        if not loaded:
            self._set_up_compile(inputs, options, fixed_shapes, lazy=artifact is None)
        how = (
            "reusing cached compiled code"
            if known or loaded
            else "first compile on this machine, about a minute for 8B-sized graphs"
        )
        progress.report(f"compiling {role} graph ({how})", 0.0)
        t0 = time.perf_counter()
        self._compile_and_warm(inputs, artifact, options, progress)
        if record is not None and self.snapshot is not None and self.made_from is not None:
            _write_record(record, self)
        self.compile_s = time.perf_counter() - t0 + self.load_s
        self.cached = loaded or known is not None
        if not self.cached:
            _write_marker(
                marker,
                {
                    "role": role,
                    "compile_s": round(self.compile_s, 3),
                    "device": device_label(self.device),
                    "torch": torch.__version__,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                },
            )
        progress.report(f"compiled {role} graph in {self.compile_s:.1f} s", 0.8)
        if fixed_shapes and self.device.type == "cuda":
            progress.report(f"capturing {role} as a CUDA graph", 0.85)
            self._warm(inputs, 2)  # settle allocator and library handles before capture
            self.graphs[_signature(inputs)] = _Replay.capture(self, inputs)
        progress.report(f"{role} ready", 1.0)

    def _set_up_compile(
        self, inputs: Sequence[torch.Tensor], options: dict[str, Any], fixed_shapes: bool, lazy: bool
    ) -> None:
        """Rewrite one-row products for the decode step and the prefill's attention context; `lazy`: torch.compile now
        (it compiles on the first call)."""
        rewrite(self._graph(), inputs, self.device, fixed_shapes)
        if lazy:
            gm = self._graph().gm
            if not fixed_shapes:
                for i, dims in self.prepared.dynamic_dims.items():
                    for d in dims:
                        torch._dynamo.mark_dynamic(inputs[i], d)
            self.fn = _dynamo_compiled(gm, self.key, self.prepared.slot_keys, options)

    def _compile_and_warm(
        self, inputs: Sequence[torch.Tensor], artifact: Path | None, options: dict[str, Any], progress: Progress
    ) -> None:
        """Compile (into `artifact` where one is made) and run once; a compiler failure is one line naming the way out."""
        p = self.prepared
        try:
            if artifact is not None:
                graph = self._graph()
                self.fn, saved = _artifact(
                    artifact, graph.gm, p.state_args, inputs, graph.dynamic_dims, options, progress.part(0.0, 0.8)
                )
                self.artifact = artifact if saved else None  # no record for a file this compile did not write
            self._warm(inputs, 1)
        except UserError:
            raise
        except Exception as e:  # Inductor/Triton failures: say which engine to use instead
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"the compiled engine could not compile the {p.role} graph ({type(e).__name__}: {first[:200]}); "
                "run with --engine torch"
            ) from None

    def _warm(self, inputs: Sequence[torch.Tensor], times: int) -> None:
        if self.device.type != "cuda":
            for _ in range(times):
                self._run(inputs)
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(times):
                self._run(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)

    def describe(self) -> str:
        p = self.prepared
        how = "compiled (Inductor" + "".join(f", {name}" for name in self.settings)
        how += ", precompiled artifact" if self.artifact else ""
        how += f", {self.fn.describe()})" if isinstance(self.fn, CompiledRegions) else ")"
        if self.graphs:
            how += ", replayed as a CUDA graph"
        if self.compile_s is not None:
            how += f", compile {self.compile_s:.1f} s" + (" (cached)" if self.cached else "")
        if self.compiled_beside:
            how += ", compiled by a helper process beside the other role"
        if p.slot_keys:
            how += f", {len(p.slot_keys)} opaque slot(s)"
        return f"{p.role}: {how}"


class _Replay:
    """One captured CUDA graph over fixed input buffers. Inputs given as other tensors are copied in
    (and, where the graph writes them, back out)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple, outputs: tuple, mutated: frozenset[int]):
        self.graph, self.inputs, self.outputs, self.mutated = graph, inputs, outputs, mutated

    @classmethod
    def capture(cls, runner: CompiledRoleRunner, inputs: Sequence[torch.Tensor]) -> _Replay:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = runner._run(inputs)
        return cls(graph, tuple(inputs), outs, runner.prepared.mutated_inputs)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        copied = []
        for i, (mine, x) in enumerate(zip(self.inputs, inputs, strict=False)):
            if x is not mine:
                mine.copy_(x)
                copied.append(i)
        self.graph.replay()
        for i in copied:
            if i in self.mutated:
                inputs[i].copy_(self.inputs[i])
        return self.outputs


def _artifact(
    path: Path,
    gm: torch.fx.GraphModule,
    state_args: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    dynamic_dims: dict[int, tuple[int, ...]],
    options: dict[str, Any],
    progress: Progress = NO_PROGRESS,
) -> tuple[Any, bool]:
    """The role compiled now by Inductor alone (no Dynamo) and saved at `path` (owner-only; its record
    is written after it): by regions where regions.py finds cuts that change no bit (each distinct
    region compiled once, all of them kept in the one file), else as one graph. `dynamic_dims` (user
    input -> dimensions) stay symbolic: the example inputs reach Inductor as fake tensors with those
    sizes as symbols. An artifact already at `path` is never read here: only `load_role` loads one,
    after its record holds. Returns (compiled role, whether it was saved at `path`)."""
    n = len(state_args)
    flat = [*state_args, *inputs]
    dims = {n + i: d for i, d in dynamic_dims.items()}
    plan = plan_regions(gm) if regional() else None
    art: Any
    if plan is not None:
        art = compile_regions(plan, flat, dims, options, note=lambda s: progress.report(s, 0.1))
    else:
        art = standalone(gm, flat, dims, options, n_static=n)
    try:  # whole or not at all: a concurrent load never reads half a file
        if isinstance(art, CompiledRegions):
            save_regions(art, path)
        else:
            cache.write_private(path, lambda staged: art.save(path=str(staged), format="binary"))
    except OSError:
        return art, False  # the artifact is a convenience: this process runs the compiled code anyway
    return art, True


def graph_sha256(gm: torch.fx.GraphModule) -> str:
    """The compiled graph itself, scalar arguments included (its Python code), recorded with the
    artifact as what it was made from."""
    return hashlib.sha256(gm.code.encode("utf-8", "surrogatepass")).hexdigest()


def _write_record(path: Path, runner: CompiledRoleRunner) -> None:
    """The role record beside a precompiled artifact: what it was made from, the artifact's sha256,
    and what a later load needs instead of the graph."""
    prog, snapshot = runner.prepared, runner.snapshot
    if runner.artifact is None or snapshot is None or runner.made_from is None:
        return  # nothing to record: no artifact, or a runner made outside an engine (bench variants)
    graph = runner._graph().gm
    made = {**runner.made_from, **_role_made_from(prog.role, list(prog.slot_keys)), "graph_sha256": graph_sha256(graph)}
    try:
        cache.write_entry(
            path,
            made,
            {"artifact": runner.artifact},
            state_names=prog.state_names,
            fused_groups=prog.fused_groups,
            output_index=prog.output_index,
            mutated_inputs=sorted(prog.mutated_inputs),
            dynamic_dims={str(i): list(d) for i, d in prog.dynamic_dims.items()},
            snapshot=snapshot.to_dict(),
        )
    except (OSError, ValueError):
        pass  # the record is a convenience; without it the next load compiles again


def _role_made_from(role: str, slot_keys: list[str]) -> dict[str, Any]:
    return {"engine_role": role, "slot_keys": slot_keys, "torch_version": torch.__version__}


def _program_from_record(data: dict, role: str, state: dict[str, torch.Tensor], slot_keys: list[str]) -> RoleProgram:
    """The role's program from its record (one `cache.read_entry` accepted), over this pipeline's tensors (the
    recorded weight fusions replayed); ValueError where it does not fit this pipeline's state."""
    names = data["state_names"]
    if not isinstance(names, list) or any(n not in state for n in names):
        raise ValueError("lifted state this pipeline lacks")
    sources = [state[n] for n in names]
    prog = RoleProgram(
        role=role,
        state_args=[t.detach() for t in sources],
        state_sources=sources,
        state_names=list(names),
        fused_groups=[],
        output_index=[int(i) for i in data["output_index"]],
        mutated_inputs=frozenset(int(i) for i in data["mutated_inputs"]),
        dynamic_dims={int(i): tuple(int(d) for d in dims) for i, dims in data["dynamic_dims"].items()},
        slot_keys=tuple(slot_keys),
    )
    for idx in data["fused_groups"]:
        if not idx or any(not isinstance(i, int) or not 0 <= i < len(names) for i in idx):
            raise ValueError("a fused group out of range")
        fuse_weights(prog, idx)
    return prog


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)


def _read_marker(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None


def _write_marker(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=2) + "\n"
    try:
        cache.write_private(path, lambda p: p.write_text(text, encoding="utf-8"))
    except OSError:
        pass  # the index is a convenience; Inductor's own cache still works


def start_compile_workers(device: torch.device) -> None:
    """Inductor hands Triton kernels to its worker processes only once they are up, and compiles
    them one by one in this process until then; Dynamo starts them early, a compile without Dynamo
    does not. Started here, they come up while the role graphs are captured."""
    if device.type != "cuda":
        return
    try:
        from torch._inductor.async_compile import maybe_warm_pool

        maybe_warm_pool()
    except Exception:  # noqa: BLE001 - an optimization: the compile works without it
        pass


class CompiledEngine:
    name = "compiled"

    def __init__(self) -> None:
        _use_mcore_inductor_cache()

    def keeps_captures(self, device: torch.device) -> bool:
        return not precompiled(device)  # a precompiled role reloads from its artifact and record alone

    def compile_role(
        self,
        captured: Any,
        state: dict[str, torch.Tensor],
        slots: Sequence[tuple[SlotRecord, Any]],
        device: torch.device,
    ) -> CompiledRoleRunner:
        prepared = prepare_graph(captured, state, slots, device)
        if fuse_projections():
            fuse_sibling_projections(prepared)
        structure = structure_key(captured.family, captured.source.config, captured.gargs, captured.role)
        made = made_from(structure, [s for s, _ in slots], device)
        key = compile_key(structure, [s for s, _ in slots], device)
        return CompiledRoleRunner(prepared, device, key, snapshot=captured.snapshot, made_from=made)

    def load_role(
        self,
        fingerprint: str,
        role: str,
        state: dict[str, torch.Tensor],
        slots: Sequence[tuple[SlotRecord, Any]],
        device: torch.device,
        structure: RoleStructure | None = None,
    ) -> tuple[CompiledRoleRunner, Snapshot] | None:
        """The role and its snapshot from its precompiled artifact and record (see `precompiled`), with no capture
        and no graph; None where there is none for this structure, these slots, device and torch, it
        does not load, or its recorded graph, under this model's metadata, is not exactly the graph
        of `fingerprint` (the caller then captures and compiles as usual)."""
        loaded = self._load_role(fingerprint, role, state, slots, device, structure)
        if loaded is None:
            start_compile_workers(device)
        return loaded

    def _load_role(
        self,
        fingerprint: str,
        role: str,
        state: dict[str, torch.Tensor],
        slots: Sequence[tuple[SlotRecord, Any]],
        device: torch.device,
        structure: RoleStructure | None,
    ) -> tuple[CompiledRoleRunner, Snapshot] | None:
        if not precompiled(device) or structure is None:
            return None
        made = made_from(structure.key, [s for s, _ in slots], device)
        key = compile_key(structure.key, [s for s, _ in slots], device)
        slot_keys = [c.key for _, c in slots]
        artifact, record = _precompiled_paths(key, slot_keys)
        t0 = time.perf_counter()
        expected = {**made, **_role_made_from(role, slot_keys)}
        data, why = cache.read_entry(record, expected, {"artifact": artifact}, ignore=("graph_sha256",))
        if data is None:  # checked before anything is unpickled
            if why is not None:
                cache.stale(f"compiled {role} graph", artifact, why, "compiling")
            return None
        try:
            # another checkpoint of this structure compiled it: used only if its recorded graph,
            # under this model's metadata, is exactly the bundle's (every node, tensor, input, output)
            snapshot = rebased(Snapshot.from_dict(data.get("snapshot"), str(record)), structure.metadata, fingerprint)
            if snapshot is None:
                raise ValueError("its recorded graph, under this model's metadata, has another fingerprint")
            prog = _program_from_record(data, role, state, slot_keys)
            fn = _load_artifact(artifact, data)
        except (UserError, ValueError, KeyError, TypeError, AttributeError) as e:
            cache.stale(f"compiled {role} graph", artifact, str(e) or type(e).__name__, "compiling")
            return None
        runner = CompiledRoleRunner(prog, device, key, snapshot=snapshot, fn=fn, made_from=made)
        runner.artifact = artifact
        runner.load_s = time.perf_counter() - t0
        return runner, snapshot


def _load_artifact(path: Path, record: dict) -> Any:
    """The compiled role saved at `path` (one graph, or its regions: standalone.py) under `record`,
    which `load_role` accepted: the bytes unpickled are the bytes checked against it once more
    (cache.read_checked). ValueError where it still does not load (another layout of this torch, say)."""
    raw = cache.read_checked(record, "artifact", path)
    return load_regions(raw, _load_one) if is_regions(raw) else _load_one(raw)


def _load_one(raw: bytes) -> Any:
    """One Inductor artifact from its checked bytes, through a private temporary file (the API reads a path)."""
    from torch._inductor import CompiledArtifact

    with tempfile.TemporaryDirectory(prefix="mcore-artifact-") as tmp:  # 0700, this user's
        part = Path(tmp) / "artifact.bin"
        part.write_bytes(raw)
        try:
            return CompiledArtifact.load(path=str(part), format="binary")
        except Exception as e:  # noqa: BLE001 - compiled again, never trusted half-loaded
            raise ValueError(f"it does not load: {type(e).__name__}") from None
