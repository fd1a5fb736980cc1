"""The second adversarial pass (issue 27): the tracebacks and lenient readers it found, each a
one-line error (exit 2) or a clean run now."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mcore.graph.snapshot import fingerprint
from mcore.selection.receipt import abi_contract, abi_sha256
from mcore.selection.region import select_region

from .conftest import REPO, assert_user_error, repo_env
from .graphs import dag_snapshot


def _write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


# ---------------------------------------------------------------- the process boundary


@pytest.mark.parametrize("module", ["mcore", "workbench"])
def test_stdout_closed_at_start_is_one_line(module):
    r = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=repo_env(),
        preexec_fn=lambda: os.close(1),  # the child starts with fd 1 closed, as `cmd >&-`
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert (
        r.stderr.strip()
        == f"{module}: error: cannot write the output (stdout is closed); redirect stdout elsewhere and rerun"
    )


# ---------------------------------------------------------------- lenient readers


def test_a_snapshot_with_schema_version_true_is_refused(tmp_path, mcore):
    snap = dag_snapshot(3, [(0, 1), (1, 2)])
    snap["schema_version"] = True  # == 1 in Python
    snap["fingerprint"] = fingerprint(snap)
    assert_user_error(mcore("graph", "list", _write(tmp_path / "g.json", snap)), "schema_version True")


@pytest.mark.parametrize(
    "line, says",
    [
        ('{"prompt": "a", "tokens": [1], "text": "x", "score": 3}', "unknown field(s) score"),
        ('{"prompt": "a", "tokens": [1], "tokens": [2], "text": "x"}', "key 'tokens' appears twice"),
        ('{"prompt": 5, "tokens": [1], "text": "x"}', "field prompt must be a string"),
    ],
)
def test_token_records_with_extra_or_duplicate_keys_are_refused(tmp_path, mcore, line, says):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a", "tokens": [1], "text": "x"}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line + "\n")
    assert_user_error(mcore("verify", "tokens", good, bad), says)


def _selection(tmp_path, snap: dict, rec: dict) -> tuple[str, str]:
    return _write(tmp_path / "g.graph.json", snap), _write(tmp_path / "r.selection.json", rec)


def test_the_stub_exporter_refuses_a_receipt_with_extra_fields(tmp_path, mcore):
    snap = dag_snapshot(3, [(0, 1), (1, 2)])
    snap_p, rec_p = _selection(tmp_path, snap, select_region(snap, ["node:1"], "k@1").to_dict())
    assert mcore("kernel", "stub", rec_p, "--snapshot", snap_p, "-o", tmp_path / "k.py").code == 0
    rec = json.loads((tmp_path / "r.selection.json").read_text())
    rec["extra_key"] = 1
    _write(tmp_path / "extra.json", rec)
    r = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "k.py"),
            "--selection",
            str(tmp_path / "extra.json"),
            "--snapshot",
            snap_p,
            "--check-only",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown field(s) extra_key" in r.stderr, r.stderr
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    r = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "k.py"),
            "--selection",
            str(tmp_path / "deep.json"),
            "--snapshot",
            snap_p,
            "--check-only",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "RecursionError" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_kernel_stub_refuses_a_shape_its_kernel_cannot_index(tmp_path, mcore):
    snap = dag_snapshot(3, [(0, 1), (1, 2)], shape=(10**12, 10**12))
    snap_p, rec_p = _selection(tmp_path, snap, select_region(snap, ["node:1"], "k@1").to_dict())
    assert_user_error(mcore("kernel", "stub", rec_p, "--snapshot", snap_p, "-o", tmp_path / "k.py"), "32-bit")
    assert not (tmp_path / "k.py").exists()


def test_kernel_stub_refuses_an_fp8_boundary_made_by_hand(tmp_path, mcore):
    """A receipt and snapshot edited to FP8 (hashes recomputed): the region rules run again on the
    snapshot and refuse it (the generator had no CuTe type for it)."""
    snap = dag_snapshot(3, [(0, 1), (1, 2)], dtype="FP8")
    rec = select_region(dag_snapshot(3, [(0, 1), (1, 2)]), ["node:1"], "k@1").to_dict()
    for side in ("inputs", "outputs"):
        for e in rec["abi"][side]:
            e["dtype"] = "FP8"
    rec["graph_fingerprint"] = snap["fingerprint"]
    a = rec["abi"]
    rec["abi_sha256"] = abi_sha256(
        abi_contract(a["inputs"], a["outputs"], rec["workspace_bytes"], rec["extra_args"], rec["output_shape_input"])
    )
    snap_p, rec_p = _selection(tmp_path, snap, rec)
    assert_user_error(mcore("kernel", "stub", rec_p, "--snapshot", snap_p, "-o", tmp_path / "k.py"), "dtype FP8")


def test_lone_surrogates_in_snapshot_names_print_and_generate_escaped(tmp_path, mcore):
    snap = dag_snapshot(3, [(0, 1), (1, 2)])
    snap["nodes"][1]["name"] = "op\ud800x"
    snap["tensors"][2]["name"] = "t\udcffx"
    snap["fingerprint"] = fingerprint(snap)
    snap_p, rec_p = _selection(tmp_path, snap, select_region(snap, ["node:1"], "k@1").to_dict())
    assert mcore("graph", "list", snap_p).code == 0
    shown = mcore("graph", "show", snap_p, "node:1")
    assert shown.code == 0 and "op\\ud800x" in shown.out, shown
    res = mcore("kernel", "stub", rec_p, "--snapshot", snap_p, "-o", tmp_path / "k.py")
    assert res.code == 0, res
    assert "t/udcffx" in (tmp_path / "k.py").read_text(encoding="utf-8")


def test_deeply_nested_json_in_an_extra_arg_is_one_line(tmp_path, mcore):
    snap = dag_snapshot(3, [(0, 1), (1, 2)])
    snap_p = _write(tmp_path / "g.json", snap)
    deep = "[" * 100000 + "]" * 100000
    res = mcore(
        "graph",
        "select",
        snap_p,
        "--nodes",
        "node:1",
        "--binding-id",
        "k@1",
        "--workspace-bytes",
        "0",
        "--extra-arg",
        deep,
        "-o",
        tmp_path / "r.json",
    )
    assert_user_error(res, "--extra-arg")


# ---------------------------------------------------------------- a kernel without the workspace argument


def test_a_workspace_slot_bound_to_a_kernel_without_one_is_one_line(tmp_path, mcore):
    """The receipt has a workspace; identity-copy takes (input, output): the first call names the slot
    and its call instead of tvm_ffi's TypeError."""
    bundle = tmp_path / "s.bundle"
    res = mcore(
        "build",
        "demo:qwen3-tiny",
        "--max-cache-length",
        "64",
        "--recipe",
        "qwen.decode_logits_copy@1",
        "decoder.logits_zero_bias",
        "--workspace-bytes",
        "16",
        "-o",
        bundle,
    )
    assert res.code == 0, res
    assert mcore("kernel", "build", "identity-copy", "--cuda", "off", "-o", tmp_path / "k.so").code == 0
    abi = json.loads((tmp_path / "s.selection.json").read_text())["abi_sha256"]
    entry = {"id": "qwen.decode_logits_copy@1", "abi_sha256": abi, "library": "./k.so", "function": "run"}
    _write(tmp_path / "kb.json", {"schema_version": 1, "bindings": [entry]})
    res = mcore(
        "run",
        bundle,
        "--kernel-bindings",
        tmp_path / "kb.json",
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
        "--device",
        "cpu",
        "--engine",
        "torch",
    )
    assert res.code == 2 and "Traceback" not in res.err, res
    last = res.err.strip().splitlines()[-1]
    assert "does not take the slot's call run(input0, workspace, output0)" in last
    assert "Expected 2 but got 3 arguments" in last and "workspace (16 bytes)" in last


