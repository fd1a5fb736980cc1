"""`mcore profile` on the demo models (CPU): time attributed to nodes, modules, recipe instances and
slots; candidate regions that select_region() accepts; profiles that compare."""

from __future__ import annotations

import json

import pytest

from mcore.selection.region import select_region

from .conftest import assert_user_error


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from mcore.bundle.build import build_bundle
    from mcore.model.buildargs import BuildArgs

    d = tmp_path_factory.mktemp("profile")
    qwen = build_bundle(BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=256), d / "q.bundle")
    enc = build_bundle(BuildArgs(model="demo:distilbert-tiny", precision="fp32"), d / "e.bundle")
    return qwen, enc


def _profile(mcore, tmp_path, bundle, *extra):
    out = tmp_path / "p.json"
    r = mcore("profile", bundle, "--steps", "3", "--device", "cpu", "-o", out, *extra)  # CPU tests, also on a GPU box
    assert r.code == 0, r
    return r, json.loads(out.read_text())


def test_decoder_profile_attributes_the_step(mcore, tmp_path, bundles):
    qwen, _ = bundles
    r, p = _profile(mcore, tmp_path, qwen.bundle_path, "--context", "100")
    assert p["schema_version"] == 2 and p["role"] == "decode" and p["context"] == 100
    assert p["engine"]["name"] == "torch"  # what the pipeline runs on the CPU
    assert p["between_kernels"] is None and p["kernels"] is None
    assert p["bundle"]["fingerprint"] == qwen.manifest.roles["decode"].fingerprint
    assert p["device"]["type"] == "cpu" and p["device"]["copy_bytes_per_s"] > 0 and p["versions"]["torch"]
    # every timed graph node is a snapshot node, and the node times add up to the attributed total
    snap_ids = {n["id"] for n in json.loads(json.dumps(p["nodes"])) if n["id"]}
    assert len(snap_ids) == len(p["nodes"])
    assert sum(n["seconds"] for n in p["nodes"]) == pytest.approx(p["attributed_seconds"])
    # modules: the root covers all, each layer is a share of it
    root = next(m for m in p["modules"] if m["path"] == "decoder")
    assert root["seconds"] == pytest.approx(p["attributed_seconds"])
    layers = [m for m in p["modules"] if m["path"] in ("decoder.layers.0", "decoder.layers.1")]
    assert len(layers) == 2 and all(0 < m["share"] < 1 for m in layers)
    # the attention node reads only the active length of each cache
    att = next(n for n in p["nodes"] if n["op"] == "mcore.decode_attention.default")
    kv, d = 2, 16  # demo:qwen3-tiny: 2 KV heads, head_dim 16, fp32
    assert att["bytes"] >= 2 * kv * 101 * d * 4 and att["bytes"] < 2 * kv * 256 * d * 4
    assert "qwen.decode_attention_region@2 decoder.layers.0.decode_attention" in r.out


@pytest.mark.timing
def test_decoder_profile_total_is_the_steps_order_of_magnitude(mcore, tmp_path, bundles):
    """Timing each op apart (synchronised) adds up to the plain step's order of magnitude: a sanity
    bound, not a speed check. Marked `timing`: the two are measured at different moments, and on a
    2-core box shared with other jobs they spread 4.3x once and 70x another time (3 steps: one
    burst of load in two of them moves either median). Nine steps need five such bursts."""
    qwen, _ = bundles
    _, p = _profile(mcore, tmp_path, qwen.bundle_path, "--context", "100", "--steps", "9")
    assert 0.1 * p["step_seconds"] <= p["attributed_seconds"] <= 10.0 * p["step_seconds"]


def test_candidates_are_regions_select_region_accepts(mcore, tmp_path, bundles):
    qwen, _ = bundles
    r, p = _profile(mcore, tmp_path, qwen.bundle_path, "--top", "20")
    from mcore.graph.capture import capture
    from mcore.model.buildargs import BuildArgs

    snap = capture(BuildArgs.from_dict(qwen.manifest.build_args), "decode").snapshot
    kinds = [c["kind"] for c in p["candidates"]]
    assert "recipe" in kinds and "region" in kinds
    heads = [c["headroom_seconds"] for c in p["candidates"]]
    assert heads == sorted(heads, reverse=True)  # one ranking by headroom, recipes and regions together
    for c in p["candidates"]:
        assert c["headroom_seconds"] <= c["seconds"] + 1e-12
        select_region(snap, c["node_ids"], "my.kernel@1", 0, (), c["output_shape_input"])  # raises if invalid
        assert c["command"].startswith("mcore ")


def test_encoder_profile_and_diff(mcore, tmp_path, bundles):
    _, enc = bundles
    _, a = _profile(mcore, tmp_path, enc.bundle_path, "--prompt", "a short sentence")
    assert a["role"] == "encoder" and a["context"] is None
    assert any(c["kind"] == "recipe" for c in a["candidates"])
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(a))
    r = mcore("profile", "diff", fa, fb)
    assert r.code == 0 and "(+0.000 ms, x1.000)" in r.out and r.out.startswith("engine torch, role encoder\n")


