"""Tutorial step 5 on CPU: one decode-attention slot per layer, or all of them (issue 13).

`mcore build --recipe qwen.decode_attention_region@2 INSTANCE [INSTANCE ...]` (or the literal
`all-instances`) makes one slot per instance, all of one binding (same ID and ABI hash); one
bindings-manifest entry binds them all. The attention kernel here is a Python stand-in bound in
place of a DSO's function (no CPU attention DSO exists), so the test checks the plumbing: every
slot is called, every step, with the cache and length it should see, and the output matches the
native pipeline token for token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import QWEN_ARGS, assert_user_error

RECIPE = "qwen.decode_attention_region@2"
LAYERS = ["decoder.layers.0.decode_attention", "decoder.layers.1.decode_attention"]
PROMPT = "Explain grouped-query attention, KV caching, and decode latency."


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from mcore.cli.main import main

    work = tmp_path_factory.mktemp("attention-slots")
    assert main(["build", *QWEN_ARGS, "--recipe", RECIPE, *LAYERS, "-o", str(work / "both.bundle")]) == 0
    assert main(["build", *QWEN_ARGS, "--recipe", RECIPE, "all-instances", "-o", str(work / "all.bundle")]) == 0
    assert main(["build", *QWEN_ARGS, "--recipe", RECIPE, LAYERS[0], "-o", str(work / "one.bundle")]) == 0
    assert main(["build", *QWEN_ARGS, "-o", str(work / "native.bundle")]) == 0
    return work


def manifest_of(work: Path, name: str) -> dict:
    from mcore.bundle.container import open_bundle

    return open_bundle(work / name).manifest


def test_each_instance_is_its_own_slot_of_one_binding(built):
    slots = manifest_of(built, "both.bundle")["kernel_slots"]
    assert [s["recipe"]["instance"] for s in slots] == LAYERS
    assert {s["binding_id"] for s in slots} == {RECIPE}
    assert len({s["abi_sha256"] for s in slots}) == 1
    assert slots[0]["node_ids"] != slots[1]["node_ids"]
    # all-instances names exactly the same slots, in graph order
    assert manifest_of(built, "all.bundle")["kernel_slots"] == slots


def test_one_receipt_per_slot_and_the_single_instance_file_unchanged(built):
    assert not (built / "both.selection.json").exists()
    receipts = [json.loads((built / f"both.selection.{inst}.json").read_text()) for inst in LAYERS]
    assert [r["recipe"] for r in receipts] == [{"id": RECIPE, "instance": i} for i in LAYERS]
    assert receipts[0]["abi_sha256"] == receipts[1]["abi_sha256"]
    # the tutorial's one-instance build still writes exactly X.selection.json, and the same receipt
    one = json.loads((built / "one.selection.json").read_text())
    assert one == receipts[0]
    assert sorted(p.name for p in built.glob("one.*")) == ["one.bundle", "one.selection.json"]
    abi = one["abi"]
    assert [t["dtype"] for t in abi["inputs"]] == ["FP32", "FP32", "FP32", "INT32"]
    assert one["output_shape_input"] == 0 and one["workspace_bytes"] == 0


def test_inspect_shows_how_many_slots_the_binding_serves(built, mcore):
    r = mcore("inspect", str(built / "both.bundle"))
    assert r.code == 0, r
    abi = manifest_of(built, "both.bundle")["kernel_slots"][0]["abi_sha256"]
    assert f"kernel_binding {RECIPE} abi_sha256={abi} serves 2 slot(s)" in r.out
    for inst in LAYERS:
        assert f"recipe={RECIPE}:{inst}" in r.out
    r1 = mcore("inspect", str(built / "one.bundle"))
    assert "serves 1 slot(s)" in r1.out


@pytest.mark.parametrize(
    "instances, fragments",
    [
        (["all-instances", LAYERS[0]], ["all-instances already names every instance; give it alone"]),
        ([LAYERS[0], LAYERS[0]], [f"instance {LAYERS[0]} is named twice"]),
        (["decoder.layers.7.decode_attention"], ["has no instance 'decoder.layers.7.decode_attention'"]),
        ([], ["--recipe needs RECIPE_ID and at least one INSTANCE"]),
    ],
)
def test_bad_instances_are_one_line_errors(built, mcore, instances, fragments):
    out = built / "bad.bundle"
    r = mcore("build", *QWEN_ARGS, "--recipe", RECIPE, *instances, "-o", str(out))
    assert_user_error(r, *fragments)
    assert not out.exists()


class AttentionStandIn:
    """The attention ABI in Python: run(q, k_cache, v_cache, kv_lengths, out), recording every call."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []  # (cache data_ptr, kv_len) per call

    def __call__(self, q, k_cache, v_cache, kv_lengths, out):
        from mcore.ops.attention import decode_attention_reference

        assert q.shape[:2] == out.shape[:2] and out.shape == q.shape and kv_lengths.dtype == torch.int32
        self.calls.append((k_cache.data_ptr(), int(kv_lengths[0])))
        out.copy_(decode_attention_reference(q, k_cache, v_cache, kv_lengths).to(out.dtype))


