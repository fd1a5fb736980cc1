"""`mcore kernel stub`: the generated CuTe DSL exporter (valid Python, strict contract check, export)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mcore.common.errors import UserError
from mcore.graph.snapshot import KIND, SCHEMA_VERSION, fingerprint
from mcore.kernels.stubgen import classify_region, generate_exporter, write_exporter
from mcore.selection.region import select_region

from .conftest import needs_cute, repo_env

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "kernels" / "export_cutedsl_residual_add.py"


# ---------------------------------------------------------------- a tiny snapshot builder


class Graph:
    """Builds a valid snapshot dict: nodes get IDs in creation (topological) order."""

    def __init__(self, role: str = "encoder", family: str = "test", model: str = "test"):
        self.role, self.family, self.model = role, family, model
        self.nodes: list[dict] = []
        self.tensors: list[dict] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []

    def _tensor(self, dtype: str, shape: Sequence[int], name: str, producer: str | None) -> str:
        tid = f"tensor:{len(self.tensors)}"
        self.tensors.append(
            {
                "id": tid,
                "name": name,
                "dtype": dtype,
                "shape": list(shape),
                "location": "device",
                "is_shape_tensor": False,
                "format": "linear",
                "producer": producer,
                "consumers": [],
            }
        )
        return tid

    def input(self, dtype: str, shape: Sequence[int], name: str = "x") -> str:
        tid = self._tensor(dtype, shape, name, None)
        self.inputs.append(tid)
        return tid

    def op(
        self,
        op: str,
        ins: Sequence[str],
        dtype: str,
        shape: Sequence[int],
        name: str | None = None,
        module_path: str = "layer",
    ) -> str:
        nid = f"node:{len(self.nodes)}"
        name = name or f"{op.split('.')[1]}_{len(self.nodes)}"
        out = self._tensor(dtype, shape, name, nid)
        for t in ins:
            self.tensors[int(t.split(":")[1])]["consumers"].append(nid)
        self.nodes.append(
            {
                "id": nid,
                "op": op,
                "category": "LayerType.OTHER",
                "name": name,
                "module_path": module_path,
                "inputs": list(ins),
                "outputs": [out],
            }
        )
        return out

    def output(self, tid: str) -> None:
        self.outputs.append(tid)
        self.tensors[int(tid.split(":")[1])]["is_network_output"] = True

    def snapshot(self) -> dict[str, Any]:
        snap = {
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            "metadata": {
                "family": self.family,
                "model": self.model,
                "revision": None,
                "engine_role": self.role,
                "build_args": {},
                "tool_versions": {},
            },
            "nodes": copy.deepcopy(self.nodes),
            "tensors": copy.deepcopy(self.tensors),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }
        snap["fingerprint"] = fingerprint(snap)
        return snap


def node_of(snap: dict, tid: str) -> str:
    return next(t["producer"] for t in snap["tensors"] if t["id"] == tid)


def binary_graph(
    op: str = "aten.add.Tensor",
    dtype: str = "FP16",
    shape=(256, 768),
    dtype_b: str | None = None,
    out_dtype: str | None = None,
    note: str = "",
) -> tuple[dict, str]:
    """x, y -> relu(x), relu(y) -> OP -> relu -> out; returns (snapshot, the OP node)."""
    g = Graph()
    x = g.input(dtype, shape, "x")
    y = g.input(dtype_b or dtype, shape, "y")
    a = g.op("aten.relu.default", [x], dtype, shape)
    b = g.op("aten.relu.default", [y], dtype_b or dtype, shape)
    s = g.op(op, [a, b], out_dtype or dtype, shape, name=f"sum{note}")
    g.output(g.op("aten.relu.default", [s], out_dtype or dtype, shape))
    snap = g.snapshot()
    return snap, node_of(snap, s)


def tutorial_snapshot() -> dict[str, Any]:
    """A stand-in for the tutorial's DistilBERT graph with its residual-add boundary:
    node:49 aten.add.Tensor  tensor:22 (hidden), tensor:50 (attention projection) -> tensor:51, FP16 [256, 768]."""
    g = Graph(role="encoder", family="distilbert", model="distilbert/distilbert-base-uncased")
    ids = g.input("INT32", [256], "input_ids")
    mask = g.input("INT32", [256], "attention_mask")
    h = g.op("aten.embedding.default", [ids], "FP16", [256, 768], name="embeddings", module_path="embeddings")
    for i in range(1, 20):
        h = g.op("aten.mul.Tensor", [h], "FP16", [256, 768], name=f"embeddings_{i}", module_path="embeddings")
    hidden = g.op(
        "aten.layer_norm.default", [h], "FP16", [256, 768], name="layer_norm", module_path="embeddings.LayerNorm"
    )
    assert hidden == "tensor:22"
    a = g.op(
        "aten.linear.default",
        [hidden, mask],
        "FP16",
        [256, 768],
        name="linear",
        module_path="transformer.layer.0.attention",
    )
    for i in range(22, 49):
        a = g.op(
            "aten.mul.Tensor", [a], "FP16", [256, 768], name=f"linear_{i}", module_path="transformer.layer.0.attention"
        )
    assert a == "tensor:50"
    res = g.op("aten.add.Tensor", [hidden, a], "FP16", [256, 768], name="add", module_path="transformer.layer.0")
    assert res == "tensor:51" and node_of(g.snapshot(), res) == "node:49"
    h = g.op(
        "aten.layer_norm.default",
        [res],
        "FP16",
        [256, 768],
        name="layer_norm_1",
        module_path="transformer.layer.0.sa_layer_norm",
    )
    f = g.op("aten.linear.default", [h], "FP16", [256, 768], name="linear_4", module_path="transformer.layer.0.ffn")
    res2 = g.op("aten.add.Tensor", [h, f], "FP16", [256, 768], name="add_1", module_path="transformer.layer.0")
    assert node_of(g.snapshot(), res2) == "node:52"  # the FFN residual add: the same ABI, another region
    g.output(
        g.op(
            "aten.layer_norm.default",
            [res2],
            "FP16",
            [256, 768],
            name="layer_norm_2",
            module_path="transformer.layer.0.output_layer_norm",
        )
    )
    return g.snapshot()


TUTORIAL_BINDING = "distilbert.layer0.attention_residual_add.cutedsl@1"
EXAMPLE_NAMES = dict(
    selection_name="work/residual-add.selection.json",
    snapshot_name="work/encoder.graph.json",
    exporter_name="kernels/export_cutedsl_residual_add.py",
    note="This is the committed tutorial example (step 7). It was generated from a stand-in snapshot that\n"
    "reproduces the tutorial's DistilBERT residual-add boundary (tests/test_stubgen.py: tutorial_snapshot),\n"
    "so GRAPH_FINGERPRINT is the stand-in's and the contract check refuses any real graph: for yours, run\n"
    "    mcore kernel stub work/residual-add.selection.json --snapshot work/encoder.graph.json -o my_add.py\n"
    "To refresh this file after a generator change: python -m tests.test_stubgen",
)


def write_example() -> None:
    """Regenerate kernels/export_cutedsl_residual_add.py (the golden test compares it with the generator)."""
    snap = tutorial_snapshot()
    receipt = select_region(snap, ["node:49"], TUTORIAL_BINDING)
    EXAMPLE.write_text(generate_exporter(receipt, snap, **EXAMPLE_NAMES), encoding="utf-8")
    os.chmod(EXAMPLE, 0o755)
    print(f"wrote {EXAMPLE}")


def write_pair(tmp: Path, snap: dict, receipt: Any, stem: str = "r") -> tuple[Path, Path]:
    sp, rp = tmp / f"{stem}.graph.json", tmp / f"{stem}.selection.json"
    sp.write_text(json.dumps(snap))
    rp.write_text(json.dumps(receipt if isinstance(receipt, dict) else receipt.to_dict()))
    return rp, sp


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- the receipts the tests use


def receipts() -> dict[str, tuple[dict, dict]]:
    out = {}
    snap, n = binary_graph()
    out["add"] = (snap, select_region(snap, [n], "t.add@1"))
    g = Graph()
    x = g.input("BF16", [4, 64], "x")
    y = g.input("BF16", [4, 64], "y")
    m = g.op("aten.mul.Tensor", [x, y], "BF16", [4, 64])
    s = g.op("aten.add.Tensor", [m, x], "BF16", [4, 64])
    g.output(g.op("aten.relu.default", [s], "BF16", [4, 64]))
    snap = g.snapshot()
    out["multi"] = (snap, select_region(snap, [node_of(snap, m), node_of(snap, s)], "t.multi@1"))
    g = Graph()
    x = g.input("FP16", [-1, 8, 64], "x")
    y = g.input("FP16", [-1, 8, 64], "y")
    s = g.op("aten.sub.Tensor", [x, y], "FP16", [-1, 8, 64])
    g.output(g.op("aten.relu.default", [s], "FP16", [-1, 8, 64]))
    snap = g.snapshot()
    out["dynamic_sub"] = (snap, select_region(snap, [node_of(snap, s)], "t.sub@1", output_shape_input=1))
    g = Graph()
    x = g.input("FP32", [3, 5, 7], "x")
    c = g.op("aten._to_copy.default", [x], "BF16", [3, 5, 7])
    g.output(g.op("aten.relu.default", [c], "BF16", [3, 5, 7]))
    snap = g.snapshot()
    out["cast"] = (snap, select_region(snap, [node_of(snap, c)], "t.cast@1"))
    g = Graph()
    q = g.input("BF16", [1, 32, -1, 128], "query")
    k = g.input("BF16", [1, 8, 4096, 128], "key_cache")
    n = g.input("INT32", [1], "lengths")
    a = g.op("mcore.decode_attention.default", [q, k, n], "BF16", [1, 32, -1, 128])
    g.output(g.op("aten.relu.default", [a], "BF16", [1, 32, -1, 128]))
    snap = g.snapshot()
    out["workspace_extras"] = (
        snap,
        select_region(
            snap,
            [node_of(snap, a)],
            "t.attn@2",
            workspace_bytes=1024,
            output_shape_input=0,
            extra_args=[
                {"type": "int", "value": 32},
                {"type": "float", "value": 0.5},
                {"type": "none"},
                {"type": "ptr", "value": None},
            ],
        ),
    )
    snap = tutorial_snapshot()
    out["tutorial"] = (snap, select_region(snap, ["node:49"], TUTORIAL_BINDING))
    return {k: (s, r.to_dict()) for k, (s, r) in out.items()}  # each receipt as its file holds it


@pytest.fixture(scope="module")
def cases():
    return receipts()


# ---------------------------------------------------------------- classification


def test_known_single_ops(cases):
    assert classify_region(cases["add"][1], cases["add"][0])[0].kind == "add"
    assert classify_region(cases["cast"][1], cases["cast"][0])[0].kind == "cast"
    assert classify_region(cases["dynamic_sub"][1], cases["dynamic_sub"][0])[0].kind == "sub"
    for op, kind in (("aten.sub.Tensor", "sub"), ("aten.mul.Tensor", "mul")):
        snap, n = binary_graph(op)
        assert classify_region(select_region(snap, [n], "b@1"), snap)[0].kind == kind
    g = Graph()
    x = g.input("FP16", [3, 5])
    c = g.op("aten.clone.default", [x], "FP16", [3, 5])
    g.output(g.op("aten.relu.default", [c], "FP16", [3, 5]))
    snap = g.snapshot()
    assert classify_region(select_region(snap, [node_of(snap, c)], "c@1"), snap)[0].kind == "copy"


def test_unknown_regions_get_a_reason(cases):
    known, why = classify_region(cases["multi"][1], cases["multi"][0])
    assert known is None and "2 nodes" in why
    known, why = classify_region(cases["workspace_extras"][1], cases["workspace_extras"][0])
    assert known is None and "mcore.decode_attention.default" in why
    # a cast to the same dtype is not treated as a copy
    g = Graph()
    x = g.input("FP16", [3, 5])
    c = g.op("aten._to_copy.default", [x], "FP16", [3, 5])
    g.output(g.op("aten.relu.default", [c], "FP16", [3, 5]))
    snap = g.snapshot()
    known, why = classify_region(select_region(snap, [node_of(snap, c)], "c@1"), snap)
    assert known is None and "same dtype" in why
    # constant + cast + add of a zero bias (the tutorial's logits region) is not a known op
    g = Graph()
    x = g.input("BF16", [1, 100])
    k = g.op("constant", [], "FP32", [100], name="lm_head.bias")
    c = g.op("aten._to_copy.default", [k], "BF16", [100])
    s = g.op("aten.add.Tensor", [x, c], "BF16", [1, 100])
    g.output(g.op("aten._to_copy.default", [s], "FP32", [1, 100]))
    snap = g.snapshot()
    r = select_region(snap, [node_of(snap, k), node_of(snap, c), node_of(snap, s)], "z@1")
    assert classify_region(r, snap)[0] is None
    # broadcasting add and x + x are not generated either
    g = Graph()
    x = g.input("FP16", [4, 8])
    b = g.input("FP16", [8])
    s = g.op("aten.add.Tensor", [x, b], "FP16", [4, 8])
    d = g.op("aten.add.Tensor", [s], "FP16", [4, 8])  # s + s: one tensor input
    g.output(g.op("aten.relu.default", [d], "FP16", [4, 8]))
    snap = g.snapshot()
    assert "broadcasting" in classify_region(select_region(snap, [node_of(snap, s)], "b@1"), snap)[1]
    assert "tensor inputs" in classify_region(select_region(snap, [node_of(snap, d)], "d@1"), snap)[1]


# ---------------------------------------------------------------- generated code


@pytest.mark.parametrize("case", ["add", "multi", "dynamic_sub", "cast", "workspace_extras", "tutorial"])
def test_generated_exporter_is_valid_python(cases, case):
    snap, receipt = cases[case]
    text = generate_exporter(receipt, snap)
    compile(text, f"{case}.py", "exec")
    assert f'BINDING_ID = "{receipt["binding_id"]}"' in text
    assert f'ABI_SHA256 = "{receipt["abi_sha256"]}"' in text
    assert f'GRAPH_FINGERPRINT = "{snap["fingerprint"]}"' in text
    # check, ABI order, compile (--enable-tvm-ffi, env stream), export and link: the kit's (test_exporter_kit.py)
    assert "from mcore import exporter_kit as kit" in text and "return kit.main(exporter, argv)" in text
    assert "make_fake_stream" not in text.split('"""', 2)[2]  # the kit adds the stream, not the stub
    assert f"run({', '.join(receipt['abi']['call'][4:-1].split(', '))})" in text  # the ABI call, in order
    known = classify_region(receipt, snap)[0]
    assert (f"KERNEL_IMPLEMENTED = {known is not None}") in text