def test_bad_profile_inputs(mcore, tmp_path, bundles):
    qwen, enc = bundles
    for argv, fragment in [
        ((qwen.bundle_path, "--context", "999"), "--context 999 must lie in 1..255"),
        ((qwen.bundle_path, "--context", "-1"), "--context -1 must lie in 1..255"),
        ((qwen.bundle_path, "--steps", "0"), "--steps 0 must lie in 1..1000"),
        ((qwen.bundle_path, "--steps", "1001"), "--steps 1001 must lie in 1..1000"),
        ((qwen.bundle_path, "--role", "encoder"), "role 'encoder' is not in this bundle; use one of prefill, decode"),
        ((enc.bundle_path, "--role", "decode"), "role 'decode' is not in this bundle; use one of encoder"),
    ]:
        r = mcore("profile", *argv)
        assert_user_error(r, fragment)
        assert "capturing" not in r.err, "checked from the bundle's manifest before any graph is captured"
    # each kind reads one of --context and --prompt: the other would change nothing, and is said so
    r = mcore("profile", enc.bundle_path, "--context", "999999", "--steps", "1", "--top", "1")
    assert_user_error(r, "--context 999999 sizes a decoder's cache; an encoder's profile runs --prompt's tokens")
    r = mcore("profile", qwen.bundle_path, "--prompt", "hello", "--steps", "1")
    assert_user_error(r, "--prompt is an encoder's text; a decoder's profile times random tokens at --context N")
    assert "capturing" not in r.err
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"kind": "other"}))
    assert_user_error(mcore("profile", "diff", bad, bad), "not an mcore profile")
    assert_user_error(mcore("profile", qwen.bundle_path, "--engine", "tensorrt"), "--engine 'tensorrt'")
    assert_user_error(mcore("profile", "diff", bad), "two profile files")


def test_bound_slot_is_attributed_by_binding_id(mcore, tmp_path):
    from mcore.bundle.build import build_bundle
    from mcore.kernels.shipped import build_kernel
    from mcore.model.buildargs import BuildArgs

    rid = "qwen.decode_logits_copy@1"
    res = build_bundle(
        BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=128),
        tmp_path / "s.bundle",
        recipe=(rid, "decoder.logits_zero_bias"),
    )
    build_kernel("identity-copy", tmp_path / "kernel.so", cuda="off")
    (tmp_path / "b.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [
                    {"id": rid, "abi_sha256": res.receipt.abi_sha256, "library": "./kernel.so", "function": "run"}
                ],
            }
        )
    )
    r, p = _profile(mcore, tmp_path, res.bundle_path, "--kernel-bindings", tmp_path / "b.json", "--context", "10")
    assert [(s["binding_id"], s["calls"]) for s in p["slots"]] == [(rid, 1)]
    assert p["slots"][0]["seconds"] > 0 and f"slot {rid}:" in r.out
    # the slot's time is its region's (tests/test_profile_compiled.py: the same on the compiled engine)
    (inst,) = [r for r in p["recipes"] if r["instance"] == "decoder.logits_zero_bias"]
    assert inst["seconds"] == pytest.approx(p["slots"][0]["seconds"])
    assert {n["binding_id"] for n in p["nodes"] if n["id"] in inst["node_ids"]} == {rid}


def test_profiler_ranges_attribute_the_same_nodes(bundles):
    """The kernel-time path's bookkeeping (a profiler range per node, summed by name), run on the
    CPU: every node of the wall-clock profile is attributed, and the costly ops stay costly."""
    from mcore.profile.profiler import profile_pipeline
    from mcore.runtime.pipeline import DecoderPipeline

    qwen, _ = bundles
    pipe = DecoderPipeline(qwen.bundle_path, device="cpu", engine="torch")
    wall = profile_pipeline(pipe, "decode", 50, 2, timing="wall")
    prof = profile_pipeline(pipe, "decode", 50, 2, timing="profiler-cpu")
    assert prof.timing.startswith("CPU time inside") and wall.timing.startswith("wall clock")
    assert {n.name for n in prof.nodes} == {n.name for n in wall.nodes}
    assert sum(n.rates.seconds for n in prof.nodes) == pytest.approx(prof.attributed_seconds)
    # (the totals differ: on the CPU each range also carries the profiler's own bookkeeping)
    # the matrix products cost more than the views around them in both
    for p in (wall, prof):
        by_op = {}
        for n in p.nodes:
            by_op[n.op] = by_op.get(n.op, 0.0) + n.rates.seconds
        assert by_op["aten.linear.default"] > by_op.get("aten.view.default", 0.0)
    with pytest.raises(Exception, match="kernel timing needs a CUDA device"):
        profile_pipeline(pipe, "decode", 50, 1, timing="kernel")


