"""`mcore verify logits`: a native bundle and its slot twin stepped in lockstep on CPU."""

from __future__ import annotations

import json
import re

import pytest

from . import scaled_copy
from .conftest import assert_user_error

RID = "qwen.decode_logits_copy@1"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from mcore.bundle.build import build_bundle
    from mcore.kernels.shipped import build_kernel
    from mcore.model.buildargs import BuildArgs

    d = tmp_path_factory.mktemp("lockstep")
    args = dict(model="demo:qwen3-tiny", max_cache_length=64)
    native = build_bundle(BuildArgs(precision="fp32", **args), d / "native.bundle")
    slot = build_bundle(
        BuildArgs(precision="fp32", **args), d / "slot.bundle", recipe=(RID, "decoder.logits_zero_bias")
    )
    bf16 = build_bundle(BuildArgs(precision="bf16", **args), d / "bf16.bundle")
    small = build_bundle(BuildArgs(precision="fp32", model="demo:qwen3-tiny", max_cache_length=32), d / "small.bundle")
    build_kernel("identity-copy", d / "kernel.so", cuda="off")
    scaled_copy.build_scaled_copy(d / "doubled.so", "2.0f", d / "doubled")  # logits x 2: wrong by |logits|
    for manifest, lib in (("kb.json", "./kernel.so"), ("doubled.json", "./doubled.so")):
        binding = {"id": RID, "abi_sha256": slot.receipt.abi_sha256, "library": lib, "function": "run"}
        (d / manifest).write_text(json.dumps({"schema_version": 1, "bindings": [binding]}))
    return d, native, slot, bf16, small


def _steps(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step \d+: max_abs (\S+)", out, re.M)]


def test_identity_copy_slot_is_bit_identical_in_lockstep(bundles, mcore):
    d, native, slot, _, _ = bundles
    r = mcore(
        "verify",
        "logits",
        native.bundle_path,
        slot.bundle_path,
        "--kernel-bindings",
        d / "kb.json",
        "--prompt",
        "hello world",
        "--max-new-tokens",
        "5",
        "--device",
        "cpu",
    )
    assert r.code == 0, r
    assert _steps(r.out) == [0.0] * 5
    assert "PASS: logits over 5 steps in lockstep: worst max_abs 0 (limit bit-identical); no greedy divergence" in r.out


def test_a_wrong_kernel_fails_with_the_measured_max_abs(bundles, mcore):
    from mcore.runtime.pipeline import DecoderPipeline

    d, native, slot, _, _ = bundles
    cmd = ["verify", "logits", native.bundle_path, slot.bundle_path, "--kernel-bindings", d / "doubled.json"]
    cmd += ["--prompt", "hello world", "--max-new-tokens", "4", "--device", "cpu"]
    r = mcore(*cmd)
    assert r.code == 1 and "FAIL: logits over 4 steps" in r.out, r
    # step 0 is prefill's, which has no slot: identical. Each decode step's logits come doubled, which
    # keeps every greedy pick and differs from native's by |logits| itself: the step's largest |logit|
    # of the native pipeline on its own greedy tokens
    a = DecoderPipeline(native.bundle_path, device="cpu")
    ids = a.encode("hello world")
    toks = a.generate("hello world", 4, stop_at_eos=False).tokens
    want = [0.0] + [float(x.abs().max()) for x in a.step_logits(ids, toks[:-1])[1:]]
    got = _steps(r.out)
    assert len(got) == 4 and min(want[1:]) > 0
    assert got == pytest.approx(want, rel=1e-6)
    assert max(got) == pytest.approx(float(re.search(r"worst max_abs (\S+)", r.out)[1]), rel=1e-5)
    assert "no greedy divergence" in r.out
    # a loose enough limit passes the same pair
    r = mcore(*cmd, "--max-abs", str(max(want) * 2))
    assert r.code == 0 and "PASS" in r.out


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (("--max-abs", "nan"), "--max-abs nan must be a finite number >= 0"),
        (("--max-abs", "-1"), "--max-abs -1.0 must be a finite number >= 0"),
        (("--max-new-tokens", "0"), "--max-new-tokens 0 must be at least 1"),
    ],
)
def test_bad_values_are_one_line_errors(bundles, mcore, extra, fragment):
    _, native, slot, _, _ = bundles
    assert_user_error(
        mcore("verify", "logits", native.bundle_path, slot.bundle_path, "--prompt", "hi", *extra), fragment
    )


def test_what_fails_after_the_native_pipeline_is_refused_before_it_loads(bundles, mcore, tmp_path):
    # both used to surface only once the native pipeline had loaded (on an 8B model, compiled: a minute)
    d, native, slot, _, _ = bundles
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "bindings": [')
    for extra, fragment in [
        (("--kernel-bindings", bad), "malformed JSON in kernel bindings manifest"),
        ((), "is not bound; pass --kernel-bindings with an entry for it"),
        (
            ("--kernel-bindings", d / "kb.json", "--max-new-tokens", "99"),
            "need 100 cache slots but the KV cache holds 64",
        ),
        (("--kernel-bindings", d / "kb.json", "--chat"), "this checkpoint has no chat template"),
    ]:
        r = mcore("verify", "logits", native.bundle_path, slot.bundle_path, "--prompt", "hi", "--device", "cpu", *extra)
        assert_user_error(r, fragment)
        assert "loading the native pipeline" not in r.err


def test_bundles_that_are_not_twins_are_refused(bundles, mcore):
    _, native, _, _, small = bundles
    assert_user_error(
        mcore("verify", "logits", native.bundle_path, small.bundle_path, "--prompt", "hi", "--device", "cpu"),
        "not built from the same model and KV capacity",
    )


def test_twins_of_another_precision_or_swapped_are_refused_before_running(bundles, mcore):
    # a FAIL would blame a kernel for a precision the native bundle never ran
    d, native, slot, bf16, _ = bundles
    run = ("--prompt", "hi", "--device", "cpu")
    assert_user_error(
        mcore("verify", "logits", native.bundle_path, bf16.bundle_path, *run),
        f"{bf16.bundle_path} is built with --precision bf16 but {native.bundle_path} with --precision fp32; "
        "build the native bundle and its slot twin with the same BUILD_ARGS",
    )
    swapped = mcore("verify", "logits", slot.bundle_path, native.bundle_path, "--kernel-bindings", d / "kb.json", *run)
    assert_user_error(swapped, "has kernel slots (1: ", "); the first bundle must be the native one (no slots)")


def test_step_comparison_reports_non_finite_as_inf_and_the_first_divergence():
    import math

    import torch

    from mcore.verify.logits import _compare_steps, _lockstep_result

    a = [torch.tensor([[0.0, 1.0, 0.5]]), torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[0.0, 0.0, 3.0]])]
    b = [torch.tensor([[0.0, 1.0, 0.25]]), torch.tensor([[0.0, 1.5, float("nan")]]), torch.tensor([[1.0, 0.0, 0.0]])]
    steps, first = _compare_steps(a, b)
    assert [s["max_abs"] for s in steps] == [0.25, math.inf, 3.0]  # a NaN anywhere is an infinite difference
    # torch's argmax takes a NaN as the largest value
    assert [(s["native"], s["external"]) for s in steps] == [(1, 1), (0, 2), (2, 0)] and first == 1
    r = _lockstep_result(steps, first, [1, 0, 2], 10.0, "eager", "cpu")
    assert not r.passed and r.line.startswith("FAIL: logits over 3 steps in lockstep: worst max_abs inf (limit <= 10)")
    assert "greedy picks first differ at step 1" in r.line and r.info[1].endswith("<- first divergence")
