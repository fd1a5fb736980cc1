"""Which graph nodes the compiled engine fuses into which kernel.

The role graph is compiled once more by Inductor with its provenance tracing on (in a temporary
debug folder, bypassing the compiled-code cache, whose hits generate no code); Inductor then
writes, per compiled graph, a map from each kernel it generated or called (a fused C++/Triton
kernel, or an extern one such as a GEMM library call) to the post-grad nodes it computes, and
from those back to the nodes of the graph it was given, whose names are our graph's. A slot is
opaque to the compiler, so a kernel that fuses nodes inside a candidate region with nodes
outside it is what a slot there would split.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import tempfile
from typing import Any, Sequence

import torch
import torch._inductor.config

from ..errors import UserError
from .gemv_pass import use_gemv
from .prepared import PreparedGraph


def fused_kernels(prepared: PreparedGraph, inputs: Sequence[torch.Tensor], gemv: bool = False) -> list[dict[str, Any]]:
    """[{"kernel": name, "nodes": [graph node names]}] in launch order, for this role's graph.
    `gemv`: first put `mcore::gemv` in place of its one-row products, as the compiled engine does for
    a fixed-shape role on CUDA (on a copy: `prepared` stays as it is)."""
    if gemv:
        prepared = dataclasses.replace(prepared, gm=copy.deepcopy(prepared.gm))
        use_gemv(prepared, inputs)
    with tempfile.TemporaryDirectory(prefix="mcore-fusion-") as d:
        try:
            patch = torch._inductor.config.patch(
                {
                    "trace.enabled": True,
                    "trace.provenance_tracking_level": 1,
                    "trace.debug_dir": d,
                    "fx_graph_cache": False,
                }
            )
        except (AttributeError, KeyError) as e:
            raise UserError(
                f"this torch ({torch.__version__}) has no Inductor provenance tracking ({e}); "
                "the fusion report needs a newer torch"
            ) from None
        with patch, torch.no_grad():
            fn = torch.compile(prepared.gm, fullgraph=True)
            prepared.run(fn, inputs)
        maps = [
            json.loads(open(p).read())
            for p in sorted(glob.glob(f"{d}/**/inductor_provenance_tracking_node_mappings.json", recursive=True))
        ]
    if not maps:
        raise UserError("Inductor wrote no provenance map for this graph; the fusion report is unavailable here")
    graph_names = {n.name for n in prepared.gm.graph.nodes}
    out: list[dict[str, Any]] = []
    for m in maps:
        post_to_pre = m.get("postToPre", {})
        for key, kernels in m.items():
            if not key.endswith("CodeToPost"):  # cppCodeToPost (CPU and GPU wrappers alike)
                continue
            for handle, posts in kernels.items():
                name, _, order = handle.rpartition(":")
                nodes = sorted({pre for post in posts for pre in post_to_pre.get(post, [post]) if pre in graph_names})
                if nodes:
                    out.append(
                        {"kernel": name or handle, "order": int(order) if order.isdigit() else len(out), "nodes": nodes}
                    )
    absorbed = {n.name: n.meta["mcore_fused_nodes"] for n in prepared.gm.graph.nodes if "mcore_fused_nodes" in n.meta}
    for k in out:  # nodes an mcore rewrite folded into one of its ops (gemv_pass.fuse_gating) count as its kernel's
        k["nodes"] = sorted({*k["nodes"], *(m for node in k["nodes"] for m in absorbed.get(node, []))})
    out.sort(key=lambda k: k["order"])
    return out


def split_by(kernels: Sequence[dict[str, Any]], region: set[str]) -> list[dict[str, Any]]:
    """The kernels a slot over `region` (node names) would split: fused with nodes on both sides."""
    out = []
    for k in kernels:
        inside = [n for n in k["nodes"] if n in region]
        if inside and len(inside) < len(k["nodes"]):
            out.append({"kernel": k["kernel"], "inside": len(inside), "outside": len(k["nodes"]) - len(inside)})
    return out
