"""A fixed, hand-made profile report (schema 2) of either engine: what the TUI snapshots show (no
measured number reaches a snapshot) and the valid file the profile reader's fuzz test mutates."""

from __future__ import annotations

RATE_KEYS = ("bytes", "flops", "bytes_per_s", "flops_per_s", "limit_seconds", "ratio_to_limit")


def _row(seconds: float, total: float, **kw) -> dict:
    row = dict(kw, seconds=seconds, share=seconds / total, headroom_seconds=seconds * 0.6)
    return row | {k: 0 for k in RATE_KEYS} | {"limit_seconds": seconds * 0.4, "ratio_to_limit": 0.4}


def _candidate(kind: str, seconds: float, total: float, node_ids: list[str], **kw) -> dict:
    return dict(
        kw,
        kind=kind,
        node_ids=node_ids,
        output_shape_input=None,
        seconds=seconds,
        share=seconds / total,
        headroom_seconds=seconds * 0.6,
        split_cost_seconds=0.0,
        net_headroom_seconds=seconds * 0.6,
        command="mcore graph select SNAPSHOT --nodes node:0 -o selection.json",
    )


def fixed_report(engine: str = "torch") -> dict:
    total = 1.0
    modules = [
        _row(s, total, path=p, calls=1)
        for p, s in (
            ("<root>", 1.0),
            ("decoder", 1.0),
            ("decoder.layers", 0.8),
            ("decoder.layers.0", 0.41),
            ("decoder.layers.1", 0.39),
            ("decoder.layers.0.mlp", 0.22),
            ("decoder.layers.1.mlp", 0.21),
            ("decoder.layers.0.self_attn", 0.15),
            ("decoder.layers.1.self_attn", 0.14),
            ("decoder.lm_head", 0.12),
            ("decoder.norm", 0.03),
            ("decoder.embed_tokens", 0.02),
        )
    ]
    nodes = [
        _row(s, total, id=f"node:{i}", name=f"n{i}", op=op, module_path="decoder", binding_id=None)
        for i, (op, s) in enumerate(
            (
                ("aten.linear.default", 0.55),
                ("mcore.decode_attention.default", 0.2),
                ("aten.mul.Tensor", 0.1),
                ("aten.add.Tensor", 0.08),
                ("aten.rsqrt.default", 0.04),
                ("aten.silu.default", 0.03),
            )
        )
    ]
    cands = [
        _candidate(
            "recipe",
            0.10,
            total,
            [f"node:{i}"],
            recipe="qwen.decode_attention_region@2",
            instance=f"decoder.layers.{i}.decode_attention",
        )
        for i in (0, 1)
    ]
    cands += [
        _candidate("region", s, total, [f"node:{k}" for k in range(n)], module_path=p)
        for p, s, n in (
            ("decoder.layers.0.mlp", 0.22, 7),
            ("decoder.layers.1.mlp", 0.21, 7),
            ("decoder.lm_head", 0.12, 2),
            ("decoder.layers.0.input_layernorm", 0.02, 6),
        )
    ]
    report = {
        "schema_version": 2,
        "kind": "mcore-profile",
        "role": "decode",
        "engine": {"name": "torch", "how": "op by op"},
        "timing": "wall clock per node between device synchronisations",
        "context": 128,
        "steps": 3,
        "bundle": {"model": "demo:qwen3-tiny", "fingerprint": "0" * 64, "build_args": {}},
        "device": {"type": "cpu", "name": "cpu", "copy_bytes_per_s": 1e10, "source": "cpu"},
        "versions": {"mcore": "0", "torch": "2.13.0", "cuda": None},
        "step_seconds": 1.0,
        "attributed_seconds": total,
        "unattributed_seconds": 0.0,
        "kernel_seconds": None,
        "between_kernels": None,
        "kernels": None,
        "nodes": nodes,
        "modules": modules,
        "recipes": [],
        "slots": [],
        "candidates": cands,
    }
    if engine == "compiled":
        _compiled(report)
    return report


def _compiled(report: dict) -> None:
    """The same report as a compiled profile: kernels, 12% of the step between them, and a candidate
    whose slot would split a fused kernel."""
    report["engine"] = {"name": "compiled", "how": "compiled (Inductor, deterministic), 4 kernel calls"}
    report["timing"] = "CPU time of each kernel call's profiler range inside the compiled step"
    report["step_seconds"] = 1.02
    report["kernel_seconds"] = 0.88
    report["between_kernels"] = {"seconds": 0.12, "share": 0.12, "gaps": 5, "what": "no kernel running"}
    report["kernels"] = [
        _row(s, 1.0, kernel=k, order=i + 1, node_ids=ids)
        for i, (k, s, ids) in enumerate(
            (
                ("cpp_fused_add_mul_rsqrt_0", 0.06, ["node:2", "node:3", "node:4"]),
                ("extern_kernels.mm", 0.55, ["node:0"]),
                ("torch.ops.mcore.decode_attention.default", 0.2, ["node:1"]),
                ("cpp_fused_silu_1", 0.07, ["node:5"]),
            )
        )
    ]
    for n in report["nodes"]:
        n["seconds"] *= 0.88
        n["share"] *= 0.88
    mlp = report["candidates"][2]
    mlp["splits"] = [
        {
            "kernel": "cpp_fused_add_mul_rsqrt_0",
            "order": 1,
            "inside": 1,
            "outside": 2,
            "seconds": 0.06,
            "cost_seconds": 0.02,
        }
    ]
    mlp["split_cost_seconds"] = 0.02
    mlp["net_headroom_seconds"] = mlp["headroom_seconds"] - 0.02
