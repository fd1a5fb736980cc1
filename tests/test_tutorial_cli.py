"""The tutorial, steps 1-7, with `mcore` for `trtmc`, on CPU and the demo models (step 5 up to the
exported DSO bound to every layer: its kernel runs on sm_90 GPUs, tests/test_cutedsl_decode_attention.py).

Each step uses the tutorial's flags, file names and printed fields; its Python snippets run
unchanged on our outputs (tests/tutorial_snippets.py holds them verbatim).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DISTIL_ARGS, QWEN_ARGS, assert_user_error, needs_cute
from tests.tutorial_snippets import STEP4_PERF_SNIPPET, STEP7_EMBEDDING_SNIPPET, run_snippet

PROMPT = "Explain grouped-query attention in one sentence."
TEST_PROMPT = "Explain grouped-query attention, KV caching, and decode latency."
ABI_SNIPPET = 'import json,sys; print(json.load(open(sys.argv[1]))["abi_sha256"])'

CONST_FILL = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <cstring>
// Writes 0.25 everywhere: a kernel that is ABI-compatible but wrong, to prove the slot really runs.
void Run(tvm::ffi::TensorView in, tvm::ffi::TensorView out) {
  float* o = static_cast<float*>(out.data_ptr());
  int64_t n = 1; for (int i = 0; i < out.ndim(); ++i) n *= out.shape()[i];
  for (int64_t i = 0; i < n; ++i) o[i] = 0.25f * static_cast<float>(i % 7);
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
"""


def abi_of(path: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", ABI_SNIPPET, str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


def write_bindings(path: Path, binding_id: str, abi: str, library: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": binding_id, "abi_sha256": abi, "library": library, "function": "run"}],
            },
            indent=2,
        )
    )
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen3-graph-slot")


@pytest.fixture(scope="module")
def qwen(work):
    """Steps 1-3: recipe build, identity-copy DSO, bindings; plus the native build of step 4."""
    from mcore.cli.main import main

    binding = "qwen.decode_logits_copy@1"
    assert (
        main(
            [
                "build",
                *QWEN_ARGS,
                "--recipe",
                binding,
                "decoder.logits_zero_bias",
                "-o",
                str(work / "qwen3-slot-ready.bundle"),
            ]
        )
        == 0
    )
    assert main(["kernel", "build", "identity-copy", "-o", str(work / "kernel.so")]) == 0
    write_bindings(
        work / "kernel-bindings.json", binding, abi_of(work / "qwen3-slot-ready.selection.json"), "./kernel.so"
    )
    assert main(["build", *QWEN_ARGS, "-o", str(work / "qwen3-native.bundle")]) == 0
    return work


def test_step1_recipe_build_writes_bundle_and_receipt(qwen):
    sel = json.loads((qwen / "qwen3-slot-ready.selection.json").read_text())
    for field in (
        "schema_version",
        "graph_fingerprint",
        "engine_role",
        "binding_id",
        "abi_sha256",
        "workspace_bytes",
        "extra_args",
        "node_ids",
        "input_tensor_ids",
        "output_tensor_ids",
        "output_shape_input",
    ):
        assert field in sel
    assert sel["binding_id"] == "qwen.decode_logits_copy@1" and sel["engine_role"] == "decode"
    assert (qwen / "qwen3-slot-ready.bundle").is_file()


def test_step3_run_with_binding(mcore, qwen):
    r = mcore(
        "run",
        qwen / "qwen3-slot-ready.bundle",
        "--kernel-bindings",
        qwen / "kernel-bindings.json",
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "32",
        "--greedy",
    )
    assert r.code == 0, r
    assert r.out.strip()


def test_step3_slot_ready_bundle_needs_its_binding(mcore, qwen):
    r = mcore("run", qwen / "qwen3-slot-ready.bundle", "--prompt", PROMPT, "--greedy")
    assert_user_error(r, "qwen.decode_logits_copy@1")


