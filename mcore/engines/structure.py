"""What a role's compiled code depends on apart from the model's identity, so that a second checkpoint
with the same architecture and shapes (a fine-tune: other weights, same config) reuses it.

A bundle's role fingerprint covers the model's identity (its spec, revision and config hash) and
the graph. Compiled code covers only the graph: the weights reach it as arguments, never as
constants. So precompiled roles are keyed by `structure_key` (the family, the role, the graph
arguments and what the family builds the graph from, `Family.structure(config)`), and a role
found under that key is used for another model only once its record holds (mcore/common/cache.py: made
from this structure, its artifact's sha256; nothing unpickled before) and its recorded snapshot,
given that model's metadata, has exactly the model's bundle fingerprint (`rebased`): every node,
tensor, input and output equal, or the role is captured and compiled as usual (docs/trust.md).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..families.graph_args import GraphArgs
from ..graph.snapshot import Snapshot, fingerprint


@dataclass(frozen=True)
class RoleStructure:
    key: str  # structure_key
    metadata: dict[str, Any]  # the snapshot metadata this model's capture writes (graph_metadata)


def structure_key(family: Any, config: dict, gargs: GraphArgs, role: str) -> str:
    payload = {
        "family": family.name,
        "role": role,
        "graph_args": gargs.to_dict(),
        "structure": family.structure(config),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def rebased(snapshot: Snapshot, metadata: dict[str, Any], expected: str) -> Snapshot | None:
    """`snapshot` (another model's capture of the same structure) with `metadata` in place of its
    own, if that has exactly the fingerprint `expected`; else None."""
    if snapshot.fingerprint == expected:
        return snapshot
    data = copy.deepcopy(snapshot.to_dict())
    data["metadata"] = {**metadata, "tool_versions": data.get("metadata", {}).get("tool_versions", {})}
    data["fingerprint"] = fingerprint(data)
    if data["fingerprint"] != expected:
        return None
    return Snapshot.from_dict(data, "rebased role record")
