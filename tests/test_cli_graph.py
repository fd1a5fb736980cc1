"""`mcore graph ...` end to end on the demo models, and every bad input: exit 2, one line, no output file."""

from __future__ import annotations

import json

import pytest

from tests.conftest import DISTIL_ARGS, QWEN_ARGS, assert_user_error


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    from mcore.cli.main import main

    d = tmp_path_factory.mktemp("snaps")
    assert (
        main(["graph", "inspect", "--engine-role", "decode", "--snapshot", str(d / "decode.graph.json"), *QWEN_ARGS])
        == 0
    )
    assert (
        main(
            ["graph", "inspect", "--engine-role", "encoder", "--snapshot", str(d / "encoder.graph.json"), *DISTIL_ARGS]
        )
        == 0
    )
    return d


def test_list_tail_and_match(mcore, snaps):
    r = mcore("graph", "list", snaps / "decode.graph.json")
    lines = r.out.splitlines()
    assert r.code == 0 and len(lines) == len(json.loads((snaps / "decode.graph.json").read_text())["nodes"])
    tail = lines[-4:]
    assert "LayerType.CONSTANT" in tail[0] and "LayerType.CAST" in tail[1]
    assert "ElementWiseOperation.SUM" in tail[2] and "(logits)" in tail[3]
    r = mcore("graph", "list", snaps / "decode.graph.json", "--match", "*add*")
    assert r.code == 0 and r.out and all("add" in l.lower() for l in r.out.splitlines())
    r = mcore("graph", "list", snaps / "encoder.graph.json", "--match", "*ElementWiseOperation.SUM*")
    assert r.code == 0 and any("attention_residual" in l for l in r.out.splitlines())
    # --match selects nothing: the snapshot is unchanged and no file appears
    before = sorted(p.name for p in snaps.iterdir())
    mcore("graph", "list", snaps / "decode.graph.json", "--match", "node:1*")
    assert sorted(p.name for p in snaps.iterdir()) == before


def test_a_match_of_nothing_says_so_on_stderr(mcore, snaps):
    # stdout stays the (empty) list, as pipes to tee expect; stderr says it matched nothing and, for a bare
    # word, how to match part of a field
    n = len(json.loads((snaps / "encoder.graph.json").read_text())["nodes"])
    r = mcore("graph", "list", snaps / "encoder.graph.json", "--match", "SUM")
    assert r.code == 0 and r.out == ""
    assert r.err == (
        f"note: no node of {n} matches 'SUM' (a glob matched whole against each node's ID, op, layer, name and "
        "module path; for a part of one, try '*SUM*')\n"
    )
    r = mcore("graph", "list", snaps / "encoder.graph.json", "--match", "*no-such-op*")
    assert r.code == 0 and r.out == "" and "matches '*no-such-op*'" in r.err and "try" not in r.err
    r = mcore("graph", "list", snaps / "encoder.graph.json", "--match", "*SUM*")
    assert r.out and r.err == ""


def test_tree_and_recipes(mcore, snaps):
    r = mcore("graph", "tree", snaps / "decode.graph.json")
    assert r.code == 0 and "decode (demo:qwen3-tiny)" in r.out and "[decoder.layers.0.self_attn]" in r.out
    r = mcore("graph", "recipes", snaps / "decode.graph.json")
    lines = r.out.splitlines()
    assert lines[0].split() == ["RECIPE", "INSTANCE", "NODES"]
    assert any(l.split()[:2] == ["qwen.decode_logits_copy@1", "decoder.logits_zero_bias"] for l in lines)


def test_manual_select_equals_recipe(mcore, snaps, tmp_path):
    snap = json.loads((snaps / "decode.graph.json").read_text())
    row = next(r for r in snap["recipes"] if r["id"] == "qwen.decode_logits_copy@1")
    r = mcore(
        "graph",
        "select",
        snaps / "decode.graph.json",
        "--nodes",
        *row["node_ids"],
        "--binding-id",
        "my.kernel@1",
        "--workspace-bytes",
        "0",
        "-o",
        tmp_path / "sel.json",
    )
    assert r.code == 0, r
    manual = json.loads((tmp_path / "sel.json").read_text())
    r = mcore(
        "graph",
        "select",
        snaps / "decode.graph.json",
        "--recipe",
        "qwen.decode_logits_copy@1",
        "decoder.logits_zero_bias",
        "-o",
        tmp_path / "rec.json",
    )
    assert r.code == 0, r
    recipe = json.loads((tmp_path / "rec.json").read_text())
    assert manual["abi_sha256"] == recipe["abi_sha256"]
    assert manual["node_ids"] == recipe["node_ids"] and manual["input_tensor_ids"] == recipe["input_tensor_ids"]
    assert recipe["recipe"] == {"id": "qwen.decode_logits_copy@1", "instance": "decoder.logits_zero_bias"}
    assert recipe["binding_id"] == "qwen.decode_logits_copy@1" and manual["recipe"] is None
    assert f"abi_sha256={manual['abi_sha256']}" in r.out


