"""Fingerprints are content-addressed: another torch or mcore version with the same graph gives the
same fingerprint (so receipts, bundles and sessions travel between machines), while a graph or
model that really differs does not; replay explains a real difference between torch versions.

The GPU box runs torch 2.11; CI runs 2.13. Here the recorded versions are simulated."""

from __future__ import annotations

import json

import pytest

import mcore.bundle.build as mcore_build
import mcore.graph.capture as capture_mod
from mcore.graph.capture import capture
from mcore.graph.snapshot import fingerprint
from mcore.model.buildargs import BuildArgs

from .conftest import REPO, assert_user_error
from .test_replay import diff_rows, slice_session, step_index, table_rows

OTHER = {"mcore": "0.0.9", "torch": "2.11.0"}


@pytest.fixture
def other_torch(monkeypatch):
    """Every place that records tool versions reports another torch and mcore."""
    monkeypatch.setattr(capture_mod, "tool_versions", lambda: dict(OTHER))
    monkeypatch.setattr(mcore_build, "tool_versions", lambda: dict(OTHER))


def test_same_graph_other_versions_same_fingerprint(monkeypatch):
    here = capture(BuildArgs("demo:qwen3-tiny", max_cache_length=256), "decode").snapshot.to_dict()
    monkeypatch.setattr(capture_mod, "tool_versions", lambda: dict(OTHER))
    there = capture(BuildArgs("demo:qwen3-tiny", max_cache_length=256), "decode").snapshot.to_dict()
    assert there["metadata"]["tool_versions"] == OTHER != here["metadata"]["tool_versions"]
    assert there["fingerprint"] == here["fingerprint"] == fingerprint(there)


def test_what_the_fingerprint_covers():
    snap = capture(BuildArgs("demo:distilbert-tiny"), "encoder").snapshot.to_dict()
    base = fingerprint(snap)

    def changed(edit) -> str:
        s = json.loads(json.dumps(snap))
        edit(s)
        return fingerprint(s)

    assert changed(lambda s: s["metadata"]["tool_versions"].update(torch="9.9")) == base
    assert changed(lambda s: s["metadata"].update(config_sha256="0" * 64)) != base  # another config
    assert changed(lambda s: s["metadata"].update(revision="abc")) != base
    assert changed(lambda s: s["metadata"]["build_args"].update(max_seq_length=8)) != base
    assert changed(lambda s: s["nodes"][3].update(op="aten.sub.Tensor")) != base
    assert changed(lambda s: s["tensors"][0].update(shape=[7])) != base
    assert changed(lambda s: s["outputs"].append("tensor:0")) != base


def test_other_config_changes_the_fingerprint(tmp_path):
    """Same spec and the same nodes, another config value (an epsilon is not a graph node): the
    config hash in the model identity changes the fingerprint."""
    from .checkpoints import make_bert_checkpoint

    folder = make_bert_checkpoint(tmp_path / "a", layer_norm_eps=1e-12)
    before = capture(BuildArgs(str(folder)), "encoder").snapshot.to_dict()
    cfg = json.loads((folder / "config.json").read_text())
    cfg["layer_norm_eps"] = 1e-5
    (folder / "config.json").write_text(json.dumps(cfg))
    after = capture(BuildArgs(str(folder)), "encoder").snapshot.to_dict()
    assert before["nodes"] == after["nodes"] and before["fingerprint"] != after["fingerprint"]


def test_receipt_from_another_torch_still_applies(other_torch, tmp_path, mcore, monkeypatch):
    """A receipt made on the other box builds here: the same graph, the same fingerprint."""
    snap = tmp_path / "decode.graph.json"
    args = ["demo:qwen3-tiny", "--max-cache-length", "256"]
    assert mcore("graph", "inspect", *args, "--engine-role", "decode", "--snapshot", snap).code == 0
    data = json.loads(snap.read_text())
    assert data["metadata"]["tool_versions"] == OTHER
    sel = tmp_path / "sel.json"
    node = next(
        n["id"]
        for n in data["nodes"]
        if n["module_path"] == "decoder.logits_zero_bias" and n["op"].startswith("aten.add")
    )
    assert mcore("graph", "select", snap, "--nodes", node, "--binding-id", "x@1", "-o", sel).code == 0
    here = {"mcore": "0.1.0", "torch": "2.13.0"}
    monkeypatch.setattr(capture_mod, "tool_versions", lambda: dict(here))
    monkeypatch.setattr(mcore_build, "tool_versions", lambda: dict(here))
    res = mcore("build", *args, "--graph-patch", sel, "-o", tmp_path / "b.bundle")
    assert res.code == 0, res
    shown = mcore("inspect", tmp_path / "b.bundle")
    assert "tool_versions: mcore=0.1.0 torch=2.13.0" in shown.out
    # a graph that really differs still asks for a recapture
    res = mcore(
        "build", "demo:qwen3-tiny", "--max-cache-length", "128", "--graph-patch", sel, "-o", tmp_path / "c.bundle"
    )
    assert_user_error(res, "does not match the graph", "recapture")


def test_shipped_fingerprint_steps_replay_clean_on_another_torch(other_torch, tmp_path, workbench):
    """Every shipped session's capture and build steps (the fingerprint-recording ones) replay
    clean when the replaying box reports torch 2.11."""
    for name in ("qwen-recipe", "qwen-manual", "distilbert-residual"):
        steps = json.loads((REPO / "sessions" / f"{name}.json").read_text())["steps"]
        upto = max(
            i
            for i, s in enumerate(steps, 1)
            if s["action"] in ("capture_graph", "build_bundle", "select_nodes", "select_recipe")
        )
        path = slice_session(name, list(range(1, upto + 1)), tmp_path)
        res = workbench("replay", path, "--headless", "--workdir", tmp_path / f"wd-{name}")
        assert res.code == 0, res.out + res.err
        assert not diff_rows(res.out) and len(table_rows(res.out)) == upto


def test_real_graph_difference_names_torch_versions_and_ops(other_torch, tmp_path, workbench):
    """A recording whose graph differs from what this torch captures: the replay says which torch
    recorded it, which replays it, and which op counts differ, not a bare DIFF."""
    i = step_index("qwen-manual", "capture_graph")

    def as_if_recorded_elsewhere(steps):
        r = steps[0]["results"]
        r["fingerprint"] = "f" * 64
        r["nodes"] += 1
        r["ops"]["aten.mul.Tensor"] = r["ops"].get("aten.mul.Tensor", 0) + 1

    path = slice_session("qwen-manual", [i], tmp_path, tamper=as_if_recorded_elsewhere)
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert res.code == 1
    fields = [r[3] for r in diff_rows(res.out)]
    assert fields[0] == "fingerprint", res.out
    assert {"nodes", "graph differs between torch versions", "ops.aten.mul.Tensor"} <= set(fields)
    row = next(r for r in diff_rows(res.out) if r[3] == "graph differs between torch versions")
    assert row[4:] == ["torch 2.13.0", "torch 2.11.0"]