def bind_manifest(work: Path, abi: str) -> Path:
    (work / "attention.so").write_bytes(b"stand-in: the test replaces the DSO's function")
    p = work / "attention-bindings.json"
    p.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": RECIPE, "abi_sha256": abi, "library": "./attention.so", "function": "run"}],
            }
        )
    )
    return p


def test_one_entry_binds_both_layers_and_every_slot_runs(built, monkeypatch):
    from mcore.runtime import bindings
    from mcore.runtime.pipeline import DecoderPipeline

    kernel = AttentionStandIn()
    monkeypatch.setattr(bindings, "_load_function", lambda library, function, bid: (None, kernel))
    abi = manifest_of(built, "both.bundle")["kernel_slots"][0]["abi_sha256"]
    m = bind_manifest(built, abi)
    native = DecoderPipeline(str(built / "native.bundle"), device="cpu", engine="torch").generate(
        PROMPT, 6, stop_at_eos=False
    )
    pipe = DecoderPipeline(
        str(built / "both.bundle"), kernel_bindings=str(m), device="cpu", engine="torch", announce=lambda line: None
    )
    got = pipe.generate(PROMPT, 6, stop_at_eos=False)
    assert got.tokens == native.tokens
    # 5 decode steps (the first token comes from prefill), two layers each, two distinct caches
    assert len(kernel.calls) == 5 * 2
    assert len({ptr for ptr, _ in kernel.calls}) == 2
    lengths = [n for _, n in kernel.calls]
    assert lengths[0::2] == lengths[1::2]  # both layers see the same active length each step
    assert lengths[0::2] == list(range(lengths[0], lengths[0] + 5))


def test_a_recipe_build_declares_a_workspace_and_each_slot_gets_its_own(built, mcore, monkeypatch):
    """`--workspace-bytes N` replaces the recipe's workspace (none): the receipt declares it, the ABI
    hash covers it (so a kernel exported for the plain receipt cannot bind), and every slot's kernel
    gets its own N-byte uint8 workspace between the inputs and the output."""
    from mcore.runtime import bindings
    from mcore.runtime.pipeline import DecoderPipeline

    out = built / "ws.bundle"
    r = mcore("build", *QWEN_ARGS, "--recipe", RECIPE, *LAYERS, "--workspace-bytes", "4096", "-o", str(out))
    assert r.code == 0, r
    receipt = json.loads((built / f"ws.selection.{LAYERS[0]}.json").read_text())
    assert receipt["workspace_bytes"] == 4096
    plain = manifest_of(built, "both.bundle")["kernel_slots"][0]["abi_sha256"]
    abi = manifest_of(built, "ws.bundle")["kernel_slots"][0]["abi_sha256"]
    assert receipt["abi_sha256"] == abi != plain

    seen: list[tuple[int, int]] = []  # (workspace data_ptr, bytes) per call

    def kernel(q, k_cache, v_cache, kv_lengths, workspace, out):
        assert workspace.dtype == torch.uint8 and workspace.dim() == 1
        seen.append((workspace.data_ptr(), workspace.numel()))
        AttentionStandIn()(q, k_cache, v_cache, kv_lengths, out)

    monkeypatch.setattr(bindings, "_load_function", lambda library, function, bid: (None, kernel))
    native = DecoderPipeline(str(built / "native.bundle"), device="cpu", engine="torch").generate(
        PROMPT, 4, stop_at_eos=False
    )
    pipe = DecoderPipeline(
        str(out),
        kernel_bindings=str(bind_manifest(built, abi)),
        device="cpu",
        engine="torch",
        announce=lambda line: None,
    )
    assert pipe.generate(PROMPT, 4, stop_at_eos=False).tokens == native.tokens
    assert len(seen) == 3 * 2 and {n for _, n in seen} == {4096}
    assert len({ptr for ptr, _ in seen}) == 2  # one workspace a slot, kept across steps


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--recipe", RECIPE, LAYERS[0], "--workspace-bytes", "-1"], "workspace bytes -1 is out of range"),
        (["--workspace-bytes", "64"], "--workspace-bytes applies to --recipe builds"),
    ],
    ids=["negative", "without-recipe"],
)
def test_bad_workspace_is_a_one_line_error(built, mcore, extra, fragment):
    out = built / "bad-ws.bundle"
    assert_user_error(mcore("build", *QWEN_ARGS, *extra, "-o", str(out)), fragment)
    assert not out.exists()