def test_step4_tokens_equal_and_perf_snippet(mcore, qwen):
    for name, extra in (("native", []), ("external", ["--kernel-bindings", qwen / "kernel-bindings.json"])):
        bundle = qwen / ("qwen3-native.bundle" if name == "native" else "qwen3-slot-ready.bundle")
        r = mcore(
            "run",
            bundle,
            *extra,
            "--prompt",
            TEST_PROMPT,
            "--max-new-tokens",
            "64",
            "--greedy",
            "--output",
            qwen / f"{name}.jsonl",
        )
        assert r.code == 0, r
        r = mcore(
            "run",
            bundle,
            *extra,
            "--prompt",
            TEST_PROMPT,
            "--max-new-tokens",
            "64",
            "--greedy",
            "--warmup",
            "1",
            "--benchmark",
            "3",
        )
        assert r.code == 0, r
        (qwen / f"{name}.perf.log").write_text(r.out + r.err)
    native = (qwen / "native.jsonl").read_text()
    assert native == (qwen / "external.jsonl").read_text()  # `diff -u` is empty
    assert json.loads(native)["tokens"]
    r = mcore("verify", "tokens", qwen / "native.jsonl", qwen / "external.jsonl")
    assert r.code == 0 and "PASS" in r.out
    snip = run_snippet(STEP4_PERF_SNIPPET, qwen / "native.perf.log", qwen / "external.perf.log")
    out = snip.stdout + snip.stderr
    # The lines parse and the generated-token means agree; the ratio itself is a CPU measurement
    # (pass or fail on noise) — the GPU numbers live in docs/.
    assert "native=" in out and "external=" in out, out
    assert "not reported" not in out and "means differ" not in out and "must be positive" not in out


def test_slot_really_runs_and_pipelines_hold_their_own_binding(qwen, tmp_path):
    import tvm_ffi.cpp

    from mcore.runtime.pipeline import DecoderPipeline

    (tmp_path / "fill.cc").write_text(CONST_FILL)
    lib = tvm_ffi.cpp.build("constfill", cpp_files=[str(tmp_path / "fill.cc")], build_directory=str(tmp_path / "b"))
    wrong = qwen / "wrong.so"
    wrong.write_bytes(Path(lib).read_bytes())
    abi = abi_of(qwen / "qwen3-slot-ready.selection.json")
    good_m = qwen / "kernel-bindings.json"
    bad_m = write_bindings(qwen / "wrong-bindings.json", "qwen.decode_logits_copy@1", abi, "./wrong.so")
    native = DecoderPipeline(str(qwen / "qwen3-native.bundle"), device="cpu").generate(
        TEST_PROMPT, 12, stop_at_eos=False
    )
    good = DecoderPipeline(str(qwen / "qwen3-slot-ready.bundle"), kernel_bindings=str(good_m), device="cpu")
    bad = DecoderPipeline(str(qwen / "qwen3-slot-ready.bundle"), kernel_bindings=str(bad_m), device="cpu")
    # editing the manifest after load changes nothing in the running pipelines
    write_bindings(good_m, "qwen.decode_logits_copy@1", abi, "./wrong.so")
    try:
        g = good.generate(TEST_PROMPT, 12, stop_at_eos=False).tokens
        b = bad.generate(TEST_PROMPT, 12, stop_at_eos=False).tokens
    finally:
        write_bindings(good_m, "qwen.decode_logits_copy@1", abi, "./kernel.so")
    assert g == native.tokens
    assert b[0] == native.tokens[0]  # the first token comes from prefill, which has no slot
    assert b != native.tokens  # decode logits come from the (wrong) kernel


