"""Hand-made snapshot dicts for testing the region rules without capturing a model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mcore.graph.snapshot import KIND, SCHEMA_VERSION, fingerprint


def dag_snapshot(
    n: int,
    edges: Iterable[tuple[int, int]],
    *,
    dtype: str = "FP32",
    shape: Sequence[int] = (4, 8),
    ops: dict[int, str] | None = None,
    role: str = "decode",
    tensor_overrides: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Nodes node:0..n-1 in topological order; node i outputs tensor:(i+1); tensor:0 is the graph input,
    read by every node without predecessors; tensors of nodes without consumers are graph outputs."""
    edges = sorted(set((a, b) for a, b in edges if a < b))
    preds = {i: [a for a, b in edges if b == i] for i in range(n)}
    succs = {i: [b for a, b in edges if a == i] for i in range(n)}
    tensors = [
        {
            "id": "tensor:0",
            "name": "x",
            "dtype": dtype,
            "shape": list(shape),
            "location": "device",
            "is_shape_tensor": False,
            "format": "linear",
            "producer": None,
            "consumers": [f"node:{i}" for i in range(n) if not preds[i]],
        }
    ]
    nodes = []
    outputs = []
    for i in range(n):
        ins = [f"tensor:{a + 1}" for a in preds[i]] or ["tensor:0"]
        nodes.append(
            {
                "id": f"node:{i}",
                "op": (ops or {}).get(i, "aten.add.Tensor"),
                "category": "LayerType.OTHER",
                "name": f"op{i}",
                "module_path": f"m.block{i}",
                "inputs": ins,
                "outputs": [f"tensor:{i + 1}"],
            }
        )
        t = {
            "id": f"tensor:{i + 1}",
            "name": f"op{i}",
            "dtype": dtype,
            "shape": list(shape),
            "location": "device",
            "is_shape_tensor": False,
            "format": "linear",
            "producer": f"node:{i}",
            "consumers": [f"node:{b}" for b in succs[i]],
        }
        t.update((tensor_overrides or {}).get(i + 1, {}))
        tensors.append(t)
        if not succs[i]:
            outputs.append(f"tensor:{i + 1}")
            t["is_network_output"] = True
            t["output_name"] = f"out{i}"
    snap = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "metadata": {
            "family": "test",
            "model": "test",
            "revision": None,
            "engine_role": role,
            "build_args": {},
            "tool_versions": {},
        },
        "nodes": nodes,
        "tensors": tensors,
        "inputs": ["tensor:0"],
        "outputs": outputs,
    }
    snap["fingerprint"] = fingerprint(snap)
    return snap


def chain_snapshot(n: int, **kw: Any) -> dict[str, Any]:
    return dag_snapshot(n, [(i, i + 1) for i in range(n - 1)], **kw)
