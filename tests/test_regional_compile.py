"""Regional compilation and compiled code shared by structure (issue 32), on the CPU.

A 6-layer bf16 Qwen3 (the demo's width): its role graphs cut into regions, each distinct region
compiled once (the decode role in a helper process beside the prefill one's), must compute the
logits bit for bit as the whole-graph compile in one process does (bf16 is where a badly placed
cut would show: Inductor does not round a value it keeps in registers). A second
checkpoint of the same config (other weights, another folder) reuses the compiled roles without
capturing its graphs, and computes what its own weights give. The same for every decoder family on
the shared decoder (a 6-layer Llama's regions against its whole-graph compile; each family's structure
key), and the cache's records (docs/trust.md): keyed on structure, covering the whole regional file,
checked before anything is unpickled, a recorded graph that is not the fine-tune's never serving it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.engines.regions import plan_regions, unique_regions
from mcore.engines.structure import rebased, structure_key
from mcore.families import get_family
from mcore.families.demo import materialize
from mcore.families.graph_args import GraphArgs
from mcore.graph.snapshot import Snapshot, fingerprint
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

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
        folder = cache / "compiled"  # what the helper handed over: owner-only entries, its log gone
        assert not list(folder.glob("helper-*.log")) and len(list(folder.glob("*.role.json"))) == 2
        assert all(f.stat().st_mode & 0o077 == 0 for f in folder.iterdir()), sorted(folder.iterdir())
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
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    ref = _logits(plain)  # and both are the model: close to the op-by-op engine (other kernels)
    assert all(torch.allclose(x, y, atol=0.1, rtol=0.05) for x, y in zip(got, ref, strict=True))
    reloaded = _load(a, cache, monkeypatch)  # from the saved regions
    assert all(r.cached and "regions" in r.describe() for r in reloaded.runners.values())
    assert all(torch.equal(x, y) for x, y in zip(want, _logits(reloaded), strict=True))


def test_a_fine_tune_reuses_the_compiled_roles_without_capture(bundles, compiled_a, tmp_path, monkeypatch):
    import mcore.runtime.pipeline

    a, b = bundles
    shutil.copytree(compiled_a[0], tmp_path / "cache")
    captures: list = []
    real = mcore.runtime.pipeline.capture_cached
    monkeypatch.setattr(mcore.runtime.pipeline, "capture_cached", lambda *x, **k: captures.append(x) or real(*x, **k))
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
    assert all(torch.equal(x, y) for x, y in zip(_logits(fresh), _logits(tuned), strict=True))
    # B's weights, not A's
    assert not all(torch.equal(x, y) for x, y in zip(_logits(tuned), compiled_a[1], strict=True))
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
    gargs = GraphArgs("bf16", max_cache_length=64, decoder_engine_layout="split")
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
    assert structure_key(family, config, replace(gargs, max_cache_length=128), "decode") != key
    assert structure_key(family, config, gargs, "prefill") != key


# ---------------------------------------------------------------- every decoder family on the shared decoder

STRUCTURE_FAMILIES = ("qwen3", "llama", "mistral", "qwen2")


def _demo_config(family: str) -> dict:
    return json.loads((materialize(f"{family}-tiny") / "config.json").read_text())


@pytest.mark.parametrize("name", STRUCTURE_FAMILIES)
def test_every_decoder_family_keys_its_structure_on_what_builds_the_graph(name):
    """Family.structure is the shared decoder family's (the parsed dims): the key follows every
    field the graph is built from (eps, RoPE theta and scaling, layers, capacity) and no name field."""
    from mcore.families.decoder_family import DecoderFamily

    family = get_family(name)
    assert type(family).structure is DecoderFamily.structure
    config = _demo_config(name)
    gargs = GraphArgs("bf16", max_cache_length=64, decoder_engine_layout="split")
    key = structure_key(family, config, gargs, "decode")
    names = {"_name_or_path": "someone/ft", "transformers_version": "9.9", "_commit_hash": "abc", "use_cache": False}
    assert structure_key(family, {**config, **names, "torch_dtype": "bfloat16"}, gargs, "decode") == key
    changes = [{"rms_norm_eps": 1e-3}, {"rope_theta": 12345.0}, {"num_hidden_layers": 3}]
    if name == "llama":  # rope_scaling: its demo runs llama3 RoPE; another factor, linear or none differ
        changes += [
            {"rope_scaling": {**config["rope_scaling"], "factor": 16.0}},
            {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
            {"rope_scaling": None},
        ]
    else:  # these families run the default RoPE only: rope_scaling may only say so
        assert structure_key(family, {**config, "rope_scaling": {"rope_type": "default"}}, gargs, "decode") == key
    for change in changes:
        assert structure_key(family, {**config, **change}, gargs, "decode") != key, change
    assert structure_key(family, config, replace(gargs, max_cache_length=128), "decode") != key
    assert structure_key(family, config, gargs, "prefill") != key


def test_decoder_families_never_share_compiled_code_through_one_config():
    """One config.json that every decoder family reads keys four structures: on the shared decoder a
    Llama's compiled roles never serve a Mistral, a Qwen2 or a Qwen3, not even where two families
    parse it into the same dims (Llama and Mistral here); Qwen2's q/k/v bias and Qwen3's q/k norms
    show in the dims themselves."""
    config = {**_demo_config("qwen3"), "sliding_window": None}
    gargs = GraphArgs("bf16", max_cache_length=64, decoder_engine_layout="split")
    families = {name: get_family(name) for name in STRUCTURE_FAMILIES}
    dims = {name: f.structure(config) for name, f in families.items()}
    assert dims["llama"] == dims["mistral"]
    assert dims["qwen2"]["qkv_bias"] and dims["qwen3"]["qk_norm"] and not dims["llama"]["qk_norm"]
    for role in ("prefill", "decode"):
        keys = {structure_key(f, config, gargs, role) for f in families.values()}
        assert len(keys) == len(STRUCTURE_FAMILIES), role


@pytest.fixture(scope="module")
def llama_bundle(tmp_path_factory) -> Path:
    """A 6-layer bf16 Llama of the demo's width (llama3 RoPE, tied embeddings, GQA 8/2)."""
    root = tmp_path_factory.mktemp("regional-llama")
    src = materialize("llama-tiny")
    folder = root / "ckpt"
    folder.mkdir()
    config = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": LAYERS}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    args = BuildArgs(model=str(folder), weights="random", seed=3, precision="bf16", max_cache_length=64)
    return build_bundle(args, root / "llama.bundle", device="cpu").bundle_path


