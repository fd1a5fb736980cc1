"""The caches under $MCORE_CACHE_DIR hold code (pickled programs and compiled artifacts): a folder
that someone else could write is not used, and an entry is used only when its record (what it was
made from, the sha256 of its files) holds, checked before anything is unpickled (docs/trust.md)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.common import cache
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

from .checkpoints import make_qwen3_checkpoint
from .conftest import repo_env

PROMPT = "the quick brown fox"


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_private", {})
    monkeypatch.setattr(cache, "_noted", set())
    notes: list[str] = []
    monkeypatch.setattr(cache, "_note_sink", notes.append)
    return tmp_path / "cache", notes


# ---------------------------------------------------------------- folders


def test_cache_folders_are_created_owner_only(fresh_cache):
    root, notes = fresh_cache
    folder = cache.cache_dir("exported")
    assert folder == root / "exported"
    for p in (root, folder):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700
    cache.write_private(folder / "x.bin", lambda p: p.write_bytes(b"abc"))
    assert stat.S_IMODE((folder / "x.bin").stat().st_mode) == 0o600 and notes == []


@pytest.mark.parametrize("how", ["group-writable", "world-writable root", "symlink", "another owner"])
def test_an_unsafe_cache_folder_is_not_used(fresh_cache, tmp_path, monkeypatch, how):
    root, notes = fresh_cache
    root.mkdir(mode=0o700)
    if how == "group-writable":
        (root / "compiled").mkdir(mode=0o700)
        os.chmod(root / "compiled", 0o770)
    elif how == "world-writable root":
        os.chmod(root, 0o777)
    elif how == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        (root / "compiled").symlink_to(tmp_path / "elsewhere")
    else:
        (root / "compiled").mkdir(mode=0o700)
        real = os.geteuid()
        monkeypatch.setattr(cache, "_uid", lambda: real + 4242)  # as if another user had made it
        monkeypatch.setattr(os, "lstat", _owned_by_other(root / "compiled", real + 1))
    folder = cache.cache_dir("compiled")
    assert root not in folder.parents and folder != root / "compiled"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and not os.listdir(folder)
    assert cache.cache_dir("compiled") == folder  # one private folder for the process
    (line,) = notes
    fix = {"group-writable": "chmod go-w", "world-writable root": "chmod go-w", "symlink": "symbolic link"}
    assert fix.get(how, "owned by uid") in line and "private fresh folder" in line


def _owned_by_other(target: Path, uid: int):
    real_lstat = os.lstat

    def lstat(p, *a, **kw):
        st = real_lstat(p, *a, **kw)
        if Path(p) == target:
            fields = list(st)
            fields[stat.ST_UID] = uid
            return os.stat_result(fields)
        return st

    return lstat


def test_inductor_cache_lives_under_mcore_cache_dir_even_after_torch_set_its_default(tmp_path):
    """Importing torch._inductor.config sets TORCHINDUCTOR_CACHE_DIR to /tmp/torchinductor_$USER before
    mcore runs; the compiled engine still puts Inductor's cache under $MCORE_CACHE_DIR, owner-only."""
    code = (
        "import os, torch._inductor.config\n"
        "from mcore.engines.compiled import CompiledEngine\n"
        "CompiledEngine()\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    )
    env = repo_env(MCORE_CACHE_DIR=str(tmp_path / "c"))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "c" / "inductor")
    assert stat.S_IMODE((tmp_path / "c" / "inductor").stat().st_mode) == 0o700


def test_a_chosen_inductor_folder_that_others_can_write_is_refused(tmp_path, mcore, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    from mcore.common.errors import UserError
    from mcore.engines.compiled import CompiledEngine

    with pytest.raises(UserError, match=r"TORCHINDUCTOR_CACHE_DIR .* writable by group or others.*chmod go-w"):
        CompiledEngine()


# ---------------------------------------------------------------- exported programs


@pytest.fixture(scope="module")
def eps_bundles(tmp_path_factory):
    """Bundles of two checkpoints that differ only in rms_norm_eps: their graphs have the same nodes
    and tensors (a snapshot does not hold scalar arguments), so only the whole-graph record tells
    one's captured program from the other's."""
    tmp = tmp_path_factory.mktemp("eps")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCORE_CACHE_DIR", str(tmp / "build-cache"))
        for name, eps in (("a", 1e-6), ("b", 1.0)):
            ckpt = make_qwen3_checkpoint(tmp / f"ckpt-{name}", rms_norm_eps=eps)
            args = BuildArgs(model=str(ckpt), precision="fp32", max_cache_length=64)
            out[name] = str(build_bundle(args, tmp / f"{name}.bundle").bundle_path)
    return out


@pytest.fixture()
def two_eps(eps_bundles, fresh_cache):
    return eps_bundles, fresh_cache[0] / "exported", fresh_cache[1]


def _logits(bundle: str) -> list[torch.Tensor]:
    pipe = DecoderPipeline(bundle, device="cpu")
    r = pipe.generate(PROMPT, 4, stop_at_eos=False)
    return pipe.step_logits(r.prompt_tokens, r.tokens[:-1])


def _spy_loads(monkeypatch) -> list:
    loads: list = []
    real_load = torch.export.load
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    return loads


def _pairs(folder: Path, bundles: dict[str, str]) -> list[tuple[Path, Path]]:
    """(a's program, b's program of the same role) for both roles."""
    from mcore.bundle.container import open_bundle

    roles = {k: open_bundle(b).runnable().roles for k, b in bundles.items()}

    def program(k: str, role: str) -> Path:  # a program is saved under its graph's fingerprint
        (p,) = folder.glob(f"{roles[k][role].fingerprint}-*.pt2")
        return p

    return [(program("a", r), program("b", r)) for r in ("prefill", "decode")]


def test_a_cached_program_edited_inside_is_not_used(two_eps, monkeypatch):
    bundles, folder, notes = two_eps
    want = _logits(bundles["a"])
    other = _logits(bundles["b"])
    assert not all(torch.equal(x, y) for x, y in zip(want, other, strict=True))  # the eps matters
    pairs = _pairs(folder, bundles)
    for a, b in pairs:  # prefill onto prefill, decode onto decode: same shapes, another eps
        shutil.copyfile(b, a)
    loads = _spy_loads(monkeypatch)
    got = _logits(bundles["a"])
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    assert loads == []  # refused on its sha256, before anything was unpickled
    assert len([n for n in notes if "differs from its record (sha256)" in n and "capturing afresh" in n]) == 2
    # an entry copied whole (program and record) from the other model says it was made from another graph
    for a, b in pairs:
        shutil.copyfile(b, a)
        shutil.copyfile(b.with_suffix(".json"), a.with_suffix(".json"))
    got = _logits(bundles["a"])
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True)) and loads == []
    assert any("made from another fingerprint" in n for n in notes)
    _logits(bundles["a"])
    assert len(loads) == 2  # rewritten whole: the next load uses them


