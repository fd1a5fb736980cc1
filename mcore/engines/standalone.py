"""Compiling a role graph with Inductor alone (no Dynamo), whole or by regions (regions.py), and the
one file a compiled role is kept in.

A whole-graph role is one Inductor artifact file, as `CompiledArtifact.save` writes it. A role
compiled by regions is one file too: a small header (the region calls: which values each region
reads, which compiled region runs it, the role's outputs) followed by each distinct region's
artifact, so the role record's sha256 of that file (mcore/common/cache.py), checked before anything is
unpickled, covers every region in it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..common import cache
from .regions import RegionalProgram, RegionPlan, unique_regions

MAGIC = b"mcore regional artifact v1\n"
KIND = "mcore.regional_artifact"


def regional() -> bool:
    """MCORE_REGIONAL=0 compiles each role as one graph, as before regional compilation."""
    return os.environ.get("MCORE_REGIONAL", "1") != "0"


def standalone(
    gm: torch.fx.GraphModule,
    args: Sequence[torch.Tensor],
    dynamic_dims: dict[int, tuple[int, ...]],
    options: dict[str, Any],
    n_static: int = 0,
) -> Any:
    """`gm` compiled by Inductor for arguments shaped as `args` (the first `n_static` with static
    shapes; argument i's `dynamic_dims[i]` symbolic, the others fixed). The examples reach Inductor
    as fake tensors in a tracing context of our own (the `fake_mode=` argument is newer than torch 2.11)."""
    from torch._inductor import standalone_compile
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    examples: list[Any] = []
    for i, a in enumerate(args):
        if i < n_static:
            examples.append(fake_mode.from_tensor(a, static_shapes=True))
            continue
        dims = dynamic_dims.get(i, ())
        sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(a.dim())]
        examples.append(fake_mode.from_tensor(a, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        return standalone_compile(
            gm, examples, dynamic_shapes="from_tracing_context", options={"config_patches": options}
        )


class CompiledRegions:
    """A role compiled by regions: the program that runs it and what its file keeps."""

    def __init__(self, program: RegionalProgram, compiled: list[int], artifacts: list[Any], layers: list[str]):
        self.program = program
        self.compiled = compiled  # per region: its index in `artifacts`
        self.artifacts = artifacts  # the distinct compiled regions
        self.layers = layers
        self.compile_s: list[float] = []  # per distinct region, its compile time

    def __call__(self, *flat: Any) -> Any:
        return self.program(*flat)

    def describe(self) -> str:
        return f"{len(self.compiled)} regions, {len(self.artifacts)} compiled"


def compile_regions(
    plan: RegionPlan,
    flat: Sequence[torch.Tensor],
    dynamic_dims: dict[int, tuple[int, ...]],
    options: dict[str, Any],
    note: Callable[[str], None] = lambda s: None,
) -> CompiledRegions:
    """Compile each distinct region once and run the regions in order on `flat` (the role's
    arguments: state then inputs; `dynamic_dims` by argument index): each region's outputs are
    the example inputs of the regions after it, with the dimensions symbolic that are symbolic in
    the graph. Runs the role once (as its warm-up does)."""
    first = unique_regions(plan.signatures)
    env: list[Any] = list(flat)
    dims: dict[int, tuple[int, ...]] = dict(dynamic_dims)
    by_key: dict[tuple, int] = {}
    artifacts: list[Any] = []
    compiled: list[int] = []
    times: list[float] = []
    for r, (module, idx) in enumerate(zip(plan.modules, plan.args, strict=True)):
        args = [env[i] for i in idx]
        key = (plan.signatures[first[r]], tuple(_layout(a) for a in args), _aliasing(args))
        slot = by_key.get(key)
        if slot is None:
            note(f"compiling region {r + 1}/{len(plan.modules)} ({plan.layers[r]})")
            t0 = time.perf_counter()
            local = {j: dims[i] for j, i in enumerate(idx) if dims.get(i)}
            artifacts.append(standalone(module, args, local, options))
            times.append(time.perf_counter() - t0)
            slot = by_key[key] = len(artifacts) - 1
        compiled.append(slot)
        outs = artifacts[slot](*args)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        if len(outs) != len(plan.out_dims[r]):
            raise RuntimeError(f"region {r} returned {len(outs)} values, its graph {len(plan.out_dims[r])}")
        for d, value in zip(plan.out_dims[r], outs, strict=True):
            if d:
                dims[len(env)] = d
            env.append(value)
    result = CompiledRegions(
        RegionalProgram([artifacts[c] for c in compiled], plan.args, plan.outputs, len(flat)),
        compiled,
        artifacts,
        plan.layers,
    )
    result.compile_s = times
    return result


def _aliasing(args: Sequence[Any]) -> tuple[int, ...]:
    """Per argument, the first argument sharing its storage: code compiled for inputs that alias
    serves only inputs that alias the same way."""
    seen: dict[int, int] = {}
    out = []
    for i, a in enumerate(args):
        ptr = a.untyped_storage().data_ptr() if isinstance(a, torch.Tensor) else -1 - i
        out.append(seen.setdefault(ptr, i))
    return tuple(out)


def _layout(t: Any) -> tuple:
    if isinstance(t, torch.Tensor):
        return (tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device))
    return (type(t).__name__,)


def save_regions(regions: CompiledRegions, path: Path) -> None:
    """One file, owner-only (cache.write_private): the header, then each distinct region's artifact
    (whole or not at all). The role record written after it covers the whole file's sha256."""
    with tempfile.TemporaryDirectory(prefix="mcore-regions-") as tmp:
        blobs = []
        for k, art in enumerate(regions.artifacts):
            part = Path(tmp) / f"{k}.bin"
            art.save(path=str(part), format="binary")
            blobs.append(part.read_bytes())
    p = regions.program
    header = json.dumps(
        {
            "kind": KIND,
            "schema_version": 1,
            "torch": torch.__version__,
            "n_in": p.n_in,
            "args": p.args,
            "outputs": p.outputs,
            "compiled": regions.compiled,
            "layers": regions.layers,
            "sizes": [len(b) for b in blobs],
        }
    ).encode()

    def write(staged: Path) -> None:
        with open(staged, "wb") as f:
            f.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for b in blobs:
                f.write(b)

    cache.write_private(path, write)  # a concurrent load never reads half a file


def is_regions(raw: bytes) -> bool:
    """Whether a role's artifact bytes are save_regions' file (else one Inductor artifact)."""
    return raw.startswith(MAGIC)


def load_regions(raw: bytes, load_one: Callable[[bytes], Any]) -> CompiledRegions:
    """The role save_regions kept in `raw` (the file's bytes, already checked against the role
    record's sha256: mcore/cache.read_checked), each region's artifact read by `load_one` (its
    bytes -> artifact, ValueError where it does not load); ValueError where the file is damaged,
    from another torch or incomplete."""
    try:
        n = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 8], "little")
        start = len(MAGIC) + 8
        header = json.loads(raw[start : start + n])
        if not isinstance(header, dict) or header.get("kind") != KIND or header.get("schema_version") != 1:
            raise ValueError("its header is not a regional artifact's")
        if header.get("torch") != torch.__version__:
            raise ValueError("it was compiled by another torch")
        sizes, compiled = [int(x) for x in header["sizes"]], [int(c) for c in header["compiled"]]
        args, outputs, n_in = header["args"], header["outputs"], int(header["n_in"])
        if len(compiled) != len(args) or any(not 0 <= c < len(sizes) for c in compiled):
            raise ValueError("its header does not fit its regions")
        if any(x < 0 for x in sizes) or start + n + sum(sizes) != len(raw):
            raise ValueError("it is incomplete")
    except (KeyError, TypeError, RecursionError, UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("its header is unreadable") from None
    artifacts = []
    offset = start + n
    for size in sizes:
        artifacts.append(load_one(raw[offset : offset + size]))
        offset += size
    program = RegionalProgram([artifacts[c] for c in compiled], args, outputs, n_in)
    return CompiledRegions(program, compiled, artifacts, [str(x) for x in header.get("layers", [])])
