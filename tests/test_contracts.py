"""The typed contracts (Snapshot, Receipt, SlotRecord, BundleManifest, BindingsManifest, Session):
each parsed and checked once, written by one to_dict that gives back the file byte for byte (so
fingerprints and ABI hashes stay what they were), and each bad field refused in one line naming
the file and the field."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from mcore import (
    BindingsManifest,
    BundleManifest,
    Receipt,
    SlotRecord,
    Snapshot,
    UserError,
    load_receipt,
    load_snapshot,
    select_region,
)
from mcore.common.fileio import canonical_json
from mcore.graph.snapshot import fingerprint

from .conftest import DISTIL_ARGS, assert_user_error
from .graphs import dag_snapshot

# Values the code before the typed contracts wrote for the same graph and selection: the JSON
# formats, the fingerprint and the ABI hash must not move.
DAG_FINGERPRINT = "8cae5b4bdd47d39ead48ce72847d5596e05f164c798b4e90cf67436bf35a2a80"
DAG_ABI = "8d692c3b28c4fd7ff81592b4dc20123ce2e3613737cd98e170a4abd3e88e8b78"
DAG_RECEIPT_FILE_SHA = "b1d38e098ce5416b96b8f1c766d77978ad6c0ce6c4aebfdd482eea0c1e948ee0"
RESIDUAL_ADD_ABI = "2d6277acb97b0bcdadfb08a6da2563a33036d048f44a188156588b2c3d952c89"
EXTRAS = [{"type": "int", "value": 3}, {"type": "float", "value": 1}]


def _dag() -> dict:
    return dag_snapshot(4, [(0, 1), (1, 2), (2, 3)])


def _file(data: dict) -> str:
    """How mcore writes a contract (fileio.write_json)."""
    return json.dumps(data, indent=2) + "\n"


def _one_line(e: pytest.ExceptionInfo, *fragments: str) -> None:
    text = str(e.value)
    assert "\n" not in text, text
    for f in fragments:
        assert f in text, text


def _refingerprinted(d: dict) -> dict:
    d["fingerprint"] = fingerprint(d)
    return d


# ---------------------------------------------------------------- round trips and hashes


def test_snapshot_round_trip_keeps_the_fingerprint():
    d = _dag()
    snap = Snapshot.from_dict(d, "dag")
    # same keys and values (key order is capture's, checked byte for byte on a captured graph below)
    assert snap.to_dict() == d
    assert snap.fingerprint == fingerprint(snap.to_dict()) == DAG_FINGERPRINT
    assert snap.node("node:1").outputs == ("tensor:2",) and snap.tensor("tensor:2").producer == "node:1"
    assert snap.successors("node:1") == {"node:2"} and snap.predecessors("node:1") == {"node:0"}
    assert snap.order["node:3"] == 3 and snap.is_output("tensor:4") and snap.engine_role == "decode"


def test_captured_snapshot_round_trip(tmp_path, mcore):
    out = tmp_path / "e.graph.json"
    assert mcore("graph", "inspect", "--engine-role", "encoder", "--snapshot", out, *DISTIL_ARGS).code == 0
    text = out.read_text()
    snap = load_snapshot(out)
    assert _file(snap.to_dict()) == text  # the file back byte for byte
    assert Snapshot.from_dict(snap.to_dict(), "again") == snap
    assert snap.recipe_rows and all(snap.node_by_id.keys() >= set(r.node_ids) for r in snap.recipe_rows)


def test_receipt_round_trip_keeps_the_abi_hash(tmp_path):
    r = select_region(_dag(), ["node:1", "node:2"], "k@1", 16, EXTRAS, None)
    d = r.to_dict()
    assert Receipt.from_dict(d, "r.json") == r and Receipt.from_dict(d, "r.json").to_dict() == d
    assert r.abi_sha256 == DAG_ABI
    assert hashlib.sha256(_file(d).encode()).hexdigest() == DAG_RECEIPT_FILE_SHA
    # the hash covers exactly the call contract, as DESIGN.md §2 says
    contract = {
        "format": "mcore.tvm_ffi.abi/1",
        "inputs": [{"dtype": e["dtype"], "shape": e["shape"]} for e in d["abi"]["inputs"]],
        "outputs": [{"dtype": e["dtype"], "shape": e["shape"]} for e in d["abi"]["outputs"]],
        "workspace_bytes": 16,
        "extra_args": [{"type": "int", "value": 3}, {"type": "float", "value": 1.0}],
        "output_shape_input": None,
    }
    assert hashlib.sha256(canonical_json(contract).encode()).hexdigest() == r.abi_sha256
    p = tmp_path / "r.json"
    p.write_text(_file(d))
    assert load_receipt(p) == r


def test_call_params_is_the_abi_order():
    r = select_region(_dag(), ["node:1", "node:2"], "k@1", 16, EXTRAS, None)
    assert r.call_params() == ["input0", "workspace", "output0", "extra0", "extra1"]
    assert r.to_dict()["abi"]["call"] == "run(input0, workspace, output0, extra0, extra1)"
    assert r.call_args(["x"], "ws", ["y"], [3, 1.0]) == ["x", "ws", "y", 3, 1.0]
    plain = select_region(_dag(), ["node:1"], "k@1")
    assert plain.call_args(["x"], "ws", ["y"], []) == ["x", "y"]  # no workspace: none passed
    with pytest.raises(ValueError):
        plain.call_args(["x", "x2"], None, ["y"], [])


def test_bundle_manifest_and_slot_records_round_trip(tmp_path, mcore):
    from mcore import open_bundle

    out = tmp_path / "s.bundle"
    r = mcore("build", *DISTIL_ARGS, "--recipe", "distilbert.attention_residual_add@1", "all-instances", "-o", out)
    assert r.code == 0, r
    b = open_bundle(out)
    raw = b.read("manifest.json").decode()
    m = b.runnable()
    assert (json.dumps(m.to_dict(), indent=2, ensure_ascii=False) + "\n") == raw  # the member byte for byte
    assert BundleManifest.from_dict(m.to_dict(), "again") == m
    assert len(m.kernel_slots) == 2 and {s.abi_sha256 for s in m.kernel_slots} == {RESIDUAL_ADD_ABI}
    for slot, receipt_file in zip(m.kernel_slots, sorted(tmp_path.glob("s.selection.*.json")), strict=True):
        assert SlotRecord.from_dict(slot.to_dict(), "slot").to_dict() == slot.to_dict()
        receipt = load_receipt(receipt_file)
        assert receipt.slot() == slot and receipt.label == slot.label  # the bundle records the receipt's contract
        assert _file(receipt.to_dict()) == receipt_file.read_text()
    assert m.roles["encoder"].fingerprint == m.kernel_slots[0].graph_fingerprint


def test_bindings_manifest_round_trip(tmp_path):
    d = {
        "schema_version": 1,
        "bindings": [{"id": "k@1", "abi_sha256": "ab" * 32, "library": "./k.so", "function": "run"}],
    }
    p = tmp_path / "kb.json"
    p.write_text(_file(d))
    m = BindingsManifest.load(p)
    assert m.to_dict() == d and [b.id for b in m] == ["k@1"] and len(m) == 1
    assert m.get("k@1").library_path == (tmp_path / "k.so").resolve() and m.get("nope") is None


def test_shipped_sessions_round_trip():
    from workbench.session import Session, list_tutorials

    for _, _, path in list_tutorials():
        s = Session.load(path)
        assert s.to_dict() == json.loads(path.read_text()), path


# ---------------------------------------------------------------- snapshot checks


def _snapshot_error(edit) -> pytest.ExceptionInfo:
    d = _dag()
    edit(d)
    with pytest.raises(UserError) as e:
        Snapshot.from_dict(_refingerprinted(d), "g.json")  # the fingerprint made to match: only the check speaks
    return e


@pytest.mark.parametrize(
    "edit,fragments",
    [
        # references between IDs
        (lambda d: d["nodes"][1]["inputs"].append("tensor:99"), ["g.json", "nodes[1].inputs", "tensor:99"]),
        (lambda d: d["tensors"][0].update(producer="node:9"), ["g.json", "tensors[0].producer", "node:9"]),
        (lambda d: d["tensors"][2].update(producer="node:3"), ["nodes[1].outputs", "another producer"]),
        (lambda d: d["tensors"][1]["consumers"].append("node:3"), ["tensors[1].consumers", "node:3"]),
        (lambda d: d["nodes"][2]["inputs"].remove("tensor:2"), ["tensors[2].consumers", "node:2"]),
        (lambda d: d["outputs"].append("tensor:77"), ["field outputs", "tensor:77"]),
        (lambda d: d["inputs"].append("tensor:78"), ["field inputs", "tensor:78"]),
        (lambda d: d["nodes"][3].update(id="node:2"), ["nodes[3].id", "used twice"]),
        # wrong types
        (lambda d: d["tensors"][0].update(shape="4x8"), ["tensors[0].shape", "integers"]),
        (lambda d: d["nodes"][0].update(op=7), ["nodes[0].op", "must be a string"]),
        (lambda d: d["tensors"][0].update(is_shape_tensor="no"), ["tensors[0].is_shape_tensor", "true or false"]),
        (lambda d: d["nodes"][0].update(category=None), ["nodes[0].category", "must be a string"]),
        (lambda d: d.update(metadata={"family": "x"}), ["metadata.engine_role"]),
        # wrong ranges
        (lambda d: d["tensors"][0].update(shape=[4, -2]), ["tensors[0].shape", ">= -1"]),
        (lambda d: d["tensors"][0].update(location="gpu"), ["tensors[0].location", "device or host"]),
        (lambda d: d["tensors"][0].update(format="tiled"), ["tensors[0].format", "linear or strided"]),
        (lambda d: d["nodes"][0].update(id="n0"), ["nodes[0].id", "node:N"]),
        # unknown and missing fields
        (lambda d: d["nodes"][0].update(colour="red"), ["nodes[0]", "unknown field(s) colour"]),
        (lambda d: d["tensors"][0].pop("dtype"), ["tensors[0]", "missing field(s) dtype"]),
    ],
)
def test_snapshot_checks(edit, fragments):
    _one_line(_snapshot_error(edit), *fragments)


def test_snapshot_recipe_rows_are_checked():
    def add(rows):
        return lambda d: d.update(recipes=rows)

    row = {
        "id": "r@1",
        "instance": "m.block1",
        "engine_role": "decode",
        "description": "",
        "module_path": "m.block1",
        "node_ids": ["node:1"],
        "workspace_bytes": 0,
        "extra_args": [],
        "output_shape_input": None,
    }
    d = _refingerprinted({**_dag(), "recipes": [row]})
    assert Snapshot.from_dict(d, "g.json").to_dict() == d
    _one_line(_snapshot_error(add([{**row, "node_ids": ["node:42"]}])), "recipes[0].node_ids", "node:42")
    _one_line(_snapshot_error(add([{**row, "workspace_bytes": -1}])), "recipes[0].workspace_bytes", "out of range")
    _one_line(_snapshot_error(add([{**row, "node_ids": "node:1"}])), "recipes[0].node_ids", "list of strings")


def test_snapshot_fingerprint_still_guards_the_content():
    d = _dag()
    d["nodes"][0]["op"] = "aten.mul.Tensor"
    with pytest.raises(UserError) as e:
        Snapshot.from_dict(d, "g.json")
    _one_line(e, "g.json", "fingerprint does not match")


# ---------------------------------------------------------------- receipt and slot checks


def _receipt_error(edit, cls=Receipt) -> pytest.ExceptionInfo:
    r = select_region(_dag(), ["node:1", "node:2"], "k@1", 16, EXTRAS, None)
    d = r.to_dict() if cls is Receipt else r.slot().to_dict()
    edit(d)
    with pytest.raises(UserError) as e:
        cls.from_dict(d, "r.json")
    return e


@pytest.mark.parametrize(
    "edit,fragments",
    [
        (lambda d: d.update(workspace_bytes="16"), ["r.json", "field workspace_bytes"]),
        (lambda d: d.update(workspace_bytes=-1), ["field workspace_bytes", "out of range"]),
        (lambda d: d.update(binding_id="bad id!"), ["field binding_id", "letters, digits"]),
        (lambda d: d.update(node_ids="node:1"), ["field node_ids", "list of strings"]),
        (lambda d: d.update(output_shape_input=True), ["field output_shape_input"]),
        (lambda d: d.update(output_shape_input=5), ["field output_shape_input", "not an input index"]),
        (lambda d: d.update(extra_args=[{"type": "float", "value": 1e999}]), ["field extra_args", "finite"]),
        (lambda d: d.update(recipe={"id": "x"}), ["field recipe", "{id, instance}"]),
        (lambda d: d["abi"].update(call="run(input0)"), ["field abi.call"]),
        (lambda d: d["abi"].update(workspace_bytes=0), ["field abi.workspace_bytes", "disagrees"]),
        (lambda d: d["abi"].update(format="other/1"), ["field abi.format"]),
        (lambda d: d["abi"]["inputs"][0].update(index=3), ["field abi.inputs[0].index"]),
        (lambda d: d["abi"]["inputs"][0].update(shape=[4, "8"]), ["field abi.inputs[0].shape"]),
        (lambda d: d["abi"]["outputs"][0].pop("producer_op"), ["abi.outputs[0]", "missing field(s) producer_op"]),
        (lambda d: d["abi"]["inputs"][0].update(dtype="FP16"), ["abi_sha256 does not match"]),
        (lambda d: d.update(input_tensor_ids=["tensor:0"]), ["tensor IDs disagree with the abi section"]),
    ],
)
def test_receipt_and_slot_checks(edit, fragments):
    _one_line(_receipt_error(edit), *fragments)
    _one_line(_receipt_error(edit, SlotRecord), *fragments)  # a bundle's slot record: the same contract


def test_receipt_only_fields():
    _one_line(_receipt_error(lambda d: d.update(kind="other")), "r.json", "not a selection receipt")
    _one_line(_receipt_error(lambda d: d.update(graph=[])), "field graph", "must be an object")
    _one_line(_receipt_error(lambda d: d.update(graph={}), SlotRecord), "unknown field(s) graph")


# ---------------------------------------------------------------- bundle manifest checks


def _manifest() -> dict:
    r = select_region(_dag(), ["node:1"], "k@1")
    return {
        "schema_version": 1,
        "kind": "mcore.bundle",
        "engine": "torch",
        "family": "qwen3",
        "family_kind": "decoder",
        "model": {"spec": "demo:qwen3-tiny", "revision": None},
        "build_args": {"model": "demo:qwen3-tiny"},
        "graph_args": {},
        "device": None,
        "roles": {"decode": {"fingerprint": r.graph_fingerprint, "inputs": ["x"], "outputs": ["out"]}},
        "kernel_slots": [r.slot().to_dict()],
        "weights": {"kind": "random", "seed": 0},
    }


def test_bundle_manifest_round_trip_keeps_absent_optional_fields():
    d = _manifest()
    m = BundleManifest.from_dict(copy.deepcopy(d), "b.bundle")
    assert m.to_dict() == d and list(m.to_dict()) == list(d)  # no key added, none reordered
    assert m.slots_of("decode") == list(m.kernel_slots) and m.slots_of("prefill") == []


@pytest.mark.parametrize(
    "edit,fragments",
    [
        (lambda d: d["kernel_slots"][0].update(workspace_bytes=-5), ["kernel_slots[0]", "field workspace_bytes"]),
        (lambda d: d["kernel_slots"][0].update(engine_role="prefill"), ["kernel_slots[0]", "engine role 'prefill'"]),
        (lambda d: d["roles"]["decode"].update(outputs=[1]), ["roles.decode needs fingerprint"]),
        (lambda d: d.update(device=3), ["field device", "must be a string"]),
        (lambda d: d.update(special_tokens=[]), ["field special_tokens", "must be an object"]),
        (lambda d: d.update(weights={"kind": "checkpoint"}), ["field weights.kind"]),
        (lambda d: d.update(family_kind="vision"), ["field family_kind", "decoder or encoder"]),
        (lambda d: d.update(extra=1), ["unknown field(s) extra"]),
        (lambda d: d.pop("roles"), ["lacks field roles"]),
    ],
)
def test_bundle_manifest_checks(edit, fragments):
    d = _manifest()
    edit(d)
    with pytest.raises(UserError) as e:
        BundleManifest.from_dict(d, "b.bundle")
    _one_line(e, "b.bundle", *fragments)


# ---------------------------------------------------------------- the CLI: exit 2, one line


def test_cli_refuses_a_snapshot_with_a_dangling_reference(tmp_path, mcore):
    d = _dag()
    d["nodes"][2]["inputs"] = ["tensor:42"]
    p = tmp_path / "g.json"
    p.write_text(json.dumps(_refingerprinted(d)))
    out = tmp_path / "r.json"
    for args in (("graph", "list", p), ("graph", "select", p, "--nodes", "node:1", "--binding-id", "k@1", "-o", out)):
        assert_user_error(mcore(*args), str(p), "nodes[2].inputs", "tensor:42")
    assert not out.exists()


def test_cli_refuses_a_receipt_with_a_bad_field(tmp_path, mcore):
    snap = tmp_path / "g.json"
    snap.write_text(json.dumps(_dag()))
    d = select_region(_dag(), ["node:1"], "k@1").to_dict()
    d["abi"]["output_shape_input"] = 0
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(d))
    res = mcore("kernel", "stub", rec, "--snapshot", snap, "-o", tmp_path / "k.py")
    assert_user_error(res, str(rec), "field abi.output_shape_input")
    assert not (tmp_path / "k.py").exists()
