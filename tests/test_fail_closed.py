"""Fail closed on values and inputs that used to crash or reach native code (issue 11)."""

from __future__ import annotations

import json
import math

import pytest

from mcore.common.errors import UserError

from .conftest import DISTIL_ARGS, assert_user_error

HEX = "ab" * 32


@pytest.fixture(scope="module")
def encoder_bundle(tmp_path_factory):
    from mcore.cli.main import main

    out = tmp_path_factory.mktemp("enc") / "distil.bundle"
    assert main(["build", *DISTIL_ARGS, "-o", str(out)]) == 0
    return out


# ---------------------------------------------------------------- gate thresholds (item 6)


@pytest.mark.parametrize(
    "flag,value,fragment",
    [
        ("--max-abs", "nan", "--max-abs nan must be a finite number >= 0"),
        ("--max-abs", "inf", "--max-abs inf must be a finite number >= 0"),
        ("--max-abs", "-0.1", "--max-abs -0.1"),
        ("--min-cosine", "nan", "--min-cosine nan must be a finite number in [-1, 1]"),
        ("--min-cosine", "1.5", "--min-cosine 1.5"),
    ],
)
def test_embedding_gate_thresholds_are_finite_and_in_range(flag, value, fragment, tmp_path, mcore):
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps({"embedding": [1.0, 2.0]}))
    res = mcore("verify", "embeddings", tmp_path / "a.json", tmp_path / "b.json", flag, value)
    assert_user_error(res, fragment)


def test_perf_and_reference_thresholds_use_the_same_rule(mcore, tmp_path):
    assert_user_error(
        mcore("verify", "perf", "--native", "true", "--external", "true", "--min-ratio", "nan"),
        "--min-ratio nan must be a finite number > 0",
    )
    assert_user_error(
        mcore(
            "verify",
            "reference",
            tmp_path / "x.bundle",
            "--checkpoint",
            "demo:qwen3-tiny",
            "--prompt",
            "hi",
            "--min-cosine",
            "inf",
        ),
        "--min-cosine inf",
    )


def test_session_gate_thresholds_are_checked(tmp_path):
    from workbench.actions import ActionContext
    from workbench.dispatch import run_action

    ctx = ActionContext(workdir=tmp_path)
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps({"embedding": [1.0, 2.0]}))
    results, error = run_action(ctx, "gate_embeddings", {"native": "a.json", "external": "b.json", "max_abs": math.inf})
    assert results is None and "--max-abs inf must be a finite number" in error


# ---------------------------------------------------------------- CLI values that crashed (item 4)


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--temperature", "nan"], "--temperature must be a finite number > 0"),
        (["--temperature", "0"], "--temperature must be a finite number > 0"),
        (["--seed", str(2**70)], "--seed must be in 0.."),
        (["--seed", "-1"], "--seed must be in 0.."),
        (["--top-k", "-3"], "--top-k must be >= 0"),
        # flags that would change nothing: said, not ignored
        (["--greedy", "--temperature", "0.5"], "--temperature shape sampling, and --greedy does not sample"),
        (["--greedy", "--top-k", "5", "--seed", "2"], "--top-k, --seed shape sampling, and --greedy does not sample"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--prompt", "caf\udce9"], "--prompt is not valid UTF-8"),
    ],
)
def test_run_values_that_would_crash_are_refused_before_loading(extra, fragment, tmp_path, mcore):
    # the bundle does not exist: these are refused before anything is read
    assert_user_error(mcore("run", tmp_path / "missing.bundle", "--prompt", "hi", *extra), fragment)


@pytest.mark.parametrize("verb", ["run", "embed"])
@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--benchmark", "0"], "--benchmark N needs N >= 1, got 0"),
        (["--benchmark", "-2"], "--benchmark N needs N >= 1, got -2"),
        (["--benchmark", "3", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--warmup", "3"], "--warmup 3 applies to --benchmark N"),  # untimed runs before no timed ones
    ],
)
def test_benchmark_counts_are_refused_before_loading(verb, extra, fragment, tmp_path, mcore):
    # `embed --benchmark 0` printed an embedding and no benchmark line, as if the flag were not given
    assert_user_error(mcore(verb, tmp_path / "missing.bundle", "--prompt", "hi", *extra), fragment)


