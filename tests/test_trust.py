"""Fail closed: a replayed session stays inside its workdir and loads native code only when trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mcore.common.errors import UserError
from workbench.actions import ActionContext
from workbench.session import Session

from .conftest import assert_user_error

HEX = "ab" * 32


def session_with(action: str, params: dict, results: dict | None = None) -> Session:
    s = Session.new("trust test", device="cpu")
    s.record(action, params, results or {})
    return s


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("snapshot", "/etc/passwd", "absolute path"),
        ("snapshot", "~/decode.graph.json", "absolute path"),
        ("snapshot", "../outside.graph.json", "leaves the workdir"),
        ("snapshot", "a/../../outside.graph.json", "leaves the workdir"),
    ],
)
def test_session_paths_outside_the_workdir_are_refused(field, value, fragment, tmp_path, workbench):
    path = session_with("list_recipes", {field: value}).save(tmp_path / "s.json")
    wd = tmp_path / "wd"
    res = workbench("replay", path, "--headless", "--workdir", wd)
    assert_user_error(res, "step 1 (list_recipes)", f"field {field}", fragment)
    assert not wd.exists()  # nothing ran


def test_every_path_field_is_confined(tmp_path, workbench):
    s = Session.new("trust test", device="cpu")
    s.record("gate_tokens", {"native": "native.jsonl", "external": "../../x.jsonl"}, {"passed": True})
    path = s.save(tmp_path / "s.json")
    assert_user_error(
        workbench("replay", path, "--headless", "--workdir", tmp_path / "wd"),
        "step 1 (gate_tokens)",
        "field external",
        "leaves the workdir",
    )
    s = session_with("build_bundle", {"build_args": {"model": "/models/qwen"}, "output": "x.bundle"})
    path = s.save(tmp_path / "s2.json")
    assert_user_error(
        workbench("replay", path, "--headless", "--workdir", tmp_path / "wd2"),
        "step 1 (build_bundle)",
        "field build_args.model",
        "absolute path",
    )


def test_a_symlink_out_of_the_workdir_is_refused_at_run_time(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", wd / "link")
    ctx = ActionContext(workdir=wd, confined=True, where="step 2 (list_recipes): ")
    assert ctx.path("a/b.json", "snapshot") == (wd / "a" / "b.json").resolve()
    with pytest.raises(UserError, match=r"step 2 \(list_recipes\): field snapshot: 'link/x.json' leaves the workdir"):
        ctx.path("link/x.json", "snapshot")
    # an unconfined context (the user's own TUI exploration) takes any path, as before
    assert ActionContext(workdir=wd).path("/tmp/x.json") == Path("/tmp/x.json")


def _native_session(tmp_path: Path) -> Path:
    s = Session.new("trust test", device="cpu")
    s.record("list_recipes", {"snapshot": "decode.graph.json"}, {"recipes": []})
    s.record(
        "generate",
        {"bundle": "b.bundle", "kernel_bindings": "kernel-bindings.json", "prompt": "hi", "max_new_tokens": 1},
        {"tokens": [1], "text": "x"},
    )
    return s.save(tmp_path / "native.json")


def test_a_step_that_loads_a_dso_needs_the_trust_flag(tmp_path, workbench):
    path = _native_session(tmp_path)
    wd = tmp_path / "wd"
    res = workbench("replay", path, "--headless", "--workdir", wd)
    assert_user_error(res, "step 2 (generate)", "loads native code", "kernel-bindings.json", "--trust-libraries")
    assert not wd.exists()  # refused before step 1 ran
    # a trusted folder must be inside the workdir (every library a session names lives there)
    res = workbench("replay", path, "--headless", "--workdir", wd, "--trust-libraries", tmp_path)
    assert_user_error(res, "--trust-libraries", "outside the replay workdir")
    # the flag is for headless replay; the TUI asks instead
    assert_user_error(workbench("replay", path, "--trust-libraries", "."), "--trust-libraries is for --headless")


def test_only_libraries_in_the_trusted_folder_load(tmp_path):
    wd = tmp_path / "wd"
    (wd / "trusted").mkdir(parents=True)
    (wd / "kernel.so").write_bytes(b"\x7fELF")
    (wd / "kernel-bindings.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": "k@1", "abi_sha256": HEX, "library": "./kernel.so", "function": "run"}],
            }
        )
    )
    ctx = ActionContext(workdir=wd, confined=True, where="step 5 (generate): ", trusted_libraries=wd / "trusted")
    with pytest.raises(
        UserError,
        match=r"step 5 \(generate\): field kernel_bindings: library kernel.so is outside "
        r"the trusted folder trusted",
    ):
        ctx.check_native("kernel-bindings.json")
    ActionContext(workdir=wd, confined=True, trusted_libraries=wd).check_native("kernel-bindings.json")
    with pytest.raises(UserError, match="--trust-libraries"):
        ActionContext(workdir=wd, confined=True).check_native("kernel-bindings.json")


@pytest.mark.asyncio
async def test_tui_replay_refuses_a_session_that_leaves_the_workdir(tmp_path):
    from workbench.app import WorkbenchApp

    path = session_with("list_recipes", {"snapshot": "../x.graph.json"}).save(tmp_path / "s.json")
    app = WorkbenchApp(replay=str(path), workdir=str(tmp_path / "wd"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.1)
        assert app.guide is None and "leaves the workdir" in (app.startup_error or "")