@pytest.mark.parametrize("name", ("llama", "mistral", "qwen2"))
def test_every_decoder_family_is_cut_into_repeating_two_layer_regions(name, llama_bundle, tmp_path):
    """The cut rule is generic: each family's 6-layer roles plan as the qwen3 ones do."""
    bundle = llama_bundle
    if name != "llama":
        src = materialize(f"{name}-tiny")
        folder = tmp_path / "ckpt"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**_demo_config(name), "num_hidden_layers": LAYERS}))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / f, folder / f)
        args = BuildArgs(model=str(folder), weights="random", precision="bf16", max_cache_length=64)
        bundle = build_bundle(args, tmp_path / "b.bundle", device="cpu").bundle_path
    plain = DecoderPipeline(str(bundle), device="cpu", engine="torch")
    for role in ("prefill", "decode"):
        plan = plan_regions(plain.runners[role].prepared.gm)
        assert plan is not None, role
        assert len(plan.modules) == 2 + LAYERS // 2 and len(set(unique_regions(plan.signatures))) == 4, plan.layers


def test_llama_regions_compute_the_whole_graph_bits(llama_bundle, tmp_path, monkeypatch):
    regional = _load(llama_bundle, tmp_path / "regional", monkeypatch)
    assert all("regions" in r.describe() for r in regional.runners.values()), regional.engine_lines()
    whole = _load(llama_bundle, tmp_path / "whole", monkeypatch, regional=False)
    assert not any("regions" in r.describe() for r in whole.runners.values())
    got, want = _logits(regional), _logits(whole)
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    ref = _logits(DecoderPipeline(str(llama_bundle), device="cpu", engine="torch"))
    assert all(torch.allclose(x, y, atol=0.1, rtol=0.05) for x, y in zip(got, ref, strict=True))