def test_non_utf8_prompt_for_embed(tmp_path, mcore):
    assert_user_error(mcore("embed", tmp_path / "missing.bundle", "--prompt", "\udcff"), "not valid UTF-8")


@pytest.mark.parametrize(
    "device,fragment",
    [
        ("meta", "the engines run on cpu or cuda"),
        ("mps", "the engines run on cpu or cuda"),
        ("banana", "is not a device"),
        ("cuda:99", "cuda"),
    ],
)
def test_device_must_be_cpu_or_cuda(device, fragment):
    from mcore.runtime.pipeline import resolve_device

    with pytest.raises(UserError, match=fragment):
        resolve_device(device)


@pytest.mark.parametrize("device,fragment", [("tpu", "is not a device"), ("mps", "the engines run on cpu or cuda")])
def test_build_refuses_a_device_no_run_could_use(device, fragment, tmp_path, mcore):
    # `mcore build --device tpu` wrote a bundle whose every run then failed on a --device it was not given
    out = tmp_path / "b.bundle"
    assert_user_error(
        mcore("build", "demo:qwen3-tiny", "--device", device, "-o", out), f"--device {device!r}", fragment
    )
    assert not out.exists()


@pytest.mark.parametrize("verb", ["build", "graph inspect"])
def test_a_seed_beside_checkpoint_weights_is_refused(verb, tmp_path, mcore):
    # `--seed 3` without `--weights random` built the checkpoint's weights as if no seed were given
    out = (
        ["-o", tmp_path / "b.bundle"]
        if verb == "build"
        else ["--engine-role", "decode", "--snapshot", tmp_path / "g.json"]
    )
    r = mcore(*verb.split(), "demo:qwen3-tiny", "--seed", "3", *out)
    assert_user_error(r, "--seed 3 applies to --weights random only")
    assert not (tmp_path / "b.bundle").exists() and not (tmp_path / "g.json").exists()


def test_build_records_a_gpu_device_without_asking_this_machine_for_one(tmp_path, mcore):
    # built here, run on the GPU box: whether the device exists is the run's to check
    r = mcore("build", "demo:qwen3-tiny", "--device", "cuda", "-o", tmp_path / "b.bundle")
    assert r.code == 0, r
    from mcore import open_bundle

    assert open_bundle(tmp_path / "b.bundle").runnable().device == "cuda"


# ---------------------------------------------------------------- checks before native code (item 9)


def test_run_on_an_encoder_says_embed_before_binding(encoder_bundle, tmp_path, mcore, monkeypatch):
    import mcore.runtime.bindings as bindings

    bound = []
    monkeypatch.setattr(bindings, "_load_function", lambda *a: bound.append(a))
    (tmp_path / "k.so").write_bytes(b"\x7fELF")
    (tmp_path / "kb.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": "k@1", "abi_sha256": HEX, "library": "./k.so", "function": "run"}],
            }
        )
    )
    res = mcore("run", encoder_bundle, "--prompt", "hi", "--kernel-bindings", tmp_path / "kb.json")
    assert_user_error(res, "is an encoder", "use `mcore embed`")
    assert bound == []


@pytest.mark.parametrize("verb", ["run", "embed", "profile"])
def test_a_bad_bindings_file_is_named_before_the_bundle_is_hashed(verb, encoder_bundle, tmp_path, mcore, monkeypatch):
    """The manifest's own faults (JSON, fields, a library outside its folder) need no bundle: said before
    the bundle's integrity hash, which takes seconds on an 8B-sized bundle."""
    import mcore.bundle.container as container

    opened = []
    real = container.open_bundle
    monkeypatch.setattr(container, "open_bundle", lambda p: opened.append(p) or real(p))
    bad = {"schema_version": 1, "bindings": [{"id": "k@1", "abi_sha256": HEX, "library": "../k.so", "function": "run"}]}
    (tmp_path / "kb.json").write_text(json.dumps(bad))
    res = mcore(verb, encoder_bundle, "--prompt", "hi", "--kernel-bindings", tmp_path / "kb.json")
    assert_user_error(res, "kb.json", "library '../k.so' leaves the manifest's folder")
    (tmp_path / "kb.json").write_text("{not json")
    assert_user_error(
        mcore(verb, encoder_bundle, "--prompt", "hi", "--kernel-bindings", tmp_path / "kb.json"), "kb.json"
    )
    assert opened == []