def test_generated_body_text(cases):
    text = generate_exporter(*reversed(cases["add"]))
    assert "output0[index] = (a + b).to(cutlass.Float16)" in text
    text = generate_exporter(*reversed(cases["cast"]))
    assert "output0[index] = input0[index].to(cutlass.BFloat16)" in text
    text = generate_exporter(*reversed(cases["dynamic_sub"]))
    assert "output0[index] = (a - b).to(cutlass.Float16)" in text
    assert "dim0 = cute.sym_int()  # dynamic: input0[0], input1[0], output0[0]" in text
    assert "if count > 0:" in text
    text = generate_exporter(*reversed(cases["workspace_extras"]))
    for needle in (
        "def run(input0: cute.Tensor, input1: cute.Tensor, input2: cute.Tensor, workspace: cute.Tensor, "
        "output0: cute.Tensor, extra0: cutlass.Int32, extra1: cutlass.Float32, extra2, extra3, "
        "stream: cuda.CUstream)",
        "tensor(cutlass.Uint8, (1024,)),",
        "cutlass.Int32(32),",
        "cutlass.Float32(0.5),",
        "dim0 = cute.sym_int()  # dynamic: input0[2], output0[2]",
    ):
        assert needle in text, needle
    # mixed dtypes follow PyTorch's promotion: convert to the output dtype first, then math in FP32
    snap, n = binary_graph(dtype="FP16", dtype_b="FP32", out_dtype="FP32")
    text = generate_exporter(select_region(snap, [n], "m@1"), snap)
    assert "a = input0[index].to(cutlass.Float32)" in text and "b = input1[index]\n" in text


