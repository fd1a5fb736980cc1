"""Fuzz every contract reader: mutate a valid file (a field replaced, removed or added; bytes cut
or flipped) and require exit 2 with one line and no traceback, or success; a failed command
leaves nothing at its output path. Small fixed budgets keep CI fast."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcore.common.errors import UserError

from .conftest import assert_user_error
from .graphs import dag_snapshot

# FUZZ_EXAMPLES=500 for a longer local hunt; CI keeps the small fixed budget
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=6)
    | st.sampled_from(["node:0", "tensor:1", "FP32", "decode", "encoder", "ab" * 32])
)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=5
)


def _slots(doc: Any, out: list) -> list:
    """Every (container, key) in a JSON tree."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((doc, k))
            _slots(v, out)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((doc, i))
            _slots(v, out)
    return out


@st.composite
def mutated(draw, doc: Any) -> bytes:
    """`doc` with one mutation, as file bytes."""
    d = copy.deepcopy(doc)
    how = draw(st.sampled_from(["replace", "replace", "delete", "add", "bytes", "deep"]))
    if how == "deep":
        return ("[" * 50000 + "]" * 50000).encode()
    if how == "bytes":
        raw = bytearray(json.dumps(doc).encode())
        i = draw(st.integers(0, len(raw) - 1))
        if draw(st.booleans()):
            return bytes(raw[:i])
        raw[i] = draw(st.integers(0, 255))
        return bytes(raw)
    container, key = draw(st.sampled_from(_slots(d, [])))
    if how == "replace":
        container[key] = draw(VALUES)
    elif how == "delete":
        del container[key]
    elif isinstance(container, dict):
        container[draw(st.text(min_size=1, max_size=5))] = draw(VALUES)
    else:
        container.append(draw(VALUES))
    return json.dumps(d, allow_nan=True).encode()


def one_line_or_ok(res, ok=(0,)) -> None:
    if res.code not in ok:
        assert_user_error(res)


# ---------------------------------------------------------------- snapshot and receipt

SNAP = dag_snapshot(3, [(0, 1), (1, 2)])


@given(data=mutated(SNAP))
@FUZZ
def test_fuzz_snapshot(data, tmp_path, mcore):
    src, out = tmp_path / "g.graph.json", tmp_path / "r.json"
    src.write_bytes(data)
    out.unlink(missing_ok=True)
    one_line_or_ok(mcore("graph", "list", src))
    res = mcore("graph", "select", src, "--nodes", "node:1", "--binding-id", "k@1", "--workspace-bytes", "0", "-o", out)
    one_line_or_ok(res)
    assert out.exists() == (res.code == 0)


def _receipt() -> dict:
    from mcore.selection.region import select_region

    return select_region(SNAP, ["node:1"], "k@1", 0, [], None).to_dict()


@given(data=mutated(_receipt()))
@FUZZ
def test_fuzz_receipt(data, tmp_path, mcore):
    snap, rec, out = tmp_path / "g.graph.json", tmp_path / "r.selection.json", tmp_path / "k.py"
    snap.write_text(json.dumps(SNAP))
    rec.write_bytes(data)
    out.unlink(missing_ok=True)
    res = mcore("kernel", "stub", rec, "--snapshot", snap, "-o", out)
    one_line_or_ok(res)
    assert out.exists() == (res.code == 0)


# ---------------------------------------------------------------- bindings manifest

MANIFEST = {
    "schema_version": 1,
    "bindings": [{"id": "k@1", "abi_sha256": "ab" * 32, "library": "./k.so", "function": "run"}],
}


@given(data=mutated(MANIFEST))
@FUZZ
def test_fuzz_bindings_manifest(data, tmp_path):
    from mcore.runtime.bindings import load_bindings_manifest

    path = tmp_path / "kb.json"
    path.write_bytes(data)
    try:
        load_bindings_manifest(path)
    except UserError as e:
        assert "\n" not in str(e) and str(path) in str(e)


# ---------------------------------------------------------------- bundle manifest