def test_a_prompt_too_long_is_refused_before_binding(tmp_path, mcore, monkeypatch):
    import mcore.runtime.bindings as bindings
    from mcore.cli.main import main

    out = tmp_path / "q.bundle"
    assert main(["build", "demo:qwen3-tiny", "--max-cache-length", "32", "-o", str(out)]) == 0
    bound = []
    monkeypatch.setattr(bindings, "_load_function", lambda *a: bound.append(a))
    (tmp_path / "k.so").write_bytes(b"\x7fELF")
    (tmp_path / "kb.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": "k@1", "abi_sha256": HEX, "library": "./k.so", "function": "run"}],
            }
        )
    )
    res = mcore("run", out, "--prompt", "x " * 40, "--max-new-tokens", "4", "--kernel-bindings", tmp_path / "kb.json")
    assert_user_error(res, "need", "cache slots", "KV cache holds 32", "--max-cache-length")
    assert bound == [] and "loading native code" not in res.err
    # fits: the same command goes on to the binding step (and fails there on this fake DSO's ID)
    res = mcore("run", out, "--prompt", "x y", "--max-new-tokens", "4", "--kernel-bindings", tmp_path / "kb.json")
    assert "cache slots" not in res.err


# ---------------------------------------------------------------- bundle manifests (items 10, 11)


def _write_unchecked(tmp_path, monkeypatch, manifest):
    import mcore.bundle.container as bundle

    with monkeypatch.context() as m:  # the writer refuses such a manifest; the reader must too
        m.setattr(bundle, "_check_manifest_shape", lambda *a: None)
        return bundle.write_bundle(tmp_path / "bad.bundle", manifest, {"x": b"1"})


def _manifest(**extra):
    from mcore.bundle.container import BUNDLE_KIND, BUNDLE_SCHEMA_VERSION

    m = {
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "kind": BUNDLE_KIND,
        "engine": "torch",
        "family": "distilbert",
        "family_kind": "encoder",
        "model": {"spec": "demo:distilbert-tiny", "revision": None},
        "build_args": {"model": "demo:distilbert-tiny"},
        "graph_args": {},
        "weights": {"kind": "random", "seed": 0},
        "roles": {"encoder": {"fingerprint": HEX, "inputs": [], "outputs": ["hidden"]}},
        "kernel_slots": [],
    }
    m.update(extra)
    return m


def test_a_slot_in_a_role_the_bundle_lacks_is_refused_at_load(tmp_path, monkeypatch, mcore):
    m = _manifest(kernel_slots=[{"binding_id": "k@1", "abi_sha256": HEX, "engine_role": "decode"}])
    path = _write_unchecked(tmp_path, monkeypatch, m)
    assert_user_error(
        mcore("inspect", path), "kernel_slots[0] (binding k@1)", "engine role 'decode' does not exist", "roles: encoder"
    )
    from mcore.bundle.container import write_bundle

    with pytest.raises(UserError, match="engine role 'decode' does not exist"):
        write_bundle(tmp_path / "w.bundle", m, {})


@pytest.mark.parametrize(
    "extra,fragment",
    [
        ({"roles": []}, "field roles must be an object, got list"),
        ({"family": 3}, "field family must be a string, got int"),
        ({"family_kind": "vision"}, "family_kind 'vision' must be decoder or encoder"),
        (
            {"kernel_slots": [{"binding_id": 1, "abi_sha256": HEX, "engine_role": "encoder"}]},
            "kernel_slots[0]: field binding_id must be a string",
        ),
        ({"kernel_slots": ["x"]}, "kernel_slots[0] must be an object"),
        ({"weights": "all"}, "field weights must be an object"),
        ({"weights": {"kind": "pickle"}}, "weights.kind must be random"),
        ({"model": {"spec": 1, "revision": None}}, "field model needs spec"),
        ({"roles": {"encoder": {"fingerprint": HEX}}}, "roles.encoder needs fingerprint, inputs and outputs"),
    ],
)
def test_bundle_manifest_field_types(extra, fragment, tmp_path, monkeypatch, mcore):
    path = _write_unchecked(tmp_path, monkeypatch, _manifest(**extra))
    assert_user_error(mcore("inspect", path), "bad.bundle", fragment)