# ---------------------------------------------------------------- the README's export line


def _readme_command(prefix: str) -> list[str]:
    """The README's documented command starting with `prefix` (continuation lines joined, comments dropped)."""
    import shlex

    text = (REPO / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    (line,) = [ln.split("#")[0] for ln in text.splitlines() if ln.startswith(prefix)]
    return shlex.split(line)[1:]  # without `mcore`


def test_the_readme_kernel_export_line_runs_a_stub(tmp_path, mcore, monkeypatch):
    """`mcore kernel export STUB --selection ... -o ...` as the README documents it passes the stub's
    argument and contract checks (it used to exit 2: a stub needs --snapshot)."""
    args = _readme_command("mcore kernel export kernels/my_residual_add.py")
    snap = dag_snapshot(4, [(0, 2), (1, 2), (2, 3)])  # node:2 adds two tensors: a generated kernel body
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "kernels").mkdir()
    _write(work / "encoder.graph.json", snap)
    _write(work / "residual-add.selection.json", select_region(snap, ["node:2"], "k@1").to_dict())
    monkeypatch.chdir(tmp_path)
    stub = ("kernel", "stub", "work/residual-add.selection.json", "--snapshot", "work/encoder.graph.json")
    assert mcore(*stub, "-o", "kernels/my_residual_add.py").code == 0
    res = mcore(*args)
    assert "--snapshot" not in res.err and "contract" not in res.err.lower(), res
    # exported, or stopped by a missing CuTe DSL (exit 1 of the exporter), never a usage error
    assert res.code == 0 or "exit 1" in res.err, res