def test_attention_recipe_contract(mcore, snaps, tmp_path):
    attn = ("--recipe", "qwen.decode_attention_region@2", "decoder.layers.1.decode_attention")
    r = _select(mcore, snaps / "decode.graph.json", tmp_path / "attn.json", *attn)
    assert r.code == 0, r
    rec = json.loads((tmp_path / "attn.json").read_text())
    ins = [(e["dtype"], e["shape"]) for e in rec["abi"]["inputs"]]
    assert ins == [("FP32", [1, 4, -1, 16]), ("FP32", [1, 2, 256, 16]), ("FP32", [1, 2, 256, 16]), ("INT32", [1])]
    assert [(e["dtype"], e["shape"]) for e in rec["abi"]["outputs"]] == [("FP32", [1, 4, -1, 16])]
    assert rec["output_shape_input"] == 0
    assert rec["workspace_bytes"] == 0  # the recipe's own
    # --workspace-bytes replaces it for a kernel that needs scratch; the ABI hash covers it
    r = _select(mcore, snaps / "decode.graph.json", tmp_path / "attn-ws.json", *attn, "--workspace-bytes", "8192")
    assert r.code == 0, r
    ws = json.loads((tmp_path / "attn-ws.json").read_text())
    assert ws["workspace_bytes"] == 8192 and ws["abi_sha256"] != rec["abi_sha256"]
    assert ws["abi"]["inputs"] == rec["abi"]["inputs"] and ws["node_ids"] == rec["node_ids"]


def _select(mcore, snap, out, *extra):
    return mcore("graph", "select", snap, "-o", out, *extra)


def test_bad_inputs_exit_2_one_line_no_file(mcore, snaps, tmp_path):
    dec = snaps / "decode.graph.json"
    snap = json.loads(dec.read_text())
    logits_nodes = next(r for r in snap["recipes"] if r["id"] == "qwen.decode_logits_copy@1")["node_ids"]
    attn = next(r for r in snap["recipes"] if r["id"] == "qwen.decode_attention_region@2")["node_ids"]
    out = tmp_path / "sel.json"
    bad = tmp_path / "bad.json"
    cases = []
    cases.append((("graph", "list", tmp_path / "missing.json"), ["not found"]))
    bad.write_text("{not json")
    cases.append((("graph", "list", bad), ["malformed JSON"]))
    for mutate, frag in [
        (lambda s: s.pop("nodes"), "missing field(s) nodes"),
        (lambda s: s.__setitem__("extra_field", 1), "unknown field(s) extra_field"),
        (lambda s: s["nodes"][0].__setitem__("op", "aten.mul.Tensor"), "fingerprint does not match"),
    ]:
        s = json.loads(dec.read_text())
        mutate(s)
        p = tmp_path / f"m{len(cases)}.json"
        p.write_text(json.dumps(s))
        cases.append((("graph", "select", p, "--nodes", "node:1", "--binding-id", "k@1", "-o", out), [frag]))
    sel = lambda *a: ("graph", "select", dec, "-o", out, *a)
    cases += [
        (sel("--nodes", "node:99999", "--binding-id", "k@1"), ["node:99999 does not exist"]),
        (sel("--nodes", logits_nodes[0], logits_nodes[0], "--binding-id", "k@1"), ["selected twice"]),
        (sel("--nodes", *logits_nodes, "--binding-id", "bad id!"), ["binding ID"]),
        (sel("--nodes", *logits_nodes, "--binding-id", "k@1", "--workspace-bytes", "2147483648"), ["workspace"]),
        (sel("--nodes", *logits_nodes, "--binding-id", "k@1", "--workspace-bytes", "-1"), ["workspace"]),
        (
            sel("--nodes", *logits_nodes, "--binding-id", "k@1", "--extra-arg", '{"type":"float","value":Infinity}'),
            ["--extra-arg"],
        ),
        (
            sel("--nodes", *logits_nodes, "--binding-id", "k@1", "--extra-arg", '{"type":"float","value":1e999}'),
            ["finite"],
        ),
        (sel("--nodes", *attn, "--binding-id", "k@1"), ["dynamic shape", "--output-shape-like-input"]),
        (sel("--nodes", *attn, "--binding-id", "k@1", "--output-shape-like-input", "1"), ["does not match"]),
        (sel("--nodes", *attn, "--binding-id", "k@1", "--output-shape-like-input", "3"), ["does not match"]),
        (sel("--recipe", "qwen.nope@1", "x"), ["not published"]),
        (sel("--recipe", "qwen.decode_logits_copy@1", "decoder.nope"), ["no instance"]),
        (("graph", "inspect", "--engine-role", "encoder", "--snapshot", out, *QWEN_ARGS), ["engine role 'encoder'"]),
        (("graph", "inspect", "--engine-role", "decode", "--snapshot", out, "demo:nope"), ["demo"]),
        (
            ("graph", "inspect", "--engine-role", "decode", "--snapshot", out, *QWEN_ARGS[:1], "--precision", "fp8"),
            ["--precision"],
        ),
        (("graph", "inspect", "--engine-role", "decode", "--snapshot", out, str(tmp_path / "nofolder")), []),
        (
            ("graph", "select", dec, "--nodes", "node:1", "--binding-id", "k@1", "-o", tmp_path / "no" / "x.json"),
            ["does not exist"],
        ),
    ]
    for args, frags in cases:
        res = mcore(*args)
        assert_user_error(res, *frags)
        assert not out.exists(), args
        assert not list(tmp_path.glob(".*.tmp")), args
