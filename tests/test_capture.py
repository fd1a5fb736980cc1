"""Capture: snapshot contract, determinism, fingerprints, module paths, mutation versions."""

from __future__ import annotations

import json

import pytest

from mcore.graph.capture import capture
from mcore.graph.snapshot import fingerprint
from mcore.model.buildargs import BuildArgs
from tests.conftest import QWEN_ARGS, run_cli

QWEN = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=256, decoder_engine_layout="split")


@pytest.fixture(scope="module")
def decode():
    return capture(QWEN, "decode").snapshot


def test_snapshot_contract_fields(decode):
    decode_file = decode.to_dict()  # the file form
    assert decode_file["schema_version"] == 1 and decode_file["kind"] == "mcore.graph_snapshot"
    meta = decode_file["metadata"]
    assert meta["family"] == "qwen3" and meta["model"] == "demo:qwen3-tiny" and meta["engine_role"] == "decode"
    assert meta["build_args"] == {"precision": "fp32", "max_cache_length": 256, "decoder_engine_layout": "split"}
    assert set(meta["tool_versions"]) == {"mcore", "torch"}
    assert decode_file["fingerprint"] == fingerprint(decode_file)
    for i, n in enumerate(decode_file["nodes"]):
        assert n["id"] == f"node:{i}"
        assert {"id", "op", "name", "module_path", "inputs", "outputs"} <= n.keys()
        assert n["module_path"], n  # every node has a module path
    for i, t in enumerate(decode_file["tensors"]):
        assert t["id"] == f"tensor:{i}"
        assert t["dtype"] in {"FP32", "INT32", "INT64", "BF16", "FP16", "BOOL"}
        assert all(isinstance(d, int) and (d > 0 or d == -1 or d == 0) for d in t["shape"])
        assert t["location"] in ("device", "host")


def test_ids_are_topological(decode):
    decode_file = decode.to_dict()  # the file form
    ix = decode  # a Snapshot: its own index
    for n in decode_file["nodes"]:
        for p in ix.predecessors(n["id"]):
            assert ix.order[p] < ix.order[n["id"]]


def test_inputs_outputs_and_cache_versions(decode):
    decode_file = decode.to_dict()  # the file form
    ix = decode
    names = [ix.tensor(t).name for t in decode_file["inputs"]]
    assert names[:2] == ["input_ids", "cache_length"]
    assert names[2:6] == ["key_cache.0", "value_cache.0", "key_cache.1", "value_cache.1"]
    ids = ix.tensor(decode_file["inputs"][0]).to_dict()
    assert ids["dtype"] == "INT32" and ids["shape"] == [1, -1]
    assert ix.tensor(decode_file["inputs"][1]).to_dict()["shape"] == [1]
    assert ix.tensor(decode_file["inputs"][2]).to_dict()["shape"] == [1, 2, 256, 16]
    logits = ix.tensor(decode_file["outputs"][0]).to_dict()
    assert logits["output_name"] == "logits" and logits["dtype"] == "FP32" and logits["shape"][0] == 1
    # the in-place cache write is a new tensor version; the attention reads that version
    writes = [n for n in decode_file["nodes"] if n["op"].startswith("aten.index_copy_")]
    assert len(writes) == 4
    for w in writes:
        new = w["outputs"][0]
        assert new in decode_file["outputs"]  # final cache versions are state the graph writes
        assert any(ix.node(c).op == "mcore.decode_attention.default" for c in ix.tensor(new).consumers)
        assert w["inputs"][0] in decode_file["inputs"]


def test_logits_tail_matches_tutorial_shape(decode):
    decode_file = decode.to_dict()  # the file form
    tail = decode_file["nodes"][-4:]
    assert [n["op"] for n in tail] == ["constant", "aten._to_copy.default", "aten.add.Tensor", "aten._to_copy.default"]
    assert [n["module_path"] for n in tail[:3]] == ["decoder.logits_zero_bias"] * 3
    assert tail[3]["module_path"] == "decoder"


def test_recipes_recorded(decode):
    decode_file = decode.to_dict()  # the file form
    rows = decode_file["recipes"]
    assert [r["instance"] for r in rows if r["id"] == "qwen.decode_attention_region@2"] == [
        "decoder.layers.0.decode_attention",
        "decoder.layers.1.decode_attention",
    ]
    logits = [r for r in rows if r["id"] == "qwen.decode_logits_copy@1"]
    assert len(logits) == 1 and logits[0]["node_ids"] == [n["id"] for n in decode_file["nodes"][-4:-1]]


def test_deterministic_and_sensitive_to_args(decode):
    decode_file = decode.to_dict()  # the file form
    again = capture(QWEN, "decode").snapshot
    assert again == decode
    others = [QWEN.with_(precision="bf16"), QWEN.with_(max_cache_length=128), QWEN.with_(model_revision="abc")]
    fps = {capture(a, "decode").snapshot.fingerprint for a in others}
    assert decode_file["fingerprint"] not in fps and len(fps) == 3
    assert capture(QWEN, "prefill").snapshot.fingerprint != decode_file["fingerprint"]


def test_same_fingerprint_in_a_fresh_process(decode, tmp_path):
    decode_file = decode.to_dict()  # the file form
    out = tmp_path / "d.json"
    r = run_cli("graph", "inspect", "--engine-role", "decode", "--snapshot", out, *QWEN_ARGS)
    assert r.code == 0, r
    assert json.loads(out.read_text())["fingerprint"] == decode_file["fingerprint"]
    assert decode_file["fingerprint"] in r.out


def test_encoder_capture():
    for model in ("demo:distilbert-tiny", "demo:bert-tiny"):
        snap = capture(BuildArgs(model=model, precision="fp16"), "encoder").snapshot
        snap_file = snap.to_dict()  # the file form
        ix = snap
        assert [ix.tensor(t).name for t in snap_file["inputs"]] == ["input_ids", "attention_mask"]
        out = ix.tensor(snap_file["outputs"][0]).to_dict()
        assert out["dtype"] == "FP16" and out["shape"] == [256, 64]
        adds = [r for r in snap_file["recipes"]]
        assert [r["instance"] for r in adds] == [
            "encoder.layers.0.attention_residual",
            "encoder.layers.1.attention_residual",
        ]
        node = ix.node(adds[0]["node_ids"][0]).to_dict()
        assert node["category"] == "LayerType.ELEMENTWISE/ElementWiseOperation.SUM" and len(adds[0]["node_ids"]) == 1