# ---------------------------------------------------------------- the cache's records (docs/trust.md)


@pytest.fixture()
def notes(monkeypatch) -> list[str]:
    from mcore.common import cache

    monkeypatch.setattr(cache, "_private", {})
    monkeypatch.setattr(cache, "_noted", set())
    seen: list[str] = []
    monkeypatch.setattr(cache, "_note_sink", seen.append)
    return seen


def _entries(folder: Path) -> dict[str, tuple[Path, dict]]:
    """role -> (its artifact, its record) in a compiled/ folder."""
    out = {}
    for record in folder.glob("*.role.json"):
        data = json.loads(record.read_text())
        out[data["made_from"]["engine_role"]] = (record.with_name(record.name.replace(".role.json", ".artifact")), data)
    return out


def _regions_in(artifact: Path) -> int:
    """How many distinct compiled regions a regional artifact file holds (its header's count)."""
    from mcore.engines.standalone import MAGIC

    raw = artifact.read_bytes()
    n = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 8], "little")
    return len(json.loads(raw[len(MAGIC) + 8 : len(MAGIC) + 8 + n])["sizes"])


def _spy_artifact_loads(monkeypatch) -> list:
    from torch._inductor import CompiledArtifact

    loads: list = []
    real = CompiledArtifact.load
    monkeypatch.setattr(CompiledArtifact, "load", staticmethod(lambda *a, **k: loads.append(k) or real(*a, **k)))
    return loads


