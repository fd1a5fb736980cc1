"""The one action registry: everything the workbench knows about an action, declared once.

An ``ActionSpec`` ties an action's function (workbench/actions.py) to what the rest of the
workbench needs from it: the screen that shows its results, the results a replay compares,
the params that name paths (confined to the workdir) or a bindings manifest (native code,
asked for before it loads), what the guide panel shows, and how its results update the TUI's
state. Adding a step means adding one entry here; tests/test_action_registry.py checks that
the entries agree with the functions and the app.

This module stays headless (replay imports it): ``apply`` takes the TUI's state (a plain
dataclass, workbench/state.py) and the typed result, and the mcore readers it needs are
imported when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from mcore import UserError

from . import actions as A
from . import results as R
from .state import Applied, LastPrompt, Listing

if TYPE_CHECKING:
    from .state import WorkbenchState

Params = dict[str, Any]
T = TypeVar("T", bound=R.Record)
ApplyFn = Callable[["WorkbenchState", Params, T], None]


@dataclass(frozen=True)
class ActionSpec(Generic[T]):
    """One action.

    name         the action's name in sessions and on the command line
    fn           ``fn(ctx, **params) -> result`` (workbench/actions.py)
    result       the type of its result (workbench/results.py); a session records ``to_dict()``
    screen       the screen that shows its results (guided mode switches there), or None
    stable_keys  results a replay compares; the rest (paths, timings, measurements) are shown only
    path_params  params that name paths (a session's paths must stay inside its workdir)
    native_param the param naming a kernel bindings manifest, whose libraries it loads, or None
    shown        what the guide panel shows of its results, in order
    apply        ``apply(state, params, result)``: its result into the TUI's state (UI thread)
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
    fn: Callable[..., T]
    result: type[T]
    screen: str | None
    stable_keys: tuple[str, ...]
    path_params: tuple[str, ...]
    native_param: str | None
    shown: tuple[str, ...]
    apply: ApplyFn[T]
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

    def apply_json(self, st: WorkbenchState, params: Params, results: Params) -> None:
        """A recorded (JSON) result into the state: read back into its type, then applied."""
        self.apply(st, params, self.result.from_dict(results))


# ---------------------------------------------------------------------------- results -> state


def _apply_capture_graph(st: WorkbenchState, params: Params, r: R.Captured) -> None:
    from mcore import family_kind, load_snapshot

    snap = load_snapshot(st.path(r.snapshot))
    if st.snapshot is None or st.snapshot.fingerprint != snap.fingerprint:
        st.marked = []
    st.snapshot = snap
    st.snapshot_path = r.snapshot
    st.capture_results = r
    st.listing = None
    st.build_args = dict(params.get("build_args") or st.build_args)
    st.engine_role = snap.engine_role
    st.family_kind = family_kind(snap.family) if snap.family else None  # a snapshot without one: from the model
    if st.receipt is not None and st.receipt.graph_fingerprint != snap.fingerprint:
        st.receipt = None


def _apply_list_nodes(st: WorkbenchState, params: Params, r: R.Nodes) -> None:
    st.listing = Listing(params.get("match"), params.get("last"), tuple(r.ids))


def _apply_nothing(st: WorkbenchState, params: Params, r: R.Recipes) -> None:
    pass  # list_recipes: the Region screen lists the snapshot's recipes


def _apply_selection(st: WorkbenchState, params: Params, r: R.Selected) -> None:
    from mcore import load_receipt

    st.receipt = load_receipt(st.path(r.receipt))
    st.receipt_path = r.receipt
    st.marked = list(st.receipt.node_ids)


def _apply_library(st: WorkbenchState, params: Params, r: R.KernelBuilt | R.Exported) -> None:
    st.library = r.library


def _apply_kernel_stub(st: WorkbenchState, params: Params, r: R.StubWritten) -> None:
    st.stub_path = r.path
    try:
        st.stub_text = st.path(st.stub_path).read_text(encoding="utf-8") if st.stub_path else None
    except OSError:
        st.stub_text = None


def _apply_write_bindings(st: WorkbenchState, params: Params, r: R.BindingsWritten) -> None:
    st.manifest = r.manifest or params.get("manifest")
    if params.get("library"):
        st.library = params["library"]


def bundle_arm(params: Params) -> str:
    """Which bundle a build_bundle step made: "slot" (a recipe or a graph patch) or "native"."""
    return "slot" if (params.get("recipe") or params.get("graph_patch")) else "native"


def _apply_build_bundle(st: WorkbenchState, params: Params, r: R.BundleBuilt) -> None:
    from mcore import load_receipt

    arm = bundle_arm(params)
    st.bundles[arm] = Applied("build_bundle", params, r)
    if params.get("build_args"):
        st.build_args = dict(params["build_args"])
    if arm == "slot" and r.receipt:
        try:
            st.receipt = load_receipt(st.path(r.receipt))
            st.receipt_path = r.receipt
            if st.snapshot is not None and st.receipt.graph_fingerprint == st.snapshot.fingerprint:
                st.marked = list(st.receipt.node_ids)
        except UserError:
            pass


def _last_prompt(params: Params) -> LastPrompt:
    return LastPrompt(params.get("prompt"), params.get("max_new_tokens"))


def _apply_output(st: WorkbenchState, params: Params, r: R.Generated | R.Embedded) -> None:
    """generate / embed: the output of one arm (its type says which action made it)."""
    st.last_prompt = _last_prompt(params)
    arm = "external" if params.get("kernel_bindings") else "native"
    st.outputs[arm] = Applied(r.KIND, params, r)
    st.family_kind = "decoder" if isinstance(r, R.Generated) else "encoder"


def _apply_correctness(st: WorkbenchState, params: Params, r: R.TokensGated | R.EmbeddingsGated) -> None:
    """gate_tokens / gate_embeddings: the last correctness verdict (its type says which gate)."""
    action = "gate_embeddings" if isinstance(r, R.EmbeddingsGated) else "gate_tokens"
    st.correctness = Applied(action, params, r)


def _apply_gate_perf(st: WorkbenchState, params: Params, r: R.PerfGated) -> None:
    st.perf = Applied("gate_perf", params, r)
    st.last_prompt = _last_prompt(params)
    if r.samples and not any(st.samples.values()):
        st.samples = {k: list(v) for k, v in r.samples.items()}


def _apply_verify_reference(st: WorkbenchState, params: Params, r: R.ReferenceChecked) -> None:
    st.reference = r


def _apply_gate_logits(st: WorkbenchState, params: Params, r: R.LogitsGated) -> None:
    st.logits = r


def _apply_profile(st: WorkbenchState, params: Params, r: R.Profiled) -> None:
    from mcore import load_profile

    st.profile = load_profile(st.path(r.profile))
    st.profile_path = r.profile


# ---------------------------------------------------------------------------- the registry

_SELECTION_KEYS = ("binding_id", "abi_sha256", "node_ids", "input_tensor_ids", "output_tensor_ids")
_NATIVE = "kernel_bindings"

_SPECS: tuple[ActionSpec[Any], ...] = (
    ActionSpec(
        "capture_graph",
        A.capture_graph,
        R.Captured,
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
        R.Recipes,
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
        R.Nodes,
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
        R.Selected,
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
        R.Selected,
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
        R.KernelBuilt,
        "kernel",
        stable_keys=(),
        path_params=("output",),
        native_param=None,
        shown=("library", "variant"),
        apply=_apply_library,
        output_params=("output",),
    ),
    ActionSpec(
        "kernel_stub",
        A.kernel_stub,
        R.StubWritten,
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
        R.Exported,
        "kernel",
        stable_keys=("binding_id", "abi_sha256"),
        path_params=("exporter", "receipt", "snapshot", "output"),
        native_param=None,
        shown=("library", "binding_id", "arch"),
        apply=_apply_library,
        code_param="exporter",
        output_params=("output",),
    ),
    ActionSpec(
        "write_bindings",
        A.write_bindings,
        R.BindingsWritten,
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
        R.BundleBuilt,
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
        R.Generated,
        "verify",
        stable_keys=("tokens", "text"),
        path_params=("bundle", "output", _NATIVE),
        native_param=_NATIVE,
        shown=("tokens", "text"),
        apply=_apply_output,
        output_params=("output",),
    ),
    ActionSpec(
        "embed",
        A.embed,
        R.Embedded,
        "verify",
        stable_keys=("values",),
        path_params=("bundle", "output", _NATIVE),
        native_param=_NATIVE,
        shown=("values", "pooling"),
        apply=_apply_output,
        output_params=("output",),
    ),
    ActionSpec(
        "gate_tokens",
        A.gate_tokens,
        R.TokensGated,
        "verify",
        stable_keys=("verdict",),
        path_params=("native", "external"),
        native_param=None,
        shown=("verdict", "line"),
        apply=_apply_correctness,
        gate=True,
    ),
    ActionSpec(
        "gate_embeddings",
        A.gate_embeddings,
        R.EmbeddingsGated,
        "verify",
        stable_keys=("verdict", "values"),
        path_params=("native", "external"),
        native_param=None,
        shown=("verdict", "max_abs", "cosine", "line"),
        apply=_apply_correctness,
        gate=True,
    ),
    # the verdict compares; the measurements behind it are shown only
    ActionSpec(
        "gate_perf",
        A.gate_perf,
        R.PerfGated,
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
        R.ReferenceChecked,
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
        R.LogitsGated,
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
        R.Profiled,
        "profile",
        stable_keys=("role", "context", "candidates"),
        path_params=("bundle", "output", _NATIVE),
        native_param=_NATIVE,
        shown=("role", "context", "engine", "profile"),
        apply=_apply_profile,
        output_params=("output",),
    ),
)

REGISTRY: dict[str, ActionSpec[Any]] = {s.name: s for s in _SPECS}
GATES = tuple(s.name for s in _SPECS if s.gate)
VERDICTS = R.VERDICTS
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