def test_generator_refuses_a_snapshot_of_another_graph(cases, tmp_path):
    snap, receipt = cases["add"]
    other, _ = cases["multi"]
    with pytest.raises(UserError, match="another graph"):
        generate_exporter(receipt, other)
    bad = copy.deepcopy(receipt)
    bad["abi"]["inputs"][0]["shape"] = [1, 2]
    with pytest.raises(UserError, match="abi_sha256"):
        generate_exporter(bad, snap)


def test_committed_example_is_what_the_generator_writes(cases):
    snap, receipt = cases["tutorial"]
    assert receipt["input_tensor_ids"] == ["tensor:22", "tensor:50"] and receipt["output_tensor_ids"] == ["tensor:51"]
    text = generate_exporter(receipt, snap, **EXAMPLE_NAMES)
    assert EXAMPLE.read_text(encoding="utf-8") == text, (
        "kernels/export_cutedsl_residual_add.py is stale; regenerate it (see its header)"
    )


# ---------------------------------------------------------------- the contract check of the generated script


@pytest.fixture(scope="module")
def add_stub(cases, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stub")
    snap, receipt = cases["tutorial"]
    rp, sp = write_pair(tmp, snap, receipt)
    res = write_exporter(rp, sp, tmp / "export_residual_add.py")
    mod = load_module(res.path, "generated_residual_add_exporter")
    return tmp, res.path, rp, sp, mod


def run_main(mod, capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = mod.main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_check_only_accepts_the_matching_pair(add_stub):
    """Run from the user's folder, as a plain script: it needs only mcore installed (the kit), no CuTe DSL."""
    tmp, script, rp, sp, mod = add_stub
    r = subprocess.run(
        [sys.executable, str(script), "--snapshot", str(sp), "--selection", str(rp), "--check-only"],
        capture_output=True,
        text=True,
        env=repo_env(),
        cwd=tmp,
    )
    assert r.returncode == 0, r.stderr
    assert f"binding_id={TUTORIAL_BINDING}" in r.stdout
    receipt = json.loads(rp.read_text())
    assert f"abi_sha256={receipt['abi_sha256']}" in r.stdout
    assert mod.check_contract(rp, sp).binding_id == TUTORIAL_BINDING


def _variant_pairs(tmp: Path) -> dict[str, tuple[Path, Path, str]]:
    """Each kind of mismatch -> (selection, snapshot, expected words in the one-line message)."""
    base_snap, base = receipts()["tutorial"]
    out: dict[str, tuple[Path, Path, str]] = {}

    def add(kind: str, snap: dict, receipt: dict, words: str) -> None:
        rp, sp = write_pair(tmp, snap, receipt, stem=kind)
        out[kind] = (rp, sp, words)

    # a graph that differs only outside the region: same ABI, other fingerprint
    other = copy.deepcopy(base_snap)
    other["nodes"][-1]["name"] = "renamed"
    other["fingerprint"] = fingerprint(other)
    add(
        "fingerprint", other, select_region(other, ["node:49"], TUTORIAL_BINDING), "selection was made on another graph"
    )
    add("binding", base_snap, select_region(base_snap, ["node:49"], "other.binding@1"), "binding ID")
    # same graph and ABI, another region with the same contract
    add("region", base_snap, select_region(base_snap, ["node:52"], TUTORIAL_BINDING), "selected region")
    edited = copy.deepcopy(base)
    edited["abi"]["inputs"][0]["shape"] = [128, 768]
    add("edited", base_snap, edited, "was edited")
    snap, n = binary_graph(dtype="BF16")
    add("dtype", snap, select_region(snap, [n], TUTORIAL_BINDING), "input 0 is BF16 but this exporter takes FP16")
    snap, n = binary_graph(shape=(128, 768))
    add("shape", snap, select_region(snap, [n], TUTORIAL_BINDING), "input 0 has shape [128, 768]")
    g = Graph()
    x = g.input("FP16", [256, 768])
    c = g.op("aten.relu.default", [x], "FP16", [256, 768])
    g.output(g.op("aten.relu.default", [c], "FP16", [256, 768]))
    snap = g.snapshot()
    add("input_count", snap, select_region(snap, [node_of(snap, c)], TUTORIAL_BINDING), "selection has 1 inputs")
    snap, n = binary_graph(out_dtype="FP32")
    add("output_dtype", snap, select_region(snap, [n], TUTORIAL_BINDING), "output 0 is FP32")
    add(
        "workspace",
        base_snap,
        select_region(base_snap, ["node:49"], TUTORIAL_BINDING, workspace_bytes=64),
        "workspace is 64 bytes",
    )
    add(
        "extra_args",
        base_snap,
        select_region(base_snap, ["node:49"], TUTORIAL_BINDING, extra_args=[{"type": "int", "value": 1}]),
        "extra args",
    )
    add(
        "output_rule",
        base_snap,
        select_region(base_snap, ["node:49"], TUTORIAL_BINDING, output_shape_input=0),
        "output shape rule",
    )
    # snapshots: the right selection with the wrong graph, or a damaged one
    rp = tmp / "tutorial.selection.json"
    rp.write_text(json.dumps(base))
    osp = tmp / "other.graph.json"
    osp.write_text(json.dumps(other))
    out["snapshot_other"] = (rp, osp, "this is another graph")
    damaged = copy.deepcopy(base_snap)
    damaged["nodes"][0]["name"] = "edited"
    dsp = tmp / "damaged.graph.json"
    dsp.write_text(json.dumps(damaged))
    out["snapshot_damaged"] = (rp, dsp, "fingerprint does not match the content")
    bad = tmp / "bad.json"
    bad.write_text("{not json")
    out["not_json"] = (bad, dsp, "cannot read the selection receipt as JSON")
    out["missing"] = (tmp / "absent.json", dsp, "selection receipt not found")
    out["not_receipt"] = (dsp, dsp, "not a selection receipt")
    return out


def test_each_mismatch_is_refused_with_its_own_message(add_stub, capsys):
    tmp, script, rp, sp, mod = add_stub
    vdir = tmp / "variants"
    vdir.mkdir()
    variants = _variant_pairs(vdir)
    seen = set()
    for kind, (sel, snap, words) in variants.items():
        code, out, err = run_main(mod, capsys, "--snapshot", snap, "--selection", sel, "--check-only")
        assert code == 2, (kind, out, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and words in lines[0], (kind, err)
        assert "Traceback" not in err
        seen.add(lines[0].split(": error: ", 1)[1].split(";")[0].replace(str(vdir), ""))
    assert len(seen) == len(variants)  # one message per kind of mismatch


def test_mismatch_exit_code_from_the_command_line(add_stub):
    tmp, script, rp, sp, mod = add_stub
    other = receipts()["add"][1]
    orp = tmp / "add.selection.json"
    orp.write_text(json.dumps(other))
    r = subprocess.run(
        [sys.executable, str(script), "--snapshot", str(sp), "--selection", str(orp), "--check-only"],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=repo_env(),
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "regenerate" in r.stderr, r.stderr


def test_export_refuses_existing_output_and_missing_body(add_stub, cases, tmp_path, capsys):
    tmp, script, rp, sp, mod = add_stub
    existing = tmp_path / "k.so"
    existing.write_bytes(b"old")
    code, _, err = run_main(mod, capsys, "--snapshot", sp, "--selection", rp, "--output", existing)
    assert code == 2 and "never overwrites" in err and existing.read_bytes() == b"old"
    code, _, err = run_main(mod, capsys, "--snapshot", sp, "--selection", rp, "--output", tmp_path / "no" / "k.so")
    assert code == 2 and "does not exist" in err
    # an unknown region: export stops and says what to implement
    snap, receipt = cases["workspace_extras"]
    mrp, msp = write_pair(tmp_path, snap, receipt)
    res = write_exporter(mrp, msp, tmp_path / "attn.py")
    assert res.known is None
    m = load_module(res.path, "generated_attn_exporter")
    code, _, err = run_main(m, capsys, "--snapshot", msp, "--selection", mrp, "--output", tmp_path / "a.so")
    assert code == 2 and not (tmp_path / "a.so").exists()
    for words in (
        "write the body of region_kernel",
        "output0 (BF16 [1, 32, -1, 128])",
        "input0 (BF16 [1, 32, -1, 128])",
        "input1 (BF16 [1, 8, 4096, 128])",
        "input2 (INT32 [1])",
        "workspace: 1024 bytes",
        "extra0  int32 32",
        "KERNEL_IMPLEMENTED = True",
    ):
        assert words in err, words


def test_write_exporter_refuses_to_overwrite(cases, tmp_path):
    snap, receipt = cases["add"]
    rp, sp = write_pair(tmp_path, snap, receipt)
    out = tmp_path / "x.py"
    out.write_text("keep")
    with pytest.raises(UserError, match="already exists"):
        write_exporter(rp, sp, out)
    assert out.read_text() == "keep"
    write_exporter(rp, sp, out, overwrite=True)
    assert "BINDING_ID" in out.read_text() and os.access(out, os.X_OK)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_stub(cases, tmp_path, mcore):
    snap, receipt = cases["tutorial"]
    rp, sp = write_pair(tmp_path, snap, receipt)
    r = mcore("kernel", "stub", rp, "--snapshot", sp, "-o", tmp_path / "my_residual_add.py")
    assert r.code == 0, r
    assert f"binding_id={TUTORIAL_BINDING}" in r.out and "kernel body: generated" in r.out
    r = mcore("kernel", "stub", rp, "--snapshot", sp, "-o", tmp_path / "my_residual_add.py")
    assert r.code == 2 and "already exists" in r.err and r.err.count("\n") == 1
    assert mcore("kernel", "stub", rp, "--snapshot", sp, "-o", tmp_path / "my_residual_add.py", "--force").code == 0
    r = mcore("kernel", "stub", rp, "--snapshot", sp, "-o", tmp_path / "missing" / "x.py")
    assert r.code == 2 and "does not exist" in r.err
    other_snap, _ = cases["multi"]
    osp = tmp_path / "other.graph.json"
    osp.write_text(json.dumps(other_snap))
    r = mcore("kernel", "stub", rp, "--snapshot", osp, "-o", tmp_path / "y.py")
    assert r.code == 2 and "another graph" in r.err and not (tmp_path / "y.py").exists()


# ---------------------------------------------------------------- CuTe DSL compile + export + link (no GPU needed)


def _export(script: Path, rp: Path, sp: Path, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in repo_env().items() if k != "CUTE_DSL_ARCH"}
    return subprocess.run(
        [sys.executable, str(script), "--snapshot", str(sp), "--selection", str(rp), "--output", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@needs_cute
def test_cutedsl_export_of_the_residual_add(add_stub, tmp_path):
    tmp, script, rp, sp, mod = add_stub
    out = tmp_path / "residual-add-cutedsl.so"
    r = _export(script, rp, sp, out)
    assert r.returncode == 0, r.stderr[-3000:]
    receipt = json.loads(rp.read_text())
    assert f"binding_id={TUTORIAL_BINDING}" in r.stdout and f"abi_sha256={receipt['abi_sha256']}" in r.stdout
    assert f"dso={out.resolve()}" in r.stdout and out.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # nothing half-written beside it
    if shutil.which("readelf"):  # self-contained: at run time only libcudart and libtvm_ffi
        dyn = subprocess.run(["readelf", "-d", str(out)], capture_output=True, text=True).stdout
        needed = sorted(ln.split("[")[1].rstrip("]") for ln in dyn.splitlines() if "(NEEDED)" in ln)
        assert [n for n in needed if not n.startswith(("libc.", "libm.", "libdl.", "libpthread.", "librt."))] == [
            "libcudart.so.13",
            "libtvm_ffi.so",
        ] or "libcudart.so.12" in needed, needed
    import torch
    import tvm_ffi

    fn = tvm_ffi.load_module(str(out))["run"]
    a = torch.zeros(256, 768, dtype=torch.float16)
    with pytest.raises(ValueError, match="cuda"):  # the wrapper checks every argument before any launch
        fn(a, a.clone(), a.clone())
    with pytest.raises(TypeError, match="Expects 3 parameters"):
        fn(a, a)
    # never overwritten
    r = _export(script, rp, sp, out)
    assert r.returncode == 2 and "never overwrites" in r.stderr


@needs_cute
def test_cutedsl_export_dynamic_sub_cast_and_filled_scaffold(cases, tmp_path):
    import tvm_ffi

    snap, receipt = cases["cast"]
    rp, sp = write_pair(tmp_path, snap, receipt, "cast1")
    res = write_exporter(rp, sp, tmp_path / "cast1.py")
    r = _export(res.path, rp, sp, tmp_path / "cast1.so")
    assert r.returncode == 0, r.stderr[-3000:]
    snap, receipt = cases["dynamic_sub"]
    rp, sp = write_pair(tmp_path, snap, receipt, "cast")
    res = write_exporter(rp, sp, tmp_path / "cast.py")
    r = _export(res.path, rp, sp, tmp_path / "cast.so")
    assert r.returncode == 0, r.stderr[-3000:]
    assert tvm_ffi.load_module(str(tmp_path / "cast.so"))["run"] is not None
    # the scaffold of an unknown region compiles once its author marks it implemented
    snap, receipt = cases["workspace_extras"]
    rp, sp = write_pair(tmp_path, snap, receipt, "attn")
    res = write_exporter(rp, sp, tmp_path / "attn.py")
    res.path.write_text(res.path.read_text().replace("KERNEL_IMPLEMENTED = False", "KERNEL_IMPLEMENTED = True"))
    r = _export(res.path, rp, sp, tmp_path / "attn.so")
    assert r.returncode == 0, r.stderr[-3000:]
    import torch

    fn = tvm_ffi.load_module(str(tmp_path / "attn.so"))["run"]
    q = torch.zeros(1, 32, 5, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cuda"):
        fn(
            q,
            torch.zeros(1, 8, 4096, 128, dtype=torch.bfloat16),
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(1024, dtype=torch.uint8),
            q.clone(),
            32,
            0.5,
            None,
            None,
        )


if __name__ == "__main__":
    write_example()
