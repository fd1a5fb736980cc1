"""The one action registry: everything the workbench knows about an action, declared once.

An ``ActionSpec`` ties an action's function (workbench/actions.py) to what the rest of the
workbench needs from it: the screen that shows its results, the results a replay compares,
the params that name paths (confined to the workdir) or a bindings manifest (native code,
asked for before it loads), what the guide panel shows, and how its results update the TUI's
state. Adding a step means adding one entry here; tests/test_action_registry.py checks that
the entries agree with the functions and the app.

This module stays headless (replay imports it): ``apply`` takes the TUI's state duck-typed,
and the mcore readers it needs are imported when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcore import UserError

from . import actions as A

if TYPE_CHECKING:
    from .state import WorkbenchState

Params = dict[str, Any]
ApplyFn = Callable[["WorkbenchState", Params, Params], None]


@dataclass(frozen=True)
class ActionSpec:
    """One action.

    name         the action's name in sessions and on the command line
    fn           ``fn(ctx, **params) -> results`` (workbench/actions.py)
    screen       the screen that shows its results (guided mode switches there), or None
    stable_keys  results a replay compares; the rest (paths, timings, measurements) are shown only
    path_params  params that name paths (a session's paths must stay inside its workdir)
    native_param the param naming a kernel bindings manifest, whose libraries it loads, or None
    shown        what the guide panel shows of its results, in order
    apply        ``apply(state, params, results)``: its results into the TUI's state (UI thread)
    code_param   the param naming a Python script it runs (an exporter), unless the value is a
                 shipped exporter's name; asked for like native code
    output_params the params naming files it writes; an existing one is replaced only with the
                 action's `overwrite` param (the TUI asks first: workbench/outputs.py)
    gate         a gate: its results carry a verdict (PASS/FAIL, the perf gate PROMOTE/REJECT/
                 INCONCLUSIVE) that replay compares with the recording and counts in its headline
    recorded_keys results a replay compares when the recording has them (added after sessions were
                 recorded without them, such as a bound library's sha256)
    """

    name: str
    fn: Callable[..., dict]
    screen: str | None
    stable_keys: tuple[str, ...]
    path_params: tuple[str, ...]
    native_param: str | None
    shown: tuple[str, ...]
    apply: ApplyFn
    code_param: str | None = None
    output_params: tuple[str, ...] = ()
    gate: bool = False
    recorded_keys: tuple[str, ...] = ()

    def trust_needed(self, params: Params) -> str | None:
        """The param whose value this step would run as someone's native code or script, or None."""
        if self.native_param and params.get(self.native_param) is not None:
            return self.native_param
        if self.code_param and params.get(self.code_param) is not None:
            from mcore import shipped_exporter

            if shipped_exporter(str(params[self.code_param])) is None:
                return self.code_param
        return None


# ---------------------------------------------------------------------------- results -> state


def _apply_capture_graph(st: WorkbenchState, params: Params, results: Params) -> None:
    from mcore import family_kind, load_snapshot

    snap = load_snapshot(st.path(results["snapshot"]))
    if st.snapshot is None or st.snapshot.fingerprint != snap.fingerprint:
        st.marked = []
    st.snapshot = snap
    st.snapshot_path = results["snapshot"]
    st.capture_results = results
    st.listing = None
    st.build_args = dict(params.get("build_args") or st.build_args)
    st.engine_role = snap.engine_role
    st.family_kind = family_kind(snap.family) if snap.family else None  # a snapshot without one: from the model
    if st.receipt is not None and st.receipt.graph_fingerprint != snap.fingerprint:
        st.receipt = None


def _apply_list_nodes(st: WorkbenchState, params: Params, results: Params) -> None:
    st.listing = {"match": params.get("match"), "last": params.get("last"), "ids": list(results.get("ids", []))}


def _apply_nothing(st: WorkbenchState, params: Params, results: Params) -> None:
    pass  # list_recipes: the Region screen lists the snapshot's recipes


def _apply_selection(st: WorkbenchState, params: Params, results: Params) -> None:
    from mcore import load_receipt

    st.receipt = load_receipt(st.path(results["receipt"]))
    st.receipt_path = results["receipt"]
    st.marked = list(st.receipt.node_ids)


def _apply_build_kernel(st: WorkbenchState, params: Params, results: Params) -> None:
    st.library = results.get("library")


def _apply_kernel_stub(st: WorkbenchState, params: Params, results: Params) -> None:
    st.stub_path = results.get("path")
    try:
        st.stub_text = st.path(st.stub_path).read_text(encoding="utf-8") if st.stub_path else None
    except OSError:
        st.stub_text = None


def _apply_export_kernel(st: WorkbenchState, params: Params, results: Params) -> None:
    st.library = results.get("library")


def _apply_write_bindings(st: WorkbenchState, params: Params, results: Params) -> None:
    st.manifest = results.get("manifest") or params.get("manifest")
    if params.get("library"):
        st.library = params["library"]


def _apply_build_bundle(st: WorkbenchState, params: Params, results: Params) -> None:
    from mcore import load_receipt

    arm = "slot" if (params.get("recipe") or params.get("graph_patch")) else "native"
    st.bundles[arm] = dict(results, params=params)
    if params.get("build_args"):
        st.build_args = dict(params["build_args"])
    if arm == "slot" and results.get("receipt"):
        try:
            st.receipt = load_receipt(st.path(results["receipt"]))
            st.receipt_path = results["receipt"]
            if st.snapshot is not None and st.receipt.graph_fingerprint == st.snapshot.fingerprint:
                st.marked = list(st.receipt.node_ids)
        except UserError:
            pass


def _apply_output(action: str) -> ApplyFn:
    """generate / embed: the output of one arm (the kind records which action made it)."""

    def apply(st: WorkbenchState, params: Params, results: Params) -> None:
        st.last_prompt = {"prompt": params.get("prompt"), "max_new_tokens": params.get("max_new_tokens")}
        arm = "external" if params.get("kernel_bindings") else "native"
        st.outputs[arm] = dict(results, params=params, kind=action)
        st.family_kind = "decoder" if action == "generate" else "encoder"

    return apply


def _apply_correctness(action: str) -> ApplyFn:
    """gate_tokens / gate_embeddings: the last correctness verdict (the kind says which gate)."""

    def apply(st: WorkbenchState, params: Params, results: Params) -> None:
        st.correctness = dict(results, kind=action, params=params)

    return apply


def _apply_gate_perf(st: WorkbenchState, params: Params, results: Params) -> None:
    st.perf = dict(results, params=params)
    st.last_prompt = {"prompt": params.get("prompt"), "max_new_tokens": params.get("max_new_tokens")}
    samples = results.get("samples")
    if isinstance(samples, dict) and not any(st.samples.values()):
        st.samples = {k: list(v) for k, v in samples.items()}


def _apply_verify_reference(st: WorkbenchState, params: Params, results: Params) -> None:
    st.reference = dict(results)


def _apply_gate_logits(st: WorkbenchState, params: Params, results: Params) -> None:
    st.logits = dict(results)


def _apply_profile(st: WorkbenchState, params: Params, results: Params) -> None:
    from mcore import load_profile

    st.profile = load_profile(st.path(results["profile"]))
    st.profile_path = results["profile"]


# ---------------------------------------------------------------------------- the registry

_SELECTION_KEYS = ("binding_id", "abi_sha256", "node_ids", "input_tensor_ids", "output_tensor_ids")
_NATIVE = "kernel_bindings"

_SPECS = (
    ActionSpec(
        "capture_graph",
        A.capture_graph,
        "graph",
        stable_keys=("fingerprint", "nodes", "tensors", "recipes"),
        path_params=("snapshot",),
        native_param=None,
        shown=("fingerprint", "nodes", "tensors", "recipes"),
        apply=_apply_capture_graph,
        output_params=("snapshot",),
    ),
    ActionSpec(
        "list_recipes",
        A.list_recipes,
        "region",
        stable_keys=("recipes",),
        path_params=("snapshot",),
        native_param=None,
        shown=("count",),
        apply=_apply_nothing,
    ),
    ActionSpec(
        "list_nodes",
        A.list_nodes,
        "graph",
        stable_keys=("ids",),
        path_params=("snapshot",),
        native_param=None,
        shown=("count", "ids"),
        apply=_apply_list_nodes,
    ),
    ActionSpec(
        "select_recipe",
        A.select_recipe,
        "region",
        stable_keys=_SELECTION_KEYS,
        path_params=("snapshot", "receipt"),
        native_param=None,
        shown=("binding_id", "abi_sha256", "node_ids"),
        apply=_apply_selection,
        output_params=("receipt",),
    ),
    ActionSpec(
        "select_nodes",
        A.select_nodes,
        "region",
        stable_keys=_SELECTION_KEYS,
        path_params=("snapshot", "receipt"),
        native_param=None,
        shown=("binding_id", "abi_sha256", "node_ids"),
        apply=_apply_selection,
        output_params=("receipt",),
    ),
    ActionSpec(
        "build_kernel",
        A.build_kernel,
        "kernel",
        stable_keys=(),
        path_params=("output",),
        native_param=None,
        shown=("library", "variant"),
        apply=_apply_build_kernel,
        output_params=("output",),
    ),
    ActionSpec(
        "kernel_stub",
        A.kernel_stub,
        "kernel",
        stable_keys=("binding_id", "abi_sha256", "body"),
        path_params=("receipt", "snapshot", "output"),
        native_param=None,
        shown=("path", "abi_sha256"),
        apply=_apply_kernel_stub,
        output_params=("output",),
    ),
    ActionSpec(
        "export_kernel",
        A.export_kernel,
        "kernel",
        stable_keys=("binding_id", "abi_sha256"),
        path_params=("exporter", "receipt", "snapshot", "output"),
        native_param=None,
        shown=("library", "binding_id", "arch"),
        apply=_apply_export_kernel,
        code_param="exporter",
        output_params=("output",),
    ),
    ActionSpec(
        "write_bindings",
        A.write_bindings,
        "kernel",
        stable_keys=("binding_id", "abi_sha256"),
        path_params=("receipt", "library", "manifest"),
        native_param=None,
        shown=("manifest", "abi_sha256"),
        apply=_apply_write_bindings,
        output_params=("manifest",),
        recorded_keys=("library_sha256",),
    ),
    ActionSpec(
        "build_bundle",
        A.build_bundle,
        "build",
        stable_keys=("fingerprints", "kernel_slots"),
        path_params=("output", "graph_patch"),
        native_param=None,
        shown=("bundle", "fingerprints", "kernel_slots"),
        apply=_apply_build_bundle,
        output_params=("output",),
    ),
    ActionSpec(
        "generate",
        A.generate,
        "verify",
        stable_keys=("tokens", "text"),
        path_params=("bundle", "output", _NATIVE),
        native_param=_NATIVE,
        shown=("tokens", "text"),
        apply=_apply_output("generate"),
        output_params=("output",),
    ),
    ActionSpec(
        "embed",
        A.embed,
        "verify",
        stable_keys=("values",),
        path_params=("bundle", "output", _NATIVE),
        native_param=_NATIVE,
        shown=("values", "pooling"),
        apply=_apply_output("embed"),
        output_params=("output",),
    ),
    ActionSpec(
        "gate_tokens",
        A.gate_tokens,
        "verify",
        stable_keys=("verdict",),
        path_params=("native", "external"),
        native_param=None,
        shown=("verdict", "line"),
        apply=_apply_correctness("gate_tokens"),
        gate=True,
    ),
    ActionSpec(
        "gate_embeddings",
        A.gate_embeddings,
        "verify",
        stable_keys=("verdict", "values"),
        path_params=("native", "external"),
        native_param=None,
        shown=("verdict", "max_abs", "cosine", "line"),
        apply=_apply_correctness("gate_embeddings"),
        gate=True,
    ),
    # the verdict compares; the measurements behind it are shown only
    ActionSpec(
        "gate_perf",
        A.gate_perf,
        "verify",
        stable_keys=("verdict",),
        path_params=("native_bundle", "external_bundle", _NATIVE),
        native_param=_NATIVE,
        shown=("verdict", "ratio", "line"),
        apply=_apply_gate_perf,
        gate=True,
    ),
    # screen None as before the registry (a guided step of it stays on the current screen);
    # the Verify screen is where it is run from
    ActionSpec(
        "verify_reference",
        A.verify_reference,
        None,
        stable_keys=("verdict", "first_diverging_step"),
        path_params=("bundle", _NATIVE),
        native_param=_NATIVE,
        shown=("verdict", "first_diverging_step", "line"),
        apply=_apply_verify_reference,
        gate=True,
    ),
    # the max_abs values may follow the torch build, so only the verdict and where it diverged compare
    ActionSpec(
        "gate_logits",
        A.gate_logits,
        "verify",
        stable_keys=("verdict", "first_divergence"),
        path_params=("native_bundle", "external_bundle", _NATIVE),
        native_param=_NATIVE,
        shown=("verdict", "first_divergence", "line"),
        apply=_apply_gate_logits,
        gate=True,
    ),
    # not "ranked": the rank follows measured times
    ActionSpec(
        "profile",
        A.profile,
        "profile",
        stable_keys=("role", "context", "candidates"),
        path_params=("bundle", "output", _NATIVE),
        native_param=_NATIVE,
        shown=("role", "context", "engine", "profile"),
        apply=_apply_profile,
        output_params=("output",),
    ),
)

REGISTRY: dict[str, ActionSpec] = {s.name: s for s in _SPECS}
GATES = tuple(s.name for s in _SPECS if s.gate)
VERDICTS = ("PASS", "FAIL", "PROMOTE", "REJECT", "INCONCLUSIVE")
PASSING = ("PASS", "PROMOTE")


def verdict_of(action: str, results: Params | None) -> str | None:
    """A gate step's verdict word from its results (None for other actions or no results).

    Sessions recorded before gates recorded a verdict carry only `passed`: PASS/FAIL, and for the
    perf gate (then decided by the median ratio alone) PROMOTE/REJECT, or FAIL when its line names
    no ratio (a run that failed)."""
    if action not in GATES or not results:
        return None
    v = results.get("verdict")
    if isinstance(v, str) and v in VERDICTS:
        return v
    passed = bool(results.get("passed"))
    if action != "gate_perf":
        return "PASS" if passed else "FAIL"
    if passed:
        return "PROMOTE"
    return "REJECT" if "median ratio" in str(results.get("line", "")) else "FAIL"
