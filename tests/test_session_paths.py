"""Path fields of a session are someone else's data: a NUL byte, an over-long path or part, or text
that is no file name is one line (exit 2) before anything runs, never an OS call's traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.session import Session

from .test_fuzz_contracts import FUZZ, one_line_or_ok


def _session(action: str, params: dict) -> dict:
    s = Session.new("paths", device="cpu")
    s.record(action, params, error="recorded")
    return s.to_dict()


def _params(field: str, value: str) -> tuple[str, dict]:
    """An action with `value` in its path field `field` (the others valid)."""
    if field == "model":
        return "capture_graph", {"build_args": {"model": value}, "engine_role": "decode", "snapshot": "d.json"}
    if field == "checkpoint":
        return "verify_reference", {"bundle": "n.bundle", "checkpoint": value, "prompt": "hi"}
    if field in ("native", "external"):
        other = "external" if field == "native" else "native"
        return "gate_tokens", {field: value, other: "b.jsonl"}
    return "list_recipes", {"snapshot": value}


BAD = {
    "a NUL byte": ("a\0b.json", "contains a NUL byte"),
    "5000 bytes": ("a" * 5000, "path is too long (5000 bytes"),
    "a 300-byte part": ("x/" + "b" * 300, "path is too long"),
    "a lone surrogate": ("a\ud800.json", "is not a valid file name"),
}


@pytest.mark.parametrize("field", ["snapshot", "native", "external", "model", "checkpoint"])
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_path_field_is_one_line_before_anything_runs(field, case, tmp_path, workbench):
    value, says = BAD[case]
    action, params = _params(field, value)
    path, wd = tmp_path / "s.json", tmp_path / "wd"
    path.write_text(json.dumps(_session(action, params)))
    res = workbench("replay", path, "--headless", "--workdir", wd)
    assert res.code == 2 and "Traceback" not in res.err, res
    line = res.err.strip()
    assert "\n" not in line and f"field {'build_args.' if field == 'model' else ''}{field}" in line and says in line
    assert not wd.exists()


def test_a_bad_library_in_a_bindings_manifest_is_one_line(tmp_path, mcore):
    (tmp_path / "kb.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": "k@1", "abi_sha256": "ab" * 32, "library": "./" + "k" * 5000, "function": "run"}],
            }
        )
    )
    from .conftest import assert_user_error

    assert_user_error(mcore("run", tmp_path / "x.bundle", "--prompt", "hi", "--kernel-bindings", tmp_path / "kb.json"))


def test_an_over_long_path_on_the_command_line_is_one_line(mcore):
    from .conftest import assert_user_error

    long = "a" * 5000
    for args in (("graph", "list", long), ("inspect", long), ("verify", "tokens", long, long)):
        assert_user_error(mcore(*args), "File name too long")


# ---------------------------------------------------------------- fuzz

PATH_TEXT = st.lists(
    st.sampled_from(["a", "/", ".", "..", "\0", "\ud800", "\udcff", "é", " ", "~", "\n", "b" * 120, "c" * 2000]),
    min_size=1,
    max_size=12,
).map("".join)


@given(field=st.sampled_from(["snapshot", "native", "external", "model", "checkpoint"]), value=PATH_TEXT)
@FUZZ
def test_fuzz_session_path_fields(field, value, tmp_path, workbench):
    action, params = _params(field, value)
    path, wd = tmp_path / "s.json", tmp_path / "wd"
    shutil.rmtree(wd, ignore_errors=True)
    path.write_text(json.dumps(_session(action, params)))
    res = workbench("replay", path, "--headless", "--workdir", wd)
    one_line_or_ok(res, ok=(0, 1))
    if res.code == 2:
        assert not wd.exists()  # refused before anything ran