def test_a_bundle_lacking_a_field_is_named(tmp_path, monkeypatch, mcore):
    m = _manifest()
    del m["weights"]
    assert_user_error(mcore("inspect", _write_unchecked(tmp_path, monkeypatch, m)), "lacks field weights")


def test_inspect_shows_no_terminal_escapes(tmp_path, monkeypatch, mcore):
    m = _manifest(model={"spec": "demo\x1b]0;pwned\x07\x1b[2Jx", "revision": None})
    res = mcore("inspect", _write_unchecked(tmp_path, monkeypatch, m))
    assert res.code == 0, res
    assert "\x1b" not in res.out and "\x07" not in res.out
    assert "model=demo\\x1b]0;pwned\\x07\\x1b[2Jx" in res.out


def test_graph_views_show_no_terminal_escapes(tmp_path, mcore):
    # a snapshot is someone else's file: its names may carry escapes (its fingerprint made to match)
    from mcore.graph.snapshot import fingerprint

    src = tmp_path / "s.graph.json"
    assert mcore("graph", "inspect", "demo:distilbert-tiny", "--engine-role", "encoder", "--snapshot", src).code == 0
    snap = json.loads(src.read_text())
    node = snap["nodes"][3]
    node["name"], node["module_path"] = "x\x1b]0;pwned\x07y", "m\x1b[2J"
    snap["fingerprint"] = fingerprint(snap)
    bad = tmp_path / "bad.graph.json"
    bad.write_text(json.dumps(snap))
    for verb, extra in (("list", ()), ("tree", ()), ("show", (node["id"],))):
        res = mcore("graph", verb, bad, *extra)
        assert res.code == 0, res
        assert "\x1b" not in res.out and "\x07" not in res.out, verb
        assert "m\\x1b[2J" in res.out, verb
    assert "name: x\\x1b]0;pwned\\x07y" in mcore("graph", "show", bad, node["id"]).out


# ---------------------------------------------------------------- malformed inputs (items 3, 11, 12)


def test_deeply_nested_json_is_one_line(tmp_path, mcore):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    assert_user_error(mcore("graph", "list", deep), "deep.json", "nested too deeply")
    assert_user_error(mcore("verify", "embeddings", deep, deep), "deep.json", "nested too deeply")
    assert_user_error(mcore("verify", "tokens", deep, deep), "deep.json", "nested too deeply")


def test_a_fifo_as_input_does_not_hang(tmp_path, mcore):
    import os

    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)  # nobody writes it: opening it would block forever
    assert_user_error(mcore("graph", "list", fifo), "in.json", "not a regular file")
    assert_user_error(mcore("verify", "tokens", fifo, fifo), "not a regular file")
    assert_user_error(mcore("verify", "embeddings", fifo, fifo), "not a regular file")


# ---------------------------------------------------------------- disk full during run --output (item 5)


def test_run_output_on_a_full_disk_says_how_to_rerun(tmp_path, mcore, monkeypatch):
    import errno
    import os

    import mcore.common.fileio as fileio

    from .conftest import QWEN_ARGS

    bundle = tmp_path / "q.bundle"
    assert mcore("build", *QWEN_ARGS, "-o", bundle).code == 0

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    out = tmp_path / "out.jsonl"
    res = mcore("run", bundle, "--prompt", "hi", "--max-new-tokens", "2", "--greedy", "--output", out)
    assert_user_error(res, "out.jsonl: cannot write (No space left on device)", "rerun the same `mcore run`")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.bundle"]  # no output, no temp file