@needs_cute
def test_step5_attention_recipe_every_layer_one_binding(mcore, tmp_path):
    args = [
        "demo:qwen3-tiny-hd64",
        "--precision",
        "bf16",
        "--max-cache-length",
        "256",
        "--decoder-engine-layout",
        "split",
    ]
    r = mcore(
        "build",
        *args,
        "--recipe",
        "qwen.decode_attention_region@2",
        "all-instances",
        "-o",
        tmp_path / "qwen3-attention-slot.bundle",
    )
    assert r.code == 0, r
    sel = tmp_path / "qwen3-attention-slot.selection.decoder.layers.0.decode_attention.json"
    receipt = json.loads(sel.read_text())
    # the tutorial's printed boundary: scaled query, key and value caches, INT32[1] lengths -> context
    abi = receipt["abi"]
    shapes = [(t["dtype"], t["shape"]) for t in abi["inputs"] + abi["outputs"]]
    assert shapes == [
        ("BF16", [1, 8, -1, 64]),
        ("BF16", [1, 2, 256, 64]),
        ("BF16", [1, 2, 256, 64]),
        ("INT32", [1]),
        ("BF16", [1, 8, -1, 64]),
    ]
    r = mcore("kernel", "export", "cutedsl-decode-attention", "--selection", sel, "-o", tmp_path / "attn.so")
    assert r.code == 0 and f"abi_sha256={receipt['abi_sha256']}" in r.out, r
    r = mcore("inspect", tmp_path / "qwen3-attention-slot.bundle")
    assert f"kernel_binding qwen.decode_attention_region@2 abi_sha256={receipt['abi_sha256']} serves 2 slot(s)" in r.out


def test_step6_manual_selection_same_tokens(mcore, qwen):
    r = mcore("graph", "inspect", "--engine-role", "decode", "--snapshot", qwen / "decode.graph.json", *QWEN_ARGS)
    assert r.code == 0, r
    r = mcore("graph", "list", qwen / "decode.graph.json")
    tail = r.out.splitlines()[-4:]
    nodes = [l.split()[0] for l in tail[:3]]
    assert "LayerType.CONSTANT" in tail[0] and "(logits)" in tail[3]
    binding = "qwen3.decode.logits_copy.manual@1"
    r = mcore(
        "graph",
        "select",
        qwen / "decode.graph.json",
        "--nodes",
        *nodes,
        "--binding-id",
        binding,
        "--workspace-bytes",
        "0",
        "-o",
        qwen / "manual.selection.json",
    )
    assert r.code == 0, r
    r = mcore(
        "build",
        *QWEN_ARGS,
        "--graph-patch",
        qwen / "manual.selection.json",
        "-o",
        qwen / "qwen3-manual-slot-ready.bundle",
    )
    assert r.code == 0, r
    manual_abi = abi_of(qwen / "manual.selection.json")
    assert manual_abi == abi_of(qwen / "qwen3-slot-ready.selection.json")  # same contract, same hash
    write_bindings(qwen / "manual-bindings.json", binding, manual_abi, "./kernel.so")
    r = mcore(
        "run",
        qwen / "qwen3-manual-slot-ready.bundle",
        "--kernel-bindings",
        qwen / "manual-bindings.json",
        "--prompt",
        TEST_PROMPT,
        "--max-new-tokens",
        "64",
        "--greedy",
        "--output",
        qwen / "manual.jsonl",
    )
    assert r.code == 0, r
    r = mcore(
        "run",
        qwen / "qwen3-native.bundle",
        "--prompt",
        TEST_PROMPT,
        "--max-new-tokens",
        "64",
        "--greedy",
        "--output",
        qwen / "native6.jsonl",
    )
    assert (qwen / "manual.jsonl").read_text() == (qwen / "native6.jsonl").read_text()


def test_graph_patch_with_other_build_args_says_recapture(mcore, qwen):
    snap = qwen / "decode.graph.json"
    assert mcore("graph", "inspect", "--engine-role", "decode", "--snapshot", snap, *QWEN_ARGS).code == 0
    r = mcore(
        "graph",
        "select",
        snap,
        "--recipe",
        "qwen.decode_logits_copy@1",
        "decoder.logits_zero_bias",
        "-o",
        qwen / "again.json",
    )
    assert r.code == 0, r
    other = [a if a != "256" else "128" for a in QWEN_ARGS]
    r = mcore("build", *other, "--graph-patch", qwen / "again.json", "-o", qwen / "x.bundle")
    assert_user_error(r, "recapture")
    assert not (qwen / "x.bundle").exists()
    r = mcore("build", *DISTIL_ARGS, "--graph-patch", qwen / "again.json", "-o", qwen / "x.bundle")
    assert_user_error(r, "engine role 'decode'")


