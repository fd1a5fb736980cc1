"""Pipelines reuse an ExportedProgram saved by an earlier load, but only one whose graph has the
bundle's fingerprint: a damaged or foreign cache file is captured over, never used."""

from __future__ import annotations

import pytest

from mcore.bundle.build import build_bundle
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline


@pytest.fixture()
def bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64)
    return build_bundle(args, tmp_path / "n.bundle").bundle_path, tmp_path / "cache" / "exported"


def test_second_load_uses_the_saved_program_and_damage_is_recaptured(bundle):
    path, folder = bundle
    first = DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens
    saved = sorted(folder.glob("*.pt2"))
    assert len(saved) == 2  # prefill and decode
    stamps = [p.stat().st_mtime_ns for p in saved]
    assert DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens == first
    assert [p.stat().st_mtime_ns for p in saved] == stamps  # read, not rewritten
    saved[0].write_bytes(b"not a program")  # damaged
    saved[1].write_bytes(saved[1].read_bytes())  # still valid
    assert DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens == first
    assert saved[0].stat().st_size > 1000  # captured again and replaced


def test_a_program_of_another_graph_is_not_used(bundle):
    path, folder = bundle
    first = DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens
    a, b = sorted(folder.glob("*.pt2"))
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)  # swap the roles' programs: each file now holds the other graph
    b.write_bytes(a_bytes)
    assert DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens == first
    assert a.read_bytes() == a_bytes and b.read_bytes() == b_bytes  # recaptured and put back


def test_a_process_deserializes_a_saved_program_once_and_each_caller_gets_its_own(bundle, monkeypatch):
    """The workbench loads the same role graphs for its native, kernel-bound and reference pipelines:
    a saved program is deserialized once a process, and each load hands out its own copy (the engines
    rewrite graphs in place), equal to the saved one."""
    import torch

    from mcore.graph.capture import capture_cached, program_sha256, resolve

    path, folder = bundle
    first = DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens  # saves both
    real, loads = torch.export.load, []
    monkeypatch.setattr(torch.export, "load", lambda f, *a, **k: loads.append(f) or real(f, *a, **k))
    pipes = [DecoderPipeline(str(path), device="cpu") for _ in range(2)]
    assert all(p.generate("abc", 6, stop_at_eos=False).tokens == first for p in pipes)
    assert sorted(loads) == sorted(map(str, folder.glob("*.pt2")))  # prefill and decode, once each

    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64)
    expected = pipes[0].snapshots["decode"].fingerprint
    a = capture_cached(args, "decode", expected, resolve(args))
    b = capture_cached(args, "decode", expected, resolve(args))
    assert a.exported is not b.exported and a.exported.graph_module is not b.exported.graph_module
    saved = program_sha256(a.exported)
    assert program_sha256(b.exported) == saved
    node = next(n for n in a.exported.graph.nodes if n.op == "call_function")
    with a.exported.graph.inserting_after(node):  # one caller's rewrite
        a.exported.graph.call_function(torch.ops.aten.clone.default, (node,))
    assert program_sha256(a.exported) != saved
    c = capture_cached(args, "decode", expected, resolve(args))
    assert program_sha256(c.exported) == saved and len(loads) == 2  # not seen by the next, not loaded again


def test_a_program_this_torch_cannot_copy_is_loaded_each_time(bundle, monkeypatch, capfd):
    """Where copying a loaded program fails (another torch's ExportedProgram), each load deserializes
    the file again: the same tokens, nothing captured afresh, no note."""
    import types

    import torch

    from mcore.graph import capture

    path, folder = bundle
    first = DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens
    capfd.readouterr()

    def refuse(_: object) -> object:
        raise TypeError("cannot copy this program")

    monkeypatch.setattr(capture, "copy", types.SimpleNamespace(deepcopy=refuse))
    real, loads = torch.export.load, []
    monkeypatch.setattr(torch.export, "load", lambda f, *a, **k: loads.append(f) or real(f, *a, **k))
    stamps = sorted(p.stat().st_mtime_ns for p in folder.glob("*.pt2"))
    for _ in range(2):
        assert DecoderPipeline(str(path), device="cpu").generate("abc", 6, stop_at_eos=False).tokens == first
    assert len(loads) == 4 and sorted(p.stat().st_mtime_ns for p in folder.glob("*.pt2")) == stamps
    out, err = capfd.readouterr()
    assert "capturing" not in out + err


def test_a_process_exports_a_role_graph_once_and_another_model_afresh(monkeypatch):
    """capture() of a graph this process exported before copies it (the workbench captures a graph to
    browse, then builds a bundle from it); other build arguments are exported afresh."""
    import torch

    from mcore.graph.capture import capture, program_sha256

    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=72)
    first = capture(args, "decode")
    real, exports = torch.export.export, []
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: exports.append(a) or real(*a, **k))
    again = capture(args, "decode")
    assert not exports and again.exported is not first.exported
    assert again.snapshot.fingerprint == first.snapshot.fingerprint
    assert program_sha256(again.exported) == program_sha256(first.exported)
    other = capture(BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=80), "decode")
    assert len(exports) == 1 and other.snapshot.fingerprint != first.snapshot.fingerprint
