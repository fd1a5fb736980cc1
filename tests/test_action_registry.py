"""The action registry (workbench/registry.py) is complete and agrees with what it describes:
the action functions' signatures and results, the app's screens, the shipped sessions, and
the two places that ask before native code loads (headless replay and the TUI's prompt)."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path

import pytest

from mcore.errors import UserError
from workbench import actions
from workbench.registry import REGISTRY, ActionSpec
from workbench.replay import check_session
from workbench.screens.base import SCREEN_ORDER, SIDE_SCREENS
from workbench.session import Session, Step

SESSIONS = Path(__file__).resolve().parents[1] / "sessions"
NATIVE = [name for name, spec in REGISTRY.items() if spec.native_param]


def _params(spec: ActionSpec) -> list[str]:
    return list(inspect.signature(spec.fn).parameters)


def _returned_keys(fn) -> set[str] | None:
    """The result keys a function's return statements can produce, read from its source: dict
    literals (with ** of a helper in workbench.actions) or a helper's call. None when a return
    is something this cannot follow."""
    keys: set[str] = set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    if not returns:
        return None

    def follow(node: ast.expr) -> bool:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and callable(getattr(actions, node.func.id, None))
        ):
            sub = _returned_keys(getattr(actions, node.func.id))
            if sub is None:
                return False
            keys.update(sub)
            return True
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:  # {**helper(...), ...}
                    if not follow(v):
                        return False
                elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                    keys.add(k.value)
                else:
                    return False
            return True
        return False

    return keys if all(follow(r.value) for r in returns) else None


def test_every_action_function_is_registered_once_under_its_name():
    assert all(name == spec.name for name, spec in REGISTRY.items())
    funcs = {
        n
        for n, f in inspect.getmembers(actions, inspect.isfunction)
        if f.__module__ == actions.__name__
        and not n.startswith("_")
        and list(inspect.signature(f).parameters)[:1] == ["ctx"]
        and inspect.signature(f).return_annotation == "dict"
    }
    assert funcs == set(REGISTRY)
    assert all(spec.fn is getattr(actions, name) for name, spec in REGISTRY.items())


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
def test_stable_and_shown_keys_are_results_the_function_returns(name):
    spec = REGISTRY[name]
    keys = _returned_keys(spec.fn)
    if keys is None:
        pytest.skip(f"{name} returns something this check cannot read; the shipped sessions check it")
    assert set(spec.stable_keys) <= keys, set(spec.stable_keys) - keys
    assert set(spec.shown) <= keys, set(spec.shown) - keys


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