def test_wrong_abi_hash_in_manifest_fails_closed(mcore, qwen):
    m = write_bindings(qwen / "bad-abi.json", "qwen.decode_logits_copy@1", "0" * 64, "./kernel.so")
    r = mcore("run", qwen / "qwen3-slot-ready.bundle", "--kernel-bindings", m, "--prompt", PROMPT, "--greedy")
    assert_user_error(r, "qwen.decode_logits_copy@1")


@pytest.fixture(scope="module")
def cute_work(tmp_path_factory):
    return tmp_path_factory.mktemp("distilbert-cutedsl")


def test_step7_distilbert_residual_add(mcore, cute_work):
    w = cute_work
    binding = "distilbert.layer0.attention_residual_add.cutedsl@1"
    # the tutorial's own role name: DistilBERT's one role is `encoder`, which the snapshot records
    r = mcore("graph", "inspect", "--engine-role", "decode", "--snapshot", w / "decode.graph.json", *DISTIL_ARGS)
    assert r.code == 0, r
    assert "engine_role=encoder " in r.out and "captured it for 'decode'" in r.err
    assert json.loads((w / "decode.graph.json").read_text())["metadata"]["engine_role"] == "encoder"
    r = mcore("graph", "list", w / "decode.graph.json", "--match", "*ElementWiseOperation.SUM*")
    first = next(l for l in r.out.splitlines() if "encoder.layers.0.attention_residual" in l)
    node = first.split()[0]
    r = mcore(
        "graph",
        "select",
        w / "decode.graph.json",
        "--nodes",
        node,
        "--binding-id",
        binding,
        "--workspace-bytes",
        "0",
        "-o",
        w / "residual-add.selection.json",
    )
    assert r.code == 0, r
    sel = json.loads((w / "residual-add.selection.json").read_text())
    assert [(e["dtype"], e["shape"]) for e in sel["abi"]["inputs"]] == [("FP32", [256, 64])] * 2
    assert sel["abi"]["inputs"][0]["name"] != sel["abi"]["inputs"][1]["name"]
    assert mcore("kernel", "build", "residual-add", "-o", w / "residual-add.so").code == 0
    r = mcore(
        "build",
        *DISTIL_ARGS,
        "--graph-patch",
        w / "residual-add.selection.json",
        "-o",
        w / "distilbert-slot-ready.bundle",
    )
    assert r.code == 0, r
    assert mcore("build", *DISTIL_ARGS, "-o", w / "distilbert-native.bundle").code == 0
    write_bindings(w / "kernel-bindings.json", binding, abi_of(w / "residual-add.selection.json"), "./residual-add.so")
    prompt = "The quick brown fox jumps over the lazy dog."
    r = mcore("embed", w / "distilbert-native.bundle", "--prompt", prompt)
    assert r.code == 0, r
    (w / "native.json").write_text(r.out)
    r = mcore(
        "embed", w / "distilbert-slot-ready.bundle", "--kernel-bindings", w / "kernel-bindings.json", "--prompt", prompt
    )
    assert r.code == 0, r
    (w / "byok.json").write_text(r.out)
    assert len(json.loads(r.out)["embedding"]) == 256 * 64
    snip = run_snippet(STEP7_EMBEDDING_SNIPPET, w / "native.json", w / "byok.json")
    assert snip.returncode == 0 and "PASS: numerical gate" in snip.stdout, snip.stdout + snip.stderr
    r = mcore("verify", "embeddings", w / "native.json", w / "byok.json", "--max-abs", "0.02", "--min-cosine", "0.999")
    assert r.code == 0 and "PASS: numerical gate" in r.out


def test_inspect_shows_slots(mcore, qwen):
    r = mcore("inspect", qwen / "qwen3-slot-ready.bundle")
    assert r.code == 0 and "integrity OK" in r.out
    sel = json.loads((qwen / "qwen3-slot-ready.selection.json").read_text())
    assert f"kernel_slot qwen.decode_logits_copy@1 role=decode abi_sha256={sel['abi_sha256']}" in r.out
    r = mcore("inspect", qwen / "qwen3-native.bundle")
    assert "kernel_slots: none" in r.out
