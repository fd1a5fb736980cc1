"""Which graph nodes the compiled engine fuses into which kernel.

The role graph is compiled once more by Inductor with its provenance tracing on (in a temporary
debug folder, bypassing the compiled-code cache, whose hits generate no code); Inductor then
writes, per compiled graph, a map from each kernel call it generated or made (a fused C++/Triton
kernel, or an extern one such as a GEMM library call), numbered in call order, to the post-grad
nodes it computes, and from those back to the nodes of the graph it was given, whose names are
our graph's. A slot is opaque to the compiler, so a kernel that fuses nodes inside a candidate
region with nodes outside it is what a slot there would split.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch._inductor.config
from torch import fx

from ..common.errors import UserError
from .gemv_pass import use_gemv
from .prepared import PreparedGraph

EXTERN_PREFIXES = ("extern_kernels.", "torch.ops.", "aten.")  # calls Inductor makes rather than generates


@contextmanager
def provenance_trace(folder: str) -> Iterator[None]:
    """Inductor compiles inside this block write their provenance maps under `folder`; the
    compiled-code cache is bypassed (a cache hit generates no code, so it would write no map), and
    each generated C++ kernel marks itself for the profiler (`cpp.enable_kernel_profile`)."""
    settings: dict[str, Any] = {
        "trace.enabled": True,
        "trace.provenance_tracking_level": 1,
        "trace.debug_dir": folder,
        "fx_graph_cache": False,
    }
    if hasattr(torch._inductor.config.cpp, "enable_kernel_profile"):
        settings["cpp.enable_kernel_profile"] = True
    try:
        patch = torch._inductor.config.patch(settings)
    except (AttributeError, KeyError) as e:
        raise UserError(
            f"this torch ({torch.__version__}) has no Inductor provenance tracking ({e}); "
            "the kernel report needs a newer torch"
        ) from None
    with patch:
        yield


def read_provenance(folder: str, gm: fx.GraphModule) -> list[dict[str, Any]]:
    """[{"kernel": name, "order": call number, "nodes": [names of `gm`'s nodes]}] for every kernel
    call of the graphs compiled under `provenance_trace(folder)`, in call order. A node an extern
    call computes (a library GEMM, a custom op) belongs to that call alone: Inductor also lists it
    under the generated kernel that prepares its inputs."""
    maps = [
        json.loads(open(p).read())
        for p in sorted(glob.glob(f"{folder}/**/inductor_provenance_tracking_node_mappings.json", recursive=True))
    ]
    if not maps:
        raise UserError("Inductor wrote no provenance map for this graph; the kernel report is unavailable here")
    graph_names = {n.name for n in gm.graph.nodes}
    out: list[dict[str, Any]] = []
    for m in maps:
        post_to_pre = m.get("postToPre", {})
        for key, kernels in m.items():
            if not key.endswith("CodeToPost"):  # cppCodeToPost (CPU and GPU wrappers alike)
                continue
            for handle, posts in kernels.items():
                name, _, order = handle.rpartition(":")
                nodes = sorted({pre for post in posts for pre in post_to_pre.get(post, [post]) if pre in graph_names})
                out.append(
                    {"kernel": name or handle, "order": int(order) if order.isdigit() else len(out), "nodes": nodes}
                )
    extern_nodes = {n for k in out if k["kernel"].startswith(EXTERN_PREFIXES) for n in k["nodes"]}
    for k in out:
        if not k["kernel"].startswith(EXTERN_PREFIXES):
            k["nodes"] = [n for n in k["nodes"] if n not in extern_nodes]
    out.sort(key=lambda k: k["order"])
    return out


def absorbed(gm: fx.GraphModule) -> dict[str, list[str]]:
    """Nodes an mcore rewrite folded into one of its ops (gemv_pass.fuse_gating, the engine's fused
    sibling projections), by the name of the op that now computes them."""
    return {n.name: list(n.meta["mcore_fused_nodes"]) for n in gm.graph.nodes if "mcore_fused_nodes" in n.meta}


def fused_kernels(prepared: PreparedGraph, inputs: Sequence[torch.Tensor], gemv: bool = False) -> list[dict[str, Any]]:
    """[{"kernel": name, "nodes": [graph node names]}] in launch order, for this role's graph.
    `gemv`: first put `mcore::gemv` in place of its one-row products, as the compiled engine does for
    a fixed-shape role on CUDA (on a copy: `prepared` stays as it is)."""
    if gemv:
        prepared = dataclasses.replace(prepared, gm=copy.deepcopy(prepared.gm))
        use_gemv(prepared, inputs)
    with tempfile.TemporaryDirectory(prefix="mcore-fusion-") as d:
        with provenance_trace(d), torch.no_grad():
            fn = torch.compile(prepared.gm, fullgraph=True)
            prepared.run(fn, inputs)
        out = [k for k in read_provenance(d, prepared.gm) if k["nodes"]]
    folded = absorbed(prepared.gm)
    for k in out:  # nodes an mcore rewrite folded into one of its ops count as its kernel's
        k["nodes"] = sorted({*k["nodes"], *(m for node in k["nodes"] for m in folded.get(node, []))})
    return out


def split_by(kernels: Sequence[dict[str, Any]], region: set[str]) -> list[dict[str, Any]]:
    """The kernels a slot over `region` (node names) would split: fused with nodes on both sides."""
    out = []
    for k in kernels:
        inside = [n for n in k["nodes"] if n in region]
        if inside and len(inside) < len(k["nodes"]):
            out.append({"kernel": k["kernel"], "inside": len(inside), "outside": len(k["nodes"]) - len(inside)})
    return out