def _bundle_manifest() -> dict:
    from mcore.bundle.container import BUNDLE_KIND, BUNDLE_SCHEMA_VERSION

    return {
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "kind": BUNDLE_KIND,
        "engine": "torch",
        "family": "distilbert",
        "family_kind": "encoder",
        "model": {"spec": "demo:distilbert-tiny", "revision": None},
        "build_args": {"model": "demo:distilbert-tiny"},
        "graph_args": {"max_seq_length": 8},
        "weights": {"kind": "random", "seed": 0},
        "tool_versions": {"torch": "2.13.0"},
        "roles": {"encoder": {"fingerprint": "ab" * 32, "inputs": ["input_ids"], "outputs": ["hidden"]}},
        "kernel_slots": [
            {
                "binding_id": "k@1",
                "abi_sha256": "ab" * 32,
                "engine_role": "encoder",
                "abi": {"inputs": [], "outputs": []},
            }
        ],
    }


@given(data=mutated(_bundle_manifest()))
@FUZZ
def test_fuzz_bundle_manifest(data, tmp_path, mcore, monkeypatch):
    import mcore.bundle.container as bundle

    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        manifest = None
    path = tmp_path / "b.bundle"
    path.unlink(missing_ok=True)
    if isinstance(manifest, dict):  # a bundle whose integrity holds but whose manifest is bad
        with monkeypatch.context() as m:
            m.setattr(bundle, "_check_manifest_shape", lambda *a: None)
            try:
                bundle.write_bundle(path, manifest, {"x": b"1"})
            except UserError:  # not writable as JSON (NaN): the writer refuses, nothing to read
                assert not path.exists()
                return
    else:  # bytes that are not a bundle at all
        path.write_bytes(data)
    one_line_or_ok(mcore("inspect", path))
    one_line_or_ok(mcore("inspect", path, "--json"))


def test_fuzz_bundle_bytes(tmp_path, mcore):
    """Cut or flipped bundle bytes: the integrity check names the damage."""
    from mcore.bundle.container import write_bundle

    good = write_bundle(tmp_path / "good.bundle", _bundle_manifest(), {"x": b"1" * 3000}).read_bytes()

    @given(i=st.integers(0, len(good) - 1), b=st.integers(0, 255), cut=st.booleans())
    @FUZZ
    def check(i, b, cut):
        bad = bytearray(good)
        if cut:
            del bad[i:]
        else:
            bad[i] = b
        path = tmp_path / "bad.bundle"
        path.write_bytes(bytes(bad))
        one_line_or_ok(mcore("inspect", path))

    check()


# ---------------------------------------------------------------- session


def _session() -> dict:
    from workbench.session import Session

    s = Session.new("fuzz", device="cpu")
    s.record(
        "list_recipes",
        {"snapshot": "missing.graph.json"},
        error="missing.graph.json: graph snapshot not found; check the path",
    )
    s.record(
        "gate_tokens",
        {"native": "a.jsonl", "external": "b.jsonl"},
        error="a.jsonl: token records not found; write them with `mcore run --output`",
    )
    return s.to_dict()


@given(data=mutated(_session()))
@FUZZ
def test_fuzz_session(data, tmp_path, workbench):
    path, wd = tmp_path / "s.json", tmp_path / "wd"
    path.write_bytes(data)
    shutil.rmtree(wd, ignore_errors=True)
    res = workbench("replay", path, "--headless", "--workdir", wd)
    one_line_or_ok(res, ok=(0, 1))
    if res.code == 2:
        assert not wd.exists()  # refused before anything ran


# ---------------------------------------------------------------- config.json


def _config() -> dict:
    from mcore.families.demo import materialize

    return json.loads((Path(materialize("qwen3-tiny")) / "config.json").read_text())


@given(data=mutated(_config()))
@FUZZ
def test_fuzz_config(data, tmp_path):
    from mcore.graph.capture import resolve
    from mcore.model.buildargs import BuildArgs

    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_bytes(data)
    try:
        resolve(BuildArgs(model=str(tmp_path / "m"), max_cache_length=64))
    except UserError as e:
        assert "\n" not in str(e)
