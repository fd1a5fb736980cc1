"""Regional compilation and compiled code shared by structure (issue 32), on the CPU.

A 6-layer bf16 Qwen3 (the demo's width): its role graphs cut into regions, each distinct region
compiled once (the decode role in a helper process beside the prefill one's), must compute the
logits bit for bit as the whole-graph compile in one process does (bf16 is where a badly placed
cut would show: Inductor does not round a value it keeps in registers). A second
checkpoint of the same config (other weights, another folder) reuses the compiled roles without
capturing its graphs, and computes what its own weights give.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mcore.build import build_bundle
from mcore.buildargs import BuildArgs
from mcore.engines.regions import plan_regions, unique_regions
from mcore.engines.structure import rebased, structure_key
from mcore.families import get_family
from mcore.families.demo import materialize
from mcore.graph.snapshot import Snapshot, fingerprint
from mcore.pipeline import DecoderPipeline

LAYERS = 6


def _checkpoint(folder: Path, extra: dict) -> Path:
    src = materialize("qwen3-tiny")
    folder.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": LAYERS, **extra}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path]:
    """A and its fine-tune B: the same architecture, other weights, B's config naming its origin
    and a field the family never reads."""
    root = tmp_path_factory.mktemp("regional")
    out = []
    for name, seed, extra in (("a", 0, {}), ("b", 7, {"_name_or_path": "someone/ft", "use_cache": False})):
        folder = _checkpoint(root / f"ckpt-{name}", extra)
        args = BuildArgs(model=str(folder), weights="random", seed=seed, precision="bf16", max_cache_length=64)
        out.append(build_bundle(args, root / f"{name}.bundle", device="cpu").bundle_path)
    return out[0], out[1]


def _logits(pipe: DecoderPipeline) -> list[torch.Tensor]:
    """A prompt of many tokens and of one, each followed by forced decode steps."""
    ids = pipe.encode("the quick brown fox jumps over the lazy dog")
    return pipe.step_logits(ids, [5, 9, 200, 31]) + pipe.step_logits(ids[:1], [17, 3])


def _load(
    bundle: Path, cache: Path, mp: pytest.MonkeyPatch, regional: bool = True, helper: bool = False
) -> DecoderPipeline:
    mp.setenv("MCORE_CACHE_DIR", str(cache))
    mp.setenv("MCORE_PRECOMPILED", "1")
    mp.setenv("MCORE_REGIONAL", "1" if regional else "0")
    mp.setenv("MCORE_PARALLEL_ROLES", "1" if helper else "0")
    return DecoderPipeline(str(bundle), device="cpu", engine="compiled")


@pytest.fixture(scope="module")
def compiled_a(bundles, tmp_path_factory) -> tuple[Path, list[torch.Tensor]]:
    """A compiled by regions into a cache (its folder), the decode role by a helper process while
    this one compiled prefill (as on CUDA by default), and its logits."""
    cache = tmp_path_factory.mktemp("regional-cache")
    with pytest.MonkeyPatch.context() as mp:
        pipe = _load(bundles[0], cache, mp, helper=True)
        assert all("regions" in r.describe() for r in pipe.runners.values()), pipe.engine_lines()
        assert [r.compiled_beside for r in pipe.runners.values()] == [False, True]  # prefill here, decode beside
        return cache, _logits(pipe)


def test_regions_repeat_and_compute_the_whole_graph_bits(bundles, compiled_a, tmp_path, monkeypatch):
    a, _ = bundles
    cache, got = compiled_a
    plain = DecoderPipeline(str(a), device="cpu", engine="torch")
    for role in ("prefill", "decode"):
        plan = plan_regions(plain.runners[role].prepared.gm)
        assert plan is not None, role
        first = unique_regions(plan.signatures)
        # the head, then two-layer regions that share one compiled region, then the tail
        assert len(plan.modules) == 2 + LAYERS // 2 and len(set(first)) == 4, (role, plan.layers)
    whole = _load(a, tmp_path / "whole", monkeypatch, regional=False)
    assert not any("regions" in r.describe() for r in whole.runners.values())
    want = _logits(whole)
    assert all(torch.equal(x, y) for x, y in zip(want, got))
    ref = _logits(plain)  # and both are the model: close to the op-by-op engine (other kernels)
    assert all(torch.allclose(x, y, atol=0.1, rtol=0.05) for x, y in zip(got, ref))
    reloaded = _load(a, cache, monkeypatch)  # from the saved regions
    assert all(r.cached and "regions" in r.describe() for r in reloaded.runners.values())
    assert all(torch.equal(x, y) for x, y in zip(want, _logits(reloaded)))


def test_a_fine_tune_reuses_the_compiled_roles_without_capture(bundles, compiled_a, tmp_path, monkeypatch):
    import mcore.pipeline

    a, b = bundles
    shutil.copytree(compiled_a[0], tmp_path / "cache")
    captures: list = []
    real = mcore.pipeline.capture_cached
    monkeypatch.setattr(mcore.pipeline, "capture_cached", lambda *x, **k: captures.append(x) or real(*x, **k))
    tuned = _load(b, tmp_path / "cache", monkeypatch)
    assert captures == [] and all(r.cached for r in tuned.runners.values())
    manifest = tuned.manifest
    # B's own graph identity (its metadata, its fingerprint), recorded from A's capture
    assert {r: s.fingerprint for r, s in tuned.snapshots.items()} == {
        r: manifest.roles[r].fingerprint for r in manifest.roles
    }
    assert tuned.snapshots["decode"].metadata["model"] == manifest.model.spec and "ckpt-b" in manifest.model.spec
    # B loaded as if alone (captured, compiled into an empty mcore cache): the same snapshots and bits
    fresh = _load(b, tmp_path / "fresh", monkeypatch)
    assert len(captures) == 2 and not any(r.cached for r in fresh.runners.values())
    assert all(tuned.snapshots[r].to_dict() == fresh.snapshots[r].to_dict() for r in manifest.roles)
    assert all(torch.equal(x, y) for x, y in zip(_logits(fresh), _logits(tuned)))
    assert not all(torch.equal(x, y) for x, y in zip(_logits(tuned), compiled_a[1]))  # B's weights, not A's
    # a recorded graph that differs in one node serves no other model
    other = fresh.snapshots["decode"].to_dict()
    other["nodes"][3]["op"] = "aten.mul.Tensor"
    other["fingerprint"] = fingerprint(other)
    assert (
        rebased(
            Snapshot.from_dict(other, "test"), tuned.snapshots["decode"].metadata, manifest.roles["decode"].fingerprint
        )
        is None
    )


def test_structure_key_covers_what_builds_the_graph_and_nothing_else():
    family = get_family("qwen3")
    config = json.loads((materialize("qwen3-tiny") / "config.json").read_text())
    gargs = {"precision": "bf16", "max_cache_length": 64, "decoder_engine_layout": "split"}
    key = structure_key(family, config, gargs, "decode")
    same = {
        **config,
        "_name_or_path": "x/y",
        "transformers_version": "9.9",
        "use_cache": False,
        "torch_dtype": "float32",
    }
    assert structure_key(family, same, gargs, "decode") == key
    for change in ({"rms_norm_eps": 1e-5}, {"rope_theta": 5e5}, {"num_hidden_layers": 3}, {"vocab_size": 500}):
        assert structure_key(family, {**config, **change}, gargs, "decode") != key, change
    assert structure_key(family, config, {**gargs, "max_cache_length": 128}, "decode") != key
    assert structure_key(family, config, gargs, "prefill") != key