def test_a_regional_artifact_is_one_file_under_its_record_keyed_on_structure(
    bundles, compiled_a, tmp_path, monkeypatch, notes
):
    """The record is made from the structure (no model fingerprint) and its sha256 covers the whole
    regional file: a byte changed inside one region is refused before any region is unpickled, and
    the role is compiled afresh with the same bits."""
    import hashlib

    from mcore.engines.standalone import MAGIC, is_regions

    cache_dir = tmp_path / "cache"
    shutil.copytree(compiled_a[0], cache_dir)
    entries = _entries(cache_dir / "compiled")
    assert set(entries) == {"prefill", "decode"}
    for artifact, data in entries.values():
        assert is_regions(artifact.read_bytes())
        assert "structure" in data["made_from"] and "fingerprint" not in data["made_from"]
        assert data["files"]["artifact"]["sha256"] == hashlib.sha256(artifact.read_bytes()).hexdigest()
    artifact = entries["decode"][0]
    raw = bytearray(artifact.read_bytes())
    header_end = len(MAGIC) + 8 + int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 8], "little")
    raw[header_end + len(raw[header_end:]) // 2] ^= 0xFF  # inside a region's Inductor artifact
    artifact.write_bytes(bytes(raw))
    loads = _spy_artifact_loads(monkeypatch)
    again = _load(bundles[0], cache_dir, monkeypatch)
    assert again.runners["prefill"].cached and not again.runners["decode"].cached
    assert len(loads) == _regions_in(entries["prefill"][0])  # prefill's only: decode's file was refused unread
    assert any("compiled decode graph" in n and "differs from its record (sha256)" in n for n in notes), notes
    assert all(torch.equal(x, y) for x, y in zip(compiled_a[1], _logits(again), strict=True))


def test_a_fine_tune_reuses_code_only_where_the_recorded_graph_is_its_own(
    bundles, compiled_a, tmp_path, monkeypatch, notes
):
    """A record of this structure, unedited and with its artifact's sha256, whose recorded graph is
    not B's (as a record another mcore wrote could be) does not serve B: its artifact stays unread
    and the role is captured and compiled."""
    import mcore.runtime.pipeline
    from mcore.common import cache
    from mcore.graph.snapshot import fingerprint

    cache_dir = tmp_path / "cache"
    shutil.copytree(compiled_a[0], cache_dir)
    record = next(r for r in (cache_dir / "compiled").glob("*.role.json") if '"engine_role": "decode"' in r.read_text())
    data = json.loads(record.read_text())
    data["snapshot"]["nodes"][3]["op"] = "aten.mul.Tensor"
    data["snapshot"]["fingerprint"] = fingerprint(data["snapshot"])
    data["record_sha256"] = cache._self_hash(data)
    record.write_text(json.dumps(data))
    captures: list = []
    real = mcore.runtime.pipeline.capture_cached
    monkeypatch.setattr(
        mcore.runtime.pipeline, "capture_cached", lambda *x, **k: captures.append(x[1]) or real(*x, **k)
    )
    loads = _spy_artifact_loads(monkeypatch)
    tuned = _load(bundles[1], cache_dir, monkeypatch)
    assert captures == ["decode"] and tuned.runners["prefill"].cached
    assert len(loads) == _regions_in(_entries(cache_dir / "compiled")["prefill"][0])  # decode's unread
    assert any("compiled decode graph" in n and "another fingerprint" in n for n in notes), notes
    assert tuned.snapshots["decode"].fingerprint == tuned.manifest.roles["decode"].fingerprint


def test_an_artifact_is_unpickled_only_from_the_bytes_checked_against_its_record(compiled_a, tmp_path, monkeypatch):
    """The record is checked on the file, then the file is read once more to be loaded: bytes changed
    in between, or the file swapped for a link to a good copy, are refused before any region is
    unpickled (cache.read_checked, the one check for every cache entry loaded with pickle)."""
    from mcore.common import cache
    from mcore.engines.compiled import _load_artifact

    cache_dir = tmp_path / "cache"
    shutil.copytree(compiled_a[0], cache_dir)
    artifact, data = _entries(cache_dir / "compiled")["decode"]
    record = artifact.with_name(artifact.name.replace(".artifact", ".role.json"))
    accepted, why = cache.read_entry(record, data["made_from"], {"artifact": artifact})
    assert accepted is not None and why is None
    loads = _spy_artifact_loads(monkeypatch)
    n = _regions_in(artifact)
    assert _load_artifact(artifact, accepted).describe() == f"{2 + LAYERS // 2} regions, {n} compiled"
    assert len(loads) == n
    good = artifact.read_bytes()
    artifact.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # after the record's check
    with pytest.raises(ValueError, match="differs from its record"):
        _load_artifact(artifact, accepted)
    copy = tmp_path / "copy.artifact"
    copy.write_bytes(good)
    artifact.unlink()
    artifact.symlink_to(copy)
    with pytest.raises(ValueError, match="cannot be read"):
        _load_artifact(artifact, accepted)
    assert len(loads) == n  # nothing more unpickled


def test_a_compiled_profile_says_it_compiled_whole_a_role_the_pipeline_cuts(bundles, monkeypatch):
    """Inductor's provenance covers one graph, so `mcore profile` compiles the role whole; where the
    pipeline would compile it by regions the profile's engine line says so, and how many."""
    from mcore.profile.profiler import profile_pipeline

    pipe = DecoderPipeline(str(bundles[0]), device="cpu", engine="torch")
    monkeypatch.setenv("MCORE_PRECOMPILED", "1")
    how = profile_pipeline(pipe, "decode", 8, 2, engine="compiled").engine.how
    assert f"in {2 + LAYERS // 2} regions (4 distinct; MCORE_REGIONAL=0 runs it whole)" in how, how
    monkeypatch.setenv("MCORE_REGIONAL", "0")  # the pipeline compiles it whole too: nothing to say
    assert "regions" not in profile_pipeline(pipe, "decode", 8, 2, engine="compiled").engine.how
    monkeypatch.setenv("MCORE_REGIONAL", "1")
    monkeypatch.setenv("MCORE_PRECOMPILED", "0")  # compiled through Dynamo, as one graph (the CPU default)
    assert "regions" not in profile_pipeline(pipe, "decode", 8, 2, engine="compiled").engine.how