def test_unbound_and_mismatched_attention_slots_fail_closed_naming_them(built, mcore):
    r = mcore("run", str(built / "both.bundle"), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu")
    assert_user_error(r, f"slot {RECIPE} (2 slots: {RECIPE} [{LAYERS[0]}], {RECIPE} [{LAYERS[1]}])", "is not bound")
    m = bind_manifest(built, "0" * 64)
    r = mcore(
        "run",
        str(built / "both.bundle"),
        "--kernel-bindings",
        str(m),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
        "--device",
        "cpu",
    )
    assert_user_error(r, "ABI hash mismatch", LAYERS[0], LAYERS[1])


def test_workbench_builds_every_instance_and_shows_the_slot_count(tmp_path):
    from workbench.actions import ActionContext, build_bundle
    from workbench.screens.build import slot_lines

    args = {"model": QWEN_ARGS[0], "precision": "fp32", "max_cache_length": 256, "decoder_engine_layout": "split"}
    res = build_bundle(ActionContext(tmp_path), args, "all.bundle", recipe=[RECIPE, "all-instances"])
    slots = res.kernel_slots
    assert len(slots) == 2 and res.receipt == f"all.selection.{LAYERS[0]}.json"
    assert slot_lines(slots) == [f"slot {RECIPE} abi {slots[0].abi_sha256[:16]}… ×2 slots, one binding"]
    assert slot_lines(slots[:1]) == [f"slot {RECIPE} abi {slots[0].abi_sha256[:16]}…"]
    # a workspace declared through the workbench's action, as `mcore build ... --workspace-bytes N`
    ws = build_bundle(
        ActionContext(tmp_path), args, "ws.bundle", recipe=[RECIPE, "all-instances"], workspace_bytes=4096
    )
    assert len(ws.kernel_slots) == 2 and ws.kernel_slots[0].abi_sha256 != slots[0].abi_sha256
    assert ws.receipt is not None
    assert json.loads((tmp_path / ws.receipt).read_text())["workspace_bytes"] == 4096


def test_compiled_engine_keeps_both_slots_opaque_and_calls_them(built, monkeypatch):
    from mcore.runtime import bindings
    from mcore.runtime.pipeline import DecoderPipeline

    kernel = AttentionStandIn()
    monkeypatch.setattr(bindings, "_load_function", lambda library, function, bid: (None, kernel))
    abi = manifest_of(built, "both.bundle")["kernel_slots"][0]["abi_sha256"]
    pipe = DecoderPipeline(
        str(built / "both.bundle"),
        kernel_bindings=str(bind_manifest(built, abi)),
        device="cpu",
        engine="compiled",
        announce=lambda line: None,
    )
    native = DecoderPipeline(str(built / "native.bundle"), device="cpu", engine="torch").generate(
        PROMPT, 4, stop_at_eos=False
    )
    assert pipe.generate(PROMPT, 4, stop_at_eos=False).tokens == native.tokens
    assert len({ptr for ptr, _ in kernel.calls}) == 2 and len(kernel.calls) >= 3 * 2
    assert any("2 opaque slot(s)" in line for line in pipe.engine_lines())


def two_instance_snapshot(shape_b=(4, 8)) -> dict:
    """A graph with two relu regions published as instances a and b of recipe t.r@1."""
    from mcore.graph.snapshot import fingerprint
    from tests.test_stubgen import Graph, node_of

    g = Graph(role="decode")
    x = g.input("FP32", [4, 8], "x")
    y = g.input("FP32", list(shape_b), "y")
    a = g.op("aten.relu.default", [x], "FP32", [4, 8], module_path="a")
    b = g.op("aten.relu.default", [y], "FP32", list(shape_b), module_path="b")
    g.output(g.op("aten.relu.default", [a], "FP32", [4, 8]))
    g.output(g.op("aten.relu.default", [b], "FP32", list(shape_b)))
    snap = g.snapshot()
    snap["recipes"] = [
        {
            "id": "t.r@1",
            "instance": inst,
            "engine_role": "decode",
            "description": "",
            "module_path": inst,
            "node_ids": [node_of(snap, t)],
            "workspace_bytes": 0,
            "extra_args": [],
            "output_shape_input": None,
        }
        for inst, t in (("a", a), ("b", b))
    ]
    snap["fingerprint"] = fingerprint(snap)
    return snap


def test_instances_select_through_select_region_and_must_share_one_abi():
    from mcore.common.errors import UserError
    from mcore.selection.recipes import select_recipe_instances

    snap = two_instance_snapshot()
    receipts = select_recipe_instances(snap, "t.r@1", ["all-instances"])
    assert [r.recipe.instance for r in receipts if r.recipe] == ["a", "b"]
    assert [r.node_ids for r in select_recipe_instances(snap, "t.r@1", ["b", "a"])] == [
        receipts[1].node_ids,
        receipts[0].node_ids,
    ]  # the order given
    with pytest.raises(UserError, match=r"instance b has ABI .* but a has .*; one binding serves slots of one ABI"):
        select_recipe_instances(two_instance_snapshot((2, 8)), "t.r@1", ["all-instances"])
    with pytest.raises(UserError, match=r"recipe 'u@1' is not published"):
        select_recipe_instances(snap, "u@1", ["all-instances"])
