"""Text views of a snapshot shared by the CLI and the TUI: node rows, the module tree, ABI tables."""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from collections.abc import Iterable

from ..common.errors import printable  # noqa: F401 - re-exported for the CLI
from ..selection.receipt import SlotRecord
from .snapshot import Node, Snapshot, Tensor


def node_matches(node: Node, pattern: str | None) -> bool:
    """--match GLOB against node ID, op, layer category, name and module path (case-insensitive)."""
    if not pattern:
        return True
    pat = pattern.lower()
    fields = (node.id, node.op, node.category or "", node.name, node.module_path)
    return any(fnmatch.fnmatchcase(str(f).lower(), pat) for f in fields)


def tensor_refs(ix: Snapshot, tids: Iterable[str]) -> str:
    parts = []
    for t in tids:
        out = ix.tensor(t).output_name if ix.is_output(t) else None
        parts.append(f"{t}({out})" if out else t)
    return ",".join(parts)


def node_row(ix: Snapshot, node: Node) -> str:
    return (
        f"{node.id:<10} {node.op:<34} {node.category or '':<48} "
        f"{tensor_refs(ix, node.inputs)} -> {tensor_refs(ix, node.outputs)}"
        + (f"  [{node.module_path}]" if node.module_path else "")
    )


def list_lines(snapshot: Snapshot, pattern: str | None = None) -> list[str]:
    return [node_row(snapshot, n) for n in snapshot.nodes if node_matches(n, pattern)]


def module_tree(snapshot: Snapshot) -> OrderedDict[str, int]:
    """Module path -> number of nodes at or below it, in first-appearance order."""
    counts: OrderedDict[str, int] = OrderedDict()
    for n in snapshot.nodes:
        path = n.module_path
        parts = path.split(".") if path else []
        counts.setdefault("", 0)
        counts[""] += 1
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            counts[key] = counts.get(key, 0) + 1
    return counts


def tree_lines(snapshot: Snapshot) -> list[str]:
    meta = snapshot.metadata
    lines = []
    for path, count in module_tree(snapshot).items():
        if path == "":
            lines.append(f"{meta['engine_role']} ({meta['model']})  {count} nodes")
            continue
        depth = path.count(".") + 1
        lines.append(f"{'  ' * depth}{path.rsplit('.', 1)[-1]}  {count} nodes  [{path}]")
    return lines


def tensor_desc(t: Tensor) -> str:
    return f"{t.dtype} {t.location} {list(t.shape)}"


def abi_lines(receipt: SlotRecord) -> list[str]:
    """The readable ABI of a receipt or slot record, one fact a line."""
    return receipt.abi_lines()


def versions_line(versions: dict) -> str:
    """The tools that made a snapshot or bundle: shown, never part of a fingerprint."""
    shown = " ".join(f"{k}={v}" for k, v in versions.items()) or "unknown"
    return f"tool_versions: {shown} (recorded only; fingerprints cover the model and the graph)"
