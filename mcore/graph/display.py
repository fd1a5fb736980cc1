"""Text views of a snapshot shared by the CLI and the TUI: node rows, the module tree, ABI tables."""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from typing import Any, Iterable

from ..errors import printable  # noqa: F401 - re-exported for the CLI
from .snapshot import SnapshotIndex


def node_matches(node: dict[str, Any], pattern: str | None) -> bool:
    """--match GLOB against node ID, op, layer category, name and module path (case-insensitive)."""
    if not pattern:
        return True
    pat = pattern.lower()
    fields = (node["id"], node["op"], node.get("category", ""), node["name"], node["module_path"])
    return any(fnmatch.fnmatchcase(str(f).lower(), pat) for f in fields)


def tensor_refs(ix: SnapshotIndex, tids: Iterable[str]) -> str:
    parts = []
    for t in tids:
        out = ix.tensors[t].get("output_name") if t in ix.outputs else None
        parts.append(f"{t}({out})" if out else t)
    return ",".join(parts)


def node_row(ix: SnapshotIndex, node: dict[str, Any]) -> str:
    return (
        f"{node['id']:<10} {node['op']:<34} {node.get('category', ''):<48} "
        f"{tensor_refs(ix, node['inputs'])} -> {tensor_refs(ix, node['outputs'])}"
        + (f"  [{node['module_path']}]" if node["module_path"] else "")
    )


def list_lines(snapshot: dict[str, Any], pattern: str | None = None) -> list[str]:
    ix = SnapshotIndex(snapshot)
    return [node_row(ix, n) for n in snapshot["nodes"] if node_matches(n, pattern)]


def module_tree(snapshot: dict[str, Any]) -> "OrderedDict[str, int]":
    """Module path -> number of nodes at or below it, in first-appearance order."""
    counts: "OrderedDict[str, int]" = OrderedDict()
    for n in snapshot["nodes"]:
        path = n["module_path"]
        parts = path.split(".") if path else []
        counts.setdefault("", 0)
        counts[""] += 1
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            counts[key] = counts.get(key, 0) + 1
    return counts


def tree_lines(snapshot: dict[str, Any]) -> list[str]:
    meta = snapshot["metadata"]
    lines = []
    for path, count in module_tree(snapshot).items():
        if path == "":
            lines.append(f"{meta['engine_role']} ({meta['model']})  {count} nodes")
            continue
        depth = path.count(".") + 1
        lines.append(f"{'  ' * depth}{path.rsplit('.', 1)[-1]}  {count} nodes  [{path}]")
    return lines


def tensor_desc(t: dict[str, Any]) -> str:
    return f"{t['dtype']} {t['location']} {list(t['shape'])}"


def abi_lines(receipt: dict[str, Any]) -> list[str]:
    abi = receipt["abi"]
    lines = [
        f"binding_id={receipt['binding_id']}",
        f"abi_sha256={receipt['abi_sha256']}",
        f"engine_role={receipt['engine_role']}",
        f"graph_fingerprint={receipt['graph_fingerprint']}",
        f"call: {abi['call']}",
    ]
    for e in abi["inputs"]:
        lines.append(
            f"input[{e['index']}]  {e['tensor_id']:<12} {e['name']:<24} {e['dtype']} {e['location']} {e['shape']}"
        )
    for e in abi["outputs"]:
        lines.append(
            f"output[{e['index']}] {e['tensor_id']:<12} {e['name']:<24} {e['dtype']} {e['location']} {e['shape']}"
        )
    lines.append(f"workspace {receipt['workspace_bytes']} bytes")
    extras = receipt["extra_args"]
    lines.append("extra args " + (", ".join(f"{a['type']}={a.get('value')}" for a in extras) if extras else "none"))
    rule = receipt["output_shape_input"]
    lines.append("output shape " + (f"like input[{rule}]" if rule is not None else "fixed as declared"))
    return lines


def versions_line(versions: dict) -> str:
    """The tools that made a snapshot or bundle: shown, never part of a fingerprint."""
    shown = " ".join(f"{k}={v}" for k, v in versions.items()) or "unknown"
    return f"tool_versions: {shown} (recorded only; fingerprints cover the model and the graph)"