def test_no_profiler_activity_falls_back_to_the_wall_clock(bundles, monkeypatch):
    """A profiler that sees nothing (no CUPTI on the machine) must not give an empty profile: that step
    and every later one are timed by the wall clock, and the report says so."""
    import mcore.profile.profiler as profile_mod
    from mcore.runtime.pipeline import DecoderPipeline

    calls = []
    monkeypatch.setattr(profile_mod, "profiled_seconds", lambda *a, **k: calls.append(1) or {})
    qwen, _ = bundles
    pipe = DecoderPipeline(qwen.bundle_path, device="cpu", engine="torch")
    prof = profile_mod.profile_pipeline(pipe, "decode", 50, 3, timing="profiler-cpu")
    assert calls == [1]  # asked once; the later steps go straight to the wall clock
    assert prof.timing.startswith("wall clock") and prof.nodes
    assert all(n.rates.seconds >= 0 for n in prof.nodes) and prof.attributed_seconds > 0


@pytest.mark.timing
@pytest.mark.gpu
def test_gpu_profile_charges_kernel_time_not_launch_latency(bundles):
    """On CUDA the default timing is the kernels' device time: the attributed total is below the
    op-by-op step's wall time (which adds Python dispatch and launches) and every node is charged."""
    import torch

    from mcore.profile.profiler import profile_pipeline
    from mcore.runtime.pipeline import DecoderPipeline

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    qwen, _ = bundles
    pipe = DecoderPipeline(qwen.bundle_path, device="cuda", engine="torch")
    p = profile_pipeline(pipe, "decode", 100, 3, engine="torch")
    assert p.timing.startswith("device time"), p.timing
    assert 0 < p.attributed_seconds < p.step_seconds
    att = [n for n in p.nodes if n.op == "mcore.decode_attention.default"]
    assert att and all(n.rates.seconds > 0 for n in att)


def test_partial_views_fill_in_step_by_step(bundles):
    """`on_partial` sees the attribution grow one step at a time; the last view is the report's."""
    from mcore import PartialProfile
    from mcore.profile.profiler import profile_pipeline
    from mcore.runtime.pipeline import DecoderPipeline

    qwen, _ = bundles
    pipe = DecoderPipeline(qwen.bundle_path, device="cpu", engine="torch")
    seen = []
    report = profile_pipeline(pipe, "decode", 30, 3, on_partial=seen.append)
    assert [(p.step, p.steps, p.to_dict()["partial"]) for p in seen] == [(1, 3, True), (2, 3, True), (3, 3, True)]
    assert all(
        isinstance(p, PartialProfile) and "candidates" not in p.to_dict() and p.modules and p.nodes for p in seen
    )
    last = seen[-1]
    assert {n.name: n.rates.seconds for n in last.nodes} == {n.name: n.rates.seconds for n in report.nodes}
    assert last.attributed_seconds == pytest.approx(report.attributed_seconds)


def test_fusion_report_names_the_kernels_a_slot_would_split(mcore, tmp_path, bundles):
    qwen, _ = bundles
    r, p = _profile(mcore, tmp_path, qwen.bundle_path, "--top", "20", "--fusion")
    kernels = p["fusion"]["kernels"]
    node_ids = {n["id"] for n in p["nodes"] if n["id"]}
    covered = [i for k in kernels for i in k["nodes"]]
    # every computing node of the graph lands in some kernel, each node's IDs are the graph's
    assert set(covered) <= node_ids and len(set(covered)) > len(node_ids) // 2
    assert any(len(k["nodes"]) > 1 for k in kernels)  # Inductor fused something on this CPU
    for c in p["candidates"]:  # against a brute-force check of each kernel against the region
        region = set(c["node_ids"])
        want = [
            (k["kernel"], len(set(k["nodes"]) & region), len(set(k["nodes"]) - region))
            for k in kernels
            if set(k["nodes"]) & region and set(k["nodes"]) - region
        ]
        assert [(s["kernel"], s["inside"], s["outside"]) for s in c["splits"]] == want
    assert "a slot here splits" in r.out and "fusion (compiled (Inductor)" in r.out


def test_the_limit_is_the_roofline_of_bytes_and_math():
    """A node's time at the limit is the longer of its bytes at the copy rate and its matrix-product
    FLOPs at the peak math rate; without a known peak only the bytes count."""
    from mcore.profile.attribution import rates as _rates

    bw, peak = 4e12, 1e15
    gemv = _rates(2e-3, 4e9, 4e9, 1.0, bw, peak)  # memory-bound
    assert gemv.limit_seconds == pytest.approx(1e-3) and gemv.headroom_seconds == pytest.approx(1e-3)
    gemm = _rates(2e-3, 4e6, 1e12, 1.0, bw, peak)  # math-bound
    assert gemm.limit_seconds == pytest.approx(1e-3) and gemm.ratio_to_limit == pytest.approx(0.5)
    assert gemm.flops_per_s == pytest.approx(5e14)
    unknown = _rates(2e-3, 4e6, 1e12, 1.0, bw, None)
    assert unknown.limit_seconds == pytest.approx(1e-6)