def test_an_edited_record_or_program_in_an_unsafe_folder_is_never_loaded(two_eps, monkeypatch):
    bundles, folder, notes = two_eps
    want = _logits(bundles["a"])
    record = sorted(folder.glob("*.json"))[0]
    data = json.loads(record.read_text())
    data["made_from"]["engine_role"] = "x"  # edited without its own hash
    record.write_text(json.dumps(data))
    os.chmod(folder, 0o777)
    loads = _spy_loads(monkeypatch)
    got = _logits(bundles["a"])
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True)) and loads == []
    assert any("writable by group or others" in n for n in notes)
    os.chmod(folder, 0o700)
    monkeypatch.setattr(cache, "_private", {})
    assert all(torch.equal(x, y) for x, y in zip(want, _logits(bundles["a"]), strict=True))
    assert any("was edited (its own hash differs)" in n for n in notes) and len(loads) == 1


# ---------------------------------------------------------------- on the GPU (the CUDA default: precompiled roles)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_precompiled_entries_are_checked_and_inductor_caches_under_mcore(tmp_path, monkeypatch):
    """The CUDA default path: both roles precompiled with records; a reload uses them; the prefill
    artifact copied over decode's is refused before unpickling (compiled afresh, same tokens); and
    Inductor's own cache fills $MCORE_CACHE_DIR/inductor, not /tmp/torchinductor_$USER."""
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # an earlier test's engine set it
    monkeypatch.setattr(cache, "_private", {})
    notes: list[str] = []
    monkeypatch.setattr(cache, "_note_sink", notes.append)
    bundle = build_bundle(
        BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=128), tmp_path / "n.bundle"
    ).bundle_path
    first = DecoderPipeline(str(bundle), device="cuda")
    want = first.generate(PROMPT, 12, stop_at_eos=False).tokens
    art = {r: first.runners[r].artifact for r in ("prefill", "decode")}
    assert all(a is not None and a.with_name(a.name.replace(".artifact", ".role.json")).is_file() for a in art.values())
    again = DecoderPipeline(str(bundle), device="cuda")
    assert all("precompiled artifact" in r.describe() and r.cached for r in again.runners.values()) and notes == []
    assert again.generate(PROMPT, 12, stop_at_eos=False).tokens == want
    shutil.copyfile(art["prefill"], art["decode"])
    third = DecoderPipeline(str(bundle), device="cuda")
    assert third.generate(PROMPT, 12, stop_at_eos=False).tokens == want
    assert any("decode" in n and "differs from its record (sha256)" in n for n in notes), notes
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "inductor")
    assert any((tmp_path / "cache" / "inductor").iterdir())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_a_kernel_without_the_workspace_argument_is_one_line_on_the_compiled_engine(tmp_path):
    """On the CUDA default (precompiled, CUDA-graph replay) the first call of a kernel that does not
    take the slot's workspace is the one-line error naming the slot's call, not tvm_ffi's TypeError."""
    from mcore.common.errors import UserError
    from mcore.kernels.shipped import build_kernel

    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64)
    res = build_bundle(
        args,
        tmp_path / "s.bundle",
        recipe=("qwen.decode_logits_copy@1", "decoder.logits_zero_bias"),
        workspace_bytes=16,
    )
    build_kernel("identity-copy", tmp_path / "k.so", cuda="on")
    entry = {"id": res.receipt.binding_id, "abi_sha256": res.receipt.abi_sha256, "library": "./k.so", "function": "run"}
    (tmp_path / "kb.json").write_text(json.dumps({"schema_version": 1, "bindings": [entry]}))
    with pytest.raises(UserError, match=r"does not take the slot's call run\(input0, workspace, output0\)"):
        DecoderPipeline(str(res.bundle_path), kernel_bindings=str(tmp_path / "kb.json"), device="cuda")
