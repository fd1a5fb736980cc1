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
index beside it (compiled/<key>.json, our key: role fingerprint, slot ABIs, device, torch) says
whether this pipeline was compiled on this machine before and how long that took.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch._inductor.config

from ..errors import UserError
from ..families.demo import cache_root
from ..fileio import write_json
from ..progress import NO_PROGRESS, Progress
from ..receipt import SlotRecord
from .fusion import fuse_sibling_projections
from .prepared import PreparedGraph, prepare_graph


def _use_mcore_inductor_cache() -> None:
    # Only where the user has not chosen a folder: Inductor and Triton read this at compile time.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} sm_{props.major}{props.minor} {props.multi_processor_count}SM"
    return "cpu"


def compile_key(fingerprint: str, slots: Sequence[SlotRecord], device: torch.device) -> str:
    """What decides the compiled code: the role graph, its slots' ABIs, the device and torch."""
    payload = {
        "fingerprint": fingerprint,
        "slots": [[s.binding_id, s.abi_sha256, list(s.node_ids)] for s in slots],
        "device": device_label(device),
        "torch": torch.__version__,
        "options": [fuse_projections(), tuning()],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def fuse_projections() -> bool:
    """MCORE_FUSE_PROJECTIONS=0 keeps q/k/v and gate/up as separate matrix products."""
    return os.environ.get("MCORE_FUSE_PROJECTIONS", "1") != "0"


def tuning() -> bool:
    """MCORE_COMPILE_TUNING=1: coordinate-descent tuning instead of deterministic mode."""
    return os.environ.get("MCORE_COMPILE_TUNING", "0") == "1"


def precompiled() -> bool:
    """MCORE_PRECOMPILED=1 (experimental): a fixed-shape role is compiled without Dynamo into one
    Inductor artifact file beside the index (compiled/<key>.<slot keys>.artifact), and later loads read that
    file instead of re-tracing the graph with Dynamo and walking Inductor's cache."""
    return os.environ.get("MCORE_PRECOMPILED", "0") == "1"


def compile_options(device: torch.device, fixed_shapes: bool) -> dict[str, Any]:
    """Inductor options. Deterministic mode skips every on-device benchmark whose pick changes the
    numbers (reduction launch shapes and the like), so each compile of a graph computes the same
    bits: a native and a slot pipeline agree in lockstep, and a reload matches the first run.
    MCORE_COMPILE_TUNING=1 trades that for coordinate-descent tuning of one-token kernels."""
    options: dict[str, Any] = {}
    if tuning() and fixed_shapes and device.type == "cuda":
        options["coordinate_descent_tuning"] = True  # matrix-vector kernels by Inductor, tuned on the device
    elif hasattr(torch._inductor.config, "deterministic"):
        options["deterministic"] = True
    return options


class CompiledRoleRunner:
    def __init__(self, prepared: PreparedGraph, device: torch.device, key: str):
        self.prepared = prepared
        self.device = device
        self.key = key
        self.fn: Optional[Callable[..., Any]] = None  # made by prepare(), which knows the role's shapes
        self.graphs: dict[tuple, _Replay] = {}
        self.compile_s: Optional[float] = None
        self.cached: Optional[bool] = None
        self.calls_compiled = 0  # calls that ran compiled code outside a CUDA graph
        self.artifact: Optional[Path] = None  # the precompiled artifact this role runs (MCORE_PRECOMPILED=1)

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
            self.fn = torch.compile(p.gm, fullgraph=True)
        return p.run(self.fn, inputs)

    # ------------------------------------------------------------------ preparing
    def prepare(self, *inputs: torch.Tensor, progress: Progress = NO_PROGRESS, fixed_shapes: bool = True) -> None:
        """Compile for these inputs; with fixed_shapes on CUDA also capture a CUDA graph over these buffers.

        Runs the role once or twice on the given buffers (a decode step writes one cache position,
        which later steps overwrite before reading)."""
        p = self.prepared
        role = p.role
        marker = cache_root() / "compiled" / f"{self.key}.json"
        known = _read_marker(marker)
        if not fixed_shapes:
            for i, dims in p.dynamic_dims.items():
                for d in dims:
                    torch._dynamo.mark_dynamic(inputs[i], d)
        options = compile_options(self.device, fixed_shapes)
        artifact = None
        if fixed_shapes and precompiled():
            # The compiled code names its slots by key (mcore::slot(..., key)): a pipeline whose slots
            # got other keys (a second one in this process) must not run the first one's kernels.
            slots = hashlib.sha256(",".join(p.slot_keys).encode()).hexdigest()[:12]
            artifact = marker.with_name(f"{self.key}.{slots}.artifact")
        if artifact is not None and not artifact.is_file():
            known = None  # compiled before through Dynamo, perhaps, but not into an artifact
        if artifact is None:
            self.fn = torch.compile(p.gm, fullgraph=True, options=options or None)
        how = (
            "reusing cached compiled code"
            if known
            else "first compile on this machine, about a minute for 8B-sized graphs"
        )
        progress.report(f"compiling {role} graph ({how})", 0.0)
        t0 = time.perf_counter()
        try:
            if artifact is not None:
                self.fn = _artifact(artifact, p.gm, [*p.state_args, *inputs], options)
                self.artifact = artifact
            self._warm(inputs, 1)
        except UserError:
            raise
        except Exception as e:  # Inductor/Triton failures: say which engine to use instead
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"the compiled engine could not compile the {role} graph ({type(e).__name__}: {first[:200]}); "
                "run with --engine torch"
            ) from None
        self.compile_s = time.perf_counter() - t0
        self.cached = known is not None
        if not known:
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
        how = "compiled (Inductor" + (", precompiled artifact)" if self.artifact else ")")
        if self.graphs:
            how += ", replayed as a CUDA graph"
        if self.compile_s is not None:
            how += f", compile {self.compile_s:.1f} s" + (" (cached)" if self.cached else "")
        if p.slot_keys:
            how += f", {len(p.slot_keys)} opaque slot(s)"
        return f"{p.role}: {how}"


