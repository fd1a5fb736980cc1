"""The action registry (workbench/registry.py) is complete and agrees with what it describes:
the action functions' signatures and results, the app's screens, the shipped sessions, and
the two places that ask before native code loads (headless replay and the TUI's prompt)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from mcore.common.errors import UserError
from workbench import actions
from workbench.registry import REGISTRY, ActionSpec
from workbench.replay import check_session
from workbench.results import Record, result_json
from workbench.screens.base import SCREEN_ORDER, SIDE_SCREENS
from workbench.session import Session, Step

SESSIONS = Path(__file__).resolve().parents[1] / "sessions"
NATIVE = [name for name, spec in REGISTRY.items() if spec.native_param]


def _params(spec: ActionSpec) -> list[str]:
    return list(inspect.signature(spec.fn).parameters)


def test_every_action_function_is_registered_once_under_its_name():
    assert all(name == spec.name for name, spec in REGISTRY.items())
    funcs = {
        n
        for n, f in inspect.getmembers(actions, inspect.isfunction)
        if f.__module__ == actions.__name__
        and not n.startswith("_")
        and list(inspect.signature(f).parameters)[:1] == ["ctx"]
    }
    assert funcs == set(REGISTRY)
    assert all(spec.fn is getattr(actions, name) for name, spec in REGISTRY.items())


@pytest.mark.parametrize("name", list(REGISTRY))
def test_the_registry_declares_the_result_type_the_function_returns(name):
    spec = REGISTRY[name]
    assert issubclass(spec.result, Record) and dataclasses.is_dataclass(spec.result)
    assert spec.result.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert inspect.signature(spec.fn).return_annotation == f"R.{spec.result.__name__}"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_path_and_native_params_are_params_of_the_function(name):
    spec = REGISTRY[name]
    params = _params(spec)
    assert params[0] == "ctx"
    assert len(set(spec.path_params)) == len(spec.path_params)
    assert set(spec.path_params) <= set(params[1:]), set(spec.path_params) - set(params)
    if spec.native_param is not None:
        # a manifest is a path too: a session's manifest must stay inside its workdir
        assert spec.native_param in spec.path_params
    # nothing takes a bindings manifest without being asked about: the param is the native one
    assert ("kernel_bindings" in params) == (spec.native_param == "kernel_bindings")


def test_every_screen_named_is_a_screen_of_the_app():
    import importlib

    from workbench.screens.base import WorkbenchScreen

    for mod in ("build", "graph", "kernel", "model", "profile", "region", "verify"):
        importlib.import_module(f"workbench.screens.{mod}")

    def subclasses(c: type) -> set[type]:
        return {c} | {s for sub in c.__subclasses__() for s in subclasses(sub)}

    names = {c.SCREEN_NAME for c in subclasses(WorkbenchScreen) if c is not WorkbenchScreen}
    for spec in REGISTRY.values():
        if spec.screen is not None:
            assert spec.screen in names, spec.name
            # and the app can switch there (WorkbenchApp.action_show / go)
            assert spec.screen in SCREEN_ORDER or spec.screen in SIDE_SCREENS, spec.name


@pytest.mark.parametrize("name", list(REGISTRY))
def test_stable_and_shown_keys_are_fields_of_the_result_type(name):
    spec = REGISTRY[name]
    keys = {f.name for f in dataclasses.fields(spec.result)}
    assert set(spec.stable_keys) <= keys, set(spec.stable_keys) - keys
    assert set(spec.shown) <= keys, set(spec.shown) - keys
    assert set(spec.recorded_keys) <= keys, set(spec.recorded_keys) - keys


def test_the_shipped_sessions_read_back_into_their_result_types_unchanged():
    """Every recorded result of the shipped sessions reads into its type and writes back with the same
    values in the same key order (a result recorded before a field was added gains only that field, at
    its default): what a session records goes through typed results unchanged."""
    for path in sorted(SESSIONS.glob("*.json")):
        for st in json.loads(path.read_text(encoding="utf-8"))["steps"]:
            if st["status"] == "ok":
                again = result_json(REGISTRY[st["action"]].result.from_dict(st["results"]))
                kept = {k: v for k, v in again.items() if k in st["results"]}
                assert json.dumps(kept) == json.dumps(st["results"]), (path.name, st["action"])


def test_the_shipped_sessions_record_every_stable_and_shown_key():
    for path in sorted(SESSIONS.glob("*.json")):
        for st in json.loads(path.read_text(encoding="utf-8"))["steps"]:
            if st["status"] == "ok":
                spec = REGISTRY[st["action"]]
                assert set(spec.stable_keys + spec.shown) <= set(st["results"]), (path.name, spec.name)


@pytest.mark.parametrize("name", NATIVE)
def test_a_native_step_needs_the_trust_flag_on_replay(name, tmp_path):
    spec = REGISTRY[name]
    s = Session.new("native", device="cpu")
    s.steps.append(Step(action=name, params={spec.native_param: "k.json"}))
    with pytest.raises(UserError, match=f"loads native code through field {spec.native_param}"):
        check_session(s, tmp_path)
    check_session(s, tmp_path, native_confirmed=True)


@pytest.mark.asyncio
async def test_the_tui_asks_before_every_native_step_runs(tmp_path):
    """perform() of each native action with a manifest pushes the trust prompt and runs nothing
    until answered; declining reports the step as not run."""
    from workbench.app import WorkbenchApp
    from workbench.screens.dialogs import TrustModal

    app = WorkbenchApp(workdir=str(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.1)
        for name in NATIVE:
            finished = []
            started = app.perform(name, {REGISTRY[name].native_param: "k.json"}, on_finish=finished.append)
            await pilot.pause(0.05)
            assert not started and not app.busy and isinstance(app.screen, TrustModal), name
            await pilot.press("escape")
            await pilot.pause(0.05)
            assert not isinstance(app.screen, TrustModal), name
            assert [o.kind for o in finished] == ["cancelled"] and "declined" in finished[0].error, name
