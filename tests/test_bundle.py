"""The bundle container (DESIGN.md §6): round trip, atomic writes, every byte integrity-checked."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from mcore.bundle import container as bundle_mod
from mcore.bundle.container import BUNDLE_KIND, BUNDLE_SCHEMA_VERSION, open_bundle, write_bundle
from mcore.common.errors import Cancelled, UserError
from mcore.common.progress import CancelToken, Progress

from .conftest import assert_user_error


def manifest(**extra):
    m = {
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "kind": BUNDLE_KIND,
        "kernel_slots": [
            {"binding_id": "demo.copy@1", "abi_sha256": "a" * 64, "engine_role": "decode", "abi": {"inputs": []}}
        ],
        "build_args": {"model": "demo:qwen3-tiny"},
    }
    m.update(extra)
    return m


@pytest.fixture
def weights(tmp_path) -> Path:
    p = tmp_path / "src" / "weights.bin"
    p.parent.mkdir()
    p.write_bytes(bytes(range(256)) * 40 + b"tail")  # 10244 bytes: not a multiple of 512
    return p


@pytest.fixture
def small_bundle(tmp_path, weights) -> Path:
    out = tmp_path / "out" / "model.bundle"
    out.parent.mkdir()
    write_bundle(
        out, manifest(), {"graph/decode.pt2": b"\x00graph bytes\xff" * 7, "weights.bin": weights, "empty.txt": b""}
    )
    return out


def leftovers(folder: Path, keep: set[str] = frozenset()) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_round_trip(small_bundle, weights):
    b = open_bundle(small_bundle)
    assert b.path == small_bundle
    assert b.manifest == manifest()
    assert b.names() == ["graph/decode.pt2", "weights.bin", "empty.txt"]
    assert b.read("graph/decode.pt2") == b"\x00graph bytes\xff" * 7
    assert b.read("weights.bin") == weights.read_bytes()
    assert b.read("empty.txt") == b""
    assert b.size("weights.bin") == weights.stat().st_size
    assert json.loads(b.read("manifest.json")) == manifest()
    with pytest.raises(UserError, match="no member 'nope'"):
        b.read("nope")


def test_standard_tar_layout(small_bundle):
    with tarfile.open(small_bundle) as t:
        names = t.getnames()
    assert names == ["manifest.json", "graph/decode.pt2", "weights.bin", "empty.txt", "integrity.json"]
    with tarfile.open(small_bundle) as t:
        rec = json.load(t.extractfile("integrity.json"))
    assert [m["name"] for m in rec["members"]] == names[:-1]
    assert rec["prefix_bytes"] % 512 == 0


def test_deterministic(tmp_path, weights):
    a, b = tmp_path / "a.bundle", tmp_path / "b.bundle"
    for p in (a, b):
        write_bundle(p, manifest(), {"weights.bin": weights, "x": b"1"})
    assert a.read_bytes() == b.read_bytes()


def test_bytes_and_path_members_equal(tmp_path, weights):
    a, b = tmp_path / "a.bundle", tmp_path / "b.bundle"
    write_bundle(a, manifest(), {"weights.bin": weights})
    write_bundle(b, manifest(), {"weights.bin": weights.read_bytes()})
    assert a.read_bytes() == b.read_bytes()


def test_streams_in_chunks(tmp_path, weights, monkeypatch):
    """Members larger than a chunk are streamed and verified in several pieces."""
    monkeypatch.setattr(bundle_mod, "CHUNK", 1000)
    out = tmp_path / "c.bundle"
    write_bundle(out, manifest(), {"weights.bin": weights, "mem": b"z" * 3333})
    b = open_bundle(out)
    assert b.read("weights.bin") == weights.read_bytes()
    assert b.read("mem") == b"z" * 3333


def test_output_folder_must_exist(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        write_bundle(tmp_path / "nope" / "x.bundle", manifest(), {})


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/abs",
        "../up",
        "a/../../b",
        "a//b",
        ".",
        "a/./b",
        "sp ace",
        "manifest.json",
        "integrity.json",
        "x" * 101,
        "back\\slash",
        "é",
    ],
)
def test_bad_member_names(tmp_path, name):
    with pytest.raises(UserError, match="member name"):
        write_bundle(tmp_path / "x.bundle", manifest(), {name: b"1"})
    assert leftovers(tmp_path) == []


def test_missing_member_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        write_bundle(tmp_path / "x.bundle", manifest(), {"w": tmp_path / "missing.bin"})
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"kind": "other"}, "not an mcore bundle"),
        ({"schema_version": 2}, "schema_version 2"),
        ({"kernel_slots": {}}, "kernel_slots must be a list"),
    ],
)
def test_writer_checks_manifest(tmp_path, bad, match):
    with pytest.raises(UserError, match=match):
        write_bundle(tmp_path / "x.bundle", manifest(**bad), {})
    m = manifest()
    del m["kernel_slots"]
    with pytest.raises(UserError, match="kernel_slots"):
        write_bundle(tmp_path / "x.bundle", m, {})
    assert leftovers(tmp_path) == []


def test_atomic_when_writer_raises_midway(tmp_path, weights, monkeypatch):
    out = tmp_path / "x.bundle"
    calls = []

    def boom(step, fraction):
        calls.append(step)
        if step == "writing weights.bin" and fraction > 0.2:
            raise RuntimeError("disk on fire")

    monkeypatch.setattr(bundle_mod, "CHUNK", 1000)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_bundle(out, manifest(), {"a": b"x" * 100, "weights.bin": weights}, progress=Progress(boom))
    assert leftovers(tmp_path, {"src"}) == []


def test_atomic_keeps_previous_file_on_failure(tmp_path, weights, monkeypatch):
    out = tmp_path / "x.bundle"
    write_bundle(out, manifest(), {"a": b"old"})
    before = out.read_bytes()

    def boom(step, fraction):
        if fraction > 0.5:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        write_bundle(out, manifest(), {"weights.bin": weights}, progress=Progress(boom))
    assert out.read_bytes() == before
    assert leftovers(tmp_path, {"src"}) == ["x.bundle"]


def test_cancel_leaves_nothing(tmp_path, weights, monkeypatch):
    monkeypatch.setattr(bundle_mod, "CHUNK", 1000)
    token = CancelToken()
    seen = []

    def cb(step, fraction):
        seen.append(fraction)
        if fraction > 0.5:
            token.cancel()

    out = tmp_path / "x.bundle"
    with pytest.raises(Cancelled):
        write_bundle(out, manifest(), {"weights.bin": weights}, progress=Progress(cb, token))
    assert leftovers(tmp_path, {"src"}) == []
    assert seen and max(seen) < 1.0


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_a_member_file_that_changes_while_written_is_refused(tmp_path, weights, change):
    # the tar header already carries the planned size: a file that grows or shrinks after planning fails the build
    def cb(step, fraction):
        if step == "writing weights.bin" and weights.stat().st_size == 10244:
            if change == "grow":
                with open(weights, "ab") as f:
                    f.write(b"more")
            else:
                os.truncate(weights, 100)

    out = tmp_path / "x.bundle"
    with pytest.raises(UserError, match="file changed while it was being written into the bundle; run the build"):
        write_bundle(out, manifest(), {"weights.bin": weights}, progress=Progress(cb))
    assert leftovers(tmp_path, {"src"}) == []


def test_progress_reaches_one(tmp_path, weights):
    seen = []
    write_bundle(
        tmp_path / "x.bundle", manifest(), {"weights.bin": weights}, progress=Progress(lambda s, f: seen.append(f))
    )
    assert seen[-1] == 1.0 and seen == sorted(seen)
    seen.clear()
    open_bundle(tmp_path / "x.bundle", progress=Progress(lambda s, f: seen.append(f)))
    assert seen[-1] == 1.0


def test_cli_build_progress_climbs_once_through_the_weights(tmp_path, mcore, monkeypatch):
    """`mcore build` prints its progress as a user reads it: the percentages never go back (the writer's
    0..1 is the build's last stretch, not a second 0%) and no line repeats, however many chunks the
    weights stream in (8 MiB each: an 8B model's 16 GB printed some two thousand identical lines)."""
    monkeypatch.setattr(bundle_mod, "CHUNK", 4096)  # the demo's weights in hundreds of chunks
    res = mcore("build", "demo:qwen3-tiny", "--precision", "fp32", "-o", tmp_path / "n.bundle")
    assert res.code == 0, res.err
    lines = [l for l in res.err.splitlines() if l.startswith("[")]
    pcts = [int(l[1:4]) for l in lines]
    assert pcts == sorted(pcts), lines
    assert all(a != b for a, b in zip(lines[:-1], lines[1:], strict=True)), lines
    weights = [l for l in lines if l.endswith("writing weights.safetensors")]
    assert 2 <= len(weights) <= 21, weights  # whole percents within 80..99
    assert lines[-1] == "[100%] bundle written"


def test_file_mode_not_private(tmp_path):
    out = write_bundle(tmp_path / "x.bundle", manifest(), {})
    assert out.stat().st_mode & 0o044  # readable by group/others under the usual umask


def flipped_positions(size: int) -> list[int]:
    return sorted(set(range(0, size, 97)) | set(range(min(512, size))) | set(range(max(0, size - 512), size)))


def test_every_flipped_byte_is_detected(tmp_path, small_bundle):
    data = small_bundle.read_bytes()
    damaged = tmp_path / "damaged.bundle"
    positions = flipped_positions(len(data))
    assert len(positions) > 200
    for pos in positions:
        for flip in (0xFF, 0x01):
            buf = bytearray(data)
            buf[pos] ^= flip
            damaged.write_bytes(bytes(buf))
            with pytest.raises(UserError) as e:
                open_bundle(damaged)
            msg = str(e.value)
            assert msg.startswith(f"{damaged}: "), (pos, msg)
            assert "rebuild it with `mcore build`" in msg, (pos, msg)
            assert "\n" not in msg


def test_every_byte_of_a_tiny_bundle(tmp_path):
    out = tmp_path / "t.bundle"
    write_bundle(out, manifest(kernel_slots=[]), {"a": b"1"})
    data = out.read_bytes()
    for pos in range(len(data)):
        buf = bytearray(data)
        buf[pos] ^= 0x20
        out.write_bytes(bytes(buf))
        with pytest.raises(UserError, match="bundle is damaged|not an mcore bundle|schema_version"):
            open_bundle(out)


@pytest.mark.parametrize("cut", [0, 1, 511, 512, 1024, -1, -512, -1024, -1025, "half"])
def test_truncated(tmp_path, small_bundle, cut):
    data = small_bundle.read_bytes()
    n = len(data) // 2 if cut == "half" else (cut if cut >= 0 else len(data) + cut)
    small_bundle.write_bytes(data[:n])
    with pytest.raises(UserError, match=r"bundle is damaged" if n else r"not a bundle \(empty\)"):
        open_bundle(small_bundle)


def test_appended_bytes(small_bundle):
    with open(small_bundle, "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(UserError, match="bundle is damaged"):
        open_bundle(small_bundle)


@pytest.mark.parametrize("content", [b"hello, not a bundle\n", b"\0" * 4096])
def test_not_a_tar_is_damaged(tmp_path, content):
    p = tmp_path / "x.bundle"
    p.write_bytes(content)
    with pytest.raises(UserError, match="bundle is damaged"):
        open_bundle(p)


@pytest.mark.parametrize(
    "content,what",
    [
        (b"", "empty"),
        (json.dumps({"kind": "mcore.bundle"}).encode(), "a JSON file"),
        (b"\n  [1, 2]", "a JSON file"),
        (b"\x7fELF\x02\x01\x01" + b"\0" * 600, "an ELF file: a DSO goes in --kernel-bindings"),
    ],
)
def test_another_kind_of_file_is_named_not_called_damaged(tmp_path, mcore, content, what):
    # a receipt, snapshot or DSO given by mistake: no advice to rebuild a bundle that never was
    p = tmp_path / "x.bundle"
    p.write_bytes(content)
    with pytest.raises(UserError) as e:
        open_bundle(p)
    assert str(e.value) == f"{p}: not a bundle ({what}); give a bundle written by `mcore build`"
    assert_user_error(mcore("inspect", p), f"not a bundle ({what})")


def test_plain_tar_is_not_a_bundle(tmp_path):
    p = tmp_path / "x.tar"
    with tarfile.open(p, "w") as t:
        data = json.dumps(manifest()).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    with pytest.raises(UserError, match=r"bundle is damaged \(integrity record missing"):
        open_bundle(p)


def test_missing_member(tmp_path, small_bundle):
    """Re-pack the tar without one member but keep the original integrity record."""
    with tarfile.open(small_bundle) as t:
        infos = t.getmembers()
        contents = {i.name: t.extractfile(i).read() for i in infos}
    rebuilt = tmp_path / "rebuilt.bundle"
    with tarfile.open(rebuilt, "w", format=tarfile.PAX_FORMAT) as t:
        for i in infos:
            if i.name != "weights.bin":
                t.addfile(i, io.BytesIO(contents[i.name]))
    with pytest.raises(UserError, match="bundle is damaged"):
        open_bundle(rebuilt)


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(UserError, match="not found"):
        open_bundle(tmp_path / "nope.bundle")
    with pytest.raises(UserError, match="not a file"):
        open_bundle(tmp_path)


def _raw_bundle(tmp_path, monkeypatch, m) -> Path:
    """Write a well-formed container whose manifest fails the kind/schema checks."""
    monkeypatch.setattr(bundle_mod, "_check_manifest_shape", lambda manifest, where: None)
    out = tmp_path / "raw.bundle"
    write_bundle(out, m, {"a": b"1"})
    monkeypatch.undo()
    return out


def test_wrong_kind(tmp_path, monkeypatch):
    out = _raw_bundle(tmp_path, monkeypatch, manifest(kind="mcore.other"))
    with pytest.raises(UserError, match=r"not an mcore bundle \(manifest kind is 'mcore.other'"):
        open_bundle(out)


def test_wrong_schema(tmp_path, monkeypatch):
    out = _raw_bundle(tmp_path, monkeypatch, manifest(schema_version=2))
    with pytest.raises(UserError, match="schema_version 2 is not supported"):
        open_bundle(out)


def test_missing_kernel_slots(tmp_path, monkeypatch):
    m = manifest()
    del m["kernel_slots"]
    out = _raw_bundle(tmp_path, monkeypatch, m)
    with pytest.raises(UserError, match="lacks field 'kernel_slots'"):
        open_bundle(out)


def test_change_after_open_is_caught(small_bundle):
    b = open_bundle(small_bundle)
    data = bytearray(small_bundle.read_bytes())
    off = b._entries["weights.bin"].offset
    data[off + 3] ^= 1
    small_bundle.write_bytes(bytes(data))
    with pytest.raises(UserError, match="changed after the bundle was opened"):
        b.read("weights.bin")
    assert b.read("graph/decode.pt2")  # untouched members still read


def test_cli_style_error_is_one_line(tmp_path):
    p = tmp_path / "x.bundle"
    p.write_bytes(os.urandom(3000))
    with pytest.raises(UserError) as e:
        open_bundle(p)
    assert "\n" not in str(e.value)