class _Replay:
    """One captured CUDA graph over fixed input buffers. Inputs given as other tensors are copied in
    (and, where the graph writes them, back out)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple, outputs: tuple, mutated: frozenset[int]):
        self.graph, self.inputs, self.outputs, self.mutated = graph, inputs, outputs, mutated

    @classmethod
    def capture(cls, runner: CompiledRoleRunner, inputs: Sequence[torch.Tensor]) -> "_Replay":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = runner._run(inputs)
        return cls(graph, tuple(inputs), outs, runner.prepared.mutated_inputs)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        copied = []
        for i, (mine, x) in enumerate(zip(self.inputs, inputs)):
            if x is not mine:
                mine.copy_(x)
                copied.append(i)
        self.graph.replay()
        for i in copied:
            if i in self.mutated:
                inputs[i].copy_(self.inputs[i])
        return self.outputs


def _artifact(path: Path, gm: torch.fx.GraphModule, args: list[torch.Tensor], options: dict[str, Any]) -> Any:
    """The role compiled by Inductor alone (no Dynamo), from `path` when an earlier load saved it
    (a file another torch cannot read is compiled afresh), else compiled now and saved there."""
    from torch._inductor import CompiledArtifact, standalone_compile

    if path.is_file():
        try:
            return CompiledArtifact.load(path=str(path), format="binary")
        except Exception:  # noqa: BLE001 - a stale or damaged artifact: compile it again below
            pass
    art = standalone_compile(gm, list(args), dynamic_shapes="from_example_inputs", options={"config_patches": options})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        art.save(path=str(staged), format="binary")
        os.replace(staged, path)  # whole or not at all: a concurrent load never reads half a file
    except OSError:
        pass  # the artifact is a convenience: this process runs the compiled code anyway
    return art


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)


def _read_marker(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_marker(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, data)
    except (OSError, UserError):
        pass  # the index is a convenience; Inductor's own cache still works


class CompiledEngine:
    name = "compiled"

    def __init__(self) -> None:
        _use_mcore_inductor_cache()

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
        key = compile_key(captured.snapshot.fingerprint, [s for s, _ in slots], device)
        return CompiledRoleRunner(prepared, device, key)
