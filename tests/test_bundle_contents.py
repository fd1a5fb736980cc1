"""A bundle's contents are type-checked at load like every other contract: a hand-made bundle whose
integrity record holds (it was written whole) but whose config, tokenizer, build args, weights or
slots are garbage is one line, exit 2, never a traceback or a run on the wrong model."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mcore.runtime.pipeline
from mcore.bundle.build import build_bundle
from mcore.bundle.container import open_bundle, write_bundle
from mcore.common.errors import UserError
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

from .conftest import assert_user_error
from .test_fuzz_contracts import FUZZ, mutated


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("contents")
    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64)
    return {
        "native": build_bundle(args, tmp / "n.bundle").bundle_path,
        "slot": build_bundle(
            args, tmp / "s.bundle", recipe=("qwen.decode_logits_copy@1", "decoder.logits_zero_bias")
        ).bundle_path,
        "other": build_bundle(args.with_(model="demo:qwen3-tiny-hd64"), tmp / "o.bundle").bundle_path,
    }


def remake(
    src: Path,
    out: Path,
    manifest: Callable[[dict], Any] | None = None,
    members: Callable[[dict], Any] | None = None,
) -> Path:
    """`src` rewritten whole (its integrity record holds) with its manifest or members changed."""
    b = open_bundle(src)
    m = copy.deepcopy(b.manifest)
    mem = {n: b.read(n) for n in b.names()}
    if manifest is not None:
        manifest(m)
    if members is not None:
        members(mem)
    out.unlink(missing_ok=True)
    return write_bundle(out, m, mem)


def _config(mem: dict, **changes: Any) -> None:
    mem["config.json"] = json.dumps({**json.loads(mem["config.json"]), **changes}).encode()


CASES: dict[str, tuple[Callable | None, Callable | None, str]] = {
    "config.json not JSON": (
        None,
        lambda mem: mem.update({"config.json": b"{garbage"}),
        "malformed JSON in config.json",
    ),
    "config.json a list": (None, lambda mem: mem.update({"config.json": b"[1]"}), "must be a JSON object"),
    "huge hidden_size": (None, lambda mem: _config(mem, hidden_size=10**12), "check its dimensions"),
    "tokenizer.json not text": (None, lambda mem: mem.update({"tokenizer.json": b"\xff\xfe"}), "not UTF-8"),
    "tokenizer.json garbage": (None, lambda mem: mem.update({"tokenizer.json": b"{}"}), "cannot load tokenizer"),
    "tokenizer_config not JSON": (
        None,
        lambda mem: mem.update({"tokenizer_config.json": b"{x"}),
        "malformed JSON in tokenizer_config.json",
    ),
    "weights not safetensors": (None, lambda mem: mem.update({"weights.safetensors": b"xxxx"}), "not a safetensors"),
    "max_cache_length x": (
        lambda m: m["build_args"].update(max_cache_length="x"),
        None,
        "max_cache_length must be an integer",
    ),
    "graph_args disagree": (
        lambda m: m["graph_args"].update(max_cache_length=63),
        None,
        "graph_args (max_cache_length)",
    ),
    "precision fp8": (lambda m: m["graph_args"].update(precision="fp8"), None, "graph_args (precision)"),
    "alias to nothing": (lambda m: m["weights"].update(aliases={"a": "nope"}), None, "names no stored tensor"),
    "huge seed": (lambda m: m.update(weights={"kind": "random", "seed": 10**30}), None, "weights.seed"),
    "eos not an id": (lambda m: m["special_tokens"].update(eos_token_id="x"), None, "special_tokens.eos_token_id"),
    "unknown family": (lambda m: m.update(family="gpt9"), None, "unknown model family 'gpt9'"),
    "family kind lies": (lambda m: m.update(family_kind="encoder"), None, "is not the qwen3 family's kind"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_garbage_inside_a_whole_bundle_is_one_line(case, bundles, tmp_path, mcore):
    manifest, members, says = CASES[case]
    bad = remake(bundles["native"], tmp_path / "bad.bundle", manifest, members)
    assert_user_error(mcore("run", bad, "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"), says)


def test_another_models_weights_are_refused(bundles, tmp_path, mcore):
    other = open_bundle(bundles["other"]).read("weights.safetensors")
    bad = remake(
        bundles["native"], tmp_path / "bad.bundle", members=lambda mem: mem.update({"weights.safetensors": other})
    )
    assert_user_error(
        mcore("run", bad, "--prompt", "hi", "--device", "cpu"), "the weights are not this model's", "embed_tokens"
    )


def test_inspect_refuses_a_family_this_mcore_does_not_know(bundles, tmp_path, mcore):
    bad = remake(bundles["native"], tmp_path / "bad.bundle", lambda m: m.update(family="gpt9"))
    assert_user_error(mcore("inspect", bad), "unknown model family 'gpt9'")
    assert mcore("inspect", bundles["native"]).code == 0


def test_slot_nodes_the_graph_lacks_are_refused(bundles, tmp_path, mcore):
    from mcore.kernels.shipped import build_kernel

    def nodes(m: dict) -> None:
        m["kernel_slots"][0]["node_ids"] = ["node:99999"]  # not covered by the slot's ABI hash

    bad = remake(bundles["slot"], tmp_path / "bad.bundle", nodes)
    build_kernel("identity-copy", tmp_path / "k.so", cuda="off")
    slot = open_bundle(bad).runnable().kernel_slots[0]
    entry = {"id": slot.binding_id, "abi_sha256": slot.abi_sha256, "library": "./k.so", "function": "run"}
    (tmp_path / "kb.json").write_text(json.dumps({"schema_version": 1, "bindings": [entry]}))
    res = mcore("run", bad, "--kernel-bindings", tmp_path / "kb.json", "--prompt", "hi", "--device", "cpu")
    assert res.code == 2 and "Traceback" not in res.err, res  # after the one native-code notice, one line:
    assert (
        res.err.strip()
        .splitlines()[-1]
        .endswith("names node:99999, which the decode graph lacks; rebuild it with `mcore build`")
    )


# ---------------------------------------------------------------- fuzz


class _Reached(Exception):
    """Every content check passed: the pipeline went on to capture the graph."""


MEMBERS = ("config.json", "tokenizer_config.json")
MANIFEST_FIELDS = ("build_args", "graph_args", "weights", "special_tokens", "family", "family_kind", "model")


@st.composite
def garbled(draw):
    """(member or manifest field, its mutated JSON bytes)."""
    b = open_bundle(_NATIVE[0])
    target = draw(st.sampled_from(MEMBERS + MANIFEST_FIELDS))
    doc = json.loads(b.read(target)) if target in MEMBERS else {"v": b.manifest.get(target)}
    return target, draw(mutated(doc))


_NATIVE: list[Path] = []


def test_fuzz_bundle_contents(bundles, tmp_path, monkeypatch):
    """Mutated config.json, tokenizer_config.json and manifest fields in a whole bundle: the pipeline
    either refuses them in one line or goes on to capture (where the fingerprint decides)."""
    _NATIVE[:] = [bundles["native"]]
    monkeypatch.setattr(mcore.runtime.pipeline, "capture_cached", lambda *a, **k: (_ for _ in ()).throw(_Reached()))
    monkeypatch.setattr(mcore.runtime.pipeline.DecoderPipeline, "_ready", lambda *a: None)

    @given(change=garbled())
    @FUZZ
    def check(change):
        target, data = change
        out = tmp_path / "f.bundle"
        if target in MEMBERS:
            remake(bundles["native"], out, members=lambda mem: mem.update({target: data}))
        else:
            try:
                value = json.loads(data)["v"]
            except (ValueError, RecursionError, KeyError, TypeError):
                return  # not a field value: the manifest parser's own fuzz covers bytes
            try:
                remake(bundles["native"], out, manifest=lambda m: m.update({target: value}))
            except UserError:
                return  # the writer refuses it (the container's shape check)
        try:
            DecoderPipeline(str(out), device="cpu")
        except UserError as e:
            assert "\n" not in str(e)
        except _Reached:
            pass

    check()
