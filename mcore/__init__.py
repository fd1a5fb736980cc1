"""mcore: capture a model's graph, select a region, patch it with a TVM-FFI kernel slot, run it.

The public API is the names in ``__all__``, imported from the package itself::

    from mcore import open_bundle, open_pipeline, select_region, UserError

Everything else (the submodules and what they define) is internal and may change without notice;
the workbench (workbench/**) uses only these names. ``import mcore`` is cheap: each name is
imported from its submodule on first use (PEP 562 ``__getattr__``), so torch loads only when a
name that needs it is first touched.

The groups:

- errors: UserError (a one-line input error), Cancelled
- progress: Progress, CancelToken, NO_PROGRESS
- graph: capture, resolve, tool_versions; load_snapshot and the typed Snapshot (Node, Tensor,
  RecipeRow); the display helpers abi_lines, module_tree, node_matches, node_row
- selection: select_region, load_receipt, RegionError; the typed Receipt and SlotRecord;
  recipes: find_recipe, recipe_rows, select_recipe
- build: BuildArgs (and its LAYOUTS, PRECISIONS, WEIGHTS), build_bundle; open_bundle, BundleManifest
- run: open_pipeline (the class from the bundle's family kind), DecoderPipeline, EncoderPipeline
- kernels: build_kernel, write_exporter, run_exporter, shipped_exporter, SHIPPED_EXPORTERS, kernel_catalog;
  exporter_kit (the module every CuTe DSL exporter imports: contract check, ABI order, export and link);
  load_bindings_manifest, BindingsManifest, Binding, BINDINGS_SCHEMA_VERSION
- verify gates: compare_tokens, compare_embeddings, perf_gate (and its PERF_DEFAULTS), reference_check,
  lockstep_logits; the one gate implementation the CLI and the workbench share (mcore/verify/gates.py):
  TokensGate, EmbeddingsGate, ReferenceGate, LogitsGate, PerfGate (PerfOptions, BenchArms), GateHooks;
  what they return: GateResult, its details typed per gate (TokensDetails, EmbeddingsDetails,
  ReferenceDetails, LogitsDetails, PerfDetails)
- the edit-export-verify loop: watch_kernel, WatchConfig, WatchRound (a round's outcome), benchmark_command
  (a perf gate arm's command)
- profile: profile_pipeline (check_bundle_request: its values checked before a pipeline loads), load_profile,
  CANDIDATE_BINDING; what they return, typed (mcore/profile/report.py):
  ProfileReport (to_dict() is the profile file), its ranked ProfileCandidate rows, and PartialProfile (the live
  view `on_partial` receives); device facts: device_facts, describe_device
- files: atomic_write, check_fields, check_overwrite (the one overwrite rule), check_path_text, read_json,
  write_json, stdout_failed, check_std_streams; library_sha256 (a DSO's sha256, as a bindings manifest
  records it); set_cache_note_sink
- demo models and families: demo_names; family_kind (a family's), model_kind (a model spec's),
  bundle_kind (a bundle manifest's): decoder or encoder, always from mcore, never from a name
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the submodule (relative to mcore) that defines it
_EXPORTS: dict[str, str] = {
    # errors
    "UserError": "common.errors",
    "Cancelled": "common.errors",
    # progress and cancellation
    "Progress": "common.progress",
    "CancelToken": "common.progress",
    "NO_PROGRESS": "common.progress",
    # graph capture and snapshots
    "capture": "graph.capture",
    "resolve": "graph.capture",
    "tool_versions": "graph.capture",
    "load_snapshot": "graph.snapshot",
    "Snapshot": "graph.snapshot",
    "Node": "graph.snapshot",
    "Tensor": "graph.snapshot",
    "RecipeRow": "graph.snapshot",
    # display helpers
    "abi_lines": "graph.display",
    "module_tree": "graph.display",
    "node_matches": "graph.display",
    "node_row": "graph.display",
    # selection
    "select_region": "selection.region",
    "load_receipt": "selection.region",
    "RegionError": "common.errors",
    "Receipt": "selection.receipt",
    "SlotRecord": "selection.receipt",
    # recipes
    "find_recipe": "selection.recipes",
    "recipe_rows": "selection.recipes",
    "select_recipe": "selection.recipes",
    # build
    "BuildArgs": "model.buildargs",
    "LAYOUTS": "model.buildargs",
    "PRECISIONS": "model.buildargs",
    "WEIGHTS": "model.buildargs",
    "build_bundle": "bundle.build",
    "open_bundle": "bundle.container",
    "BundleManifest": "bundle.manifest",
    # pipelines
    "open_pipeline": "runtime.api",
    "DecoderPipeline": "runtime.pipeline",
    "EncoderPipeline": "runtime.pipeline",
    # kernels and bindings
    "build_kernel": "kernels.shipped",
    "write_exporter": "kernels.stubgen",
    "exporter_kit": "kernels.exporter_kit",
    "run_exporter": "kernels.exporters",
    "device_facts": "profile.device",
    "describe_device": "profile.device",
    "shipped_exporter": "kernels.exporters",
    "SHIPPED_EXPORTERS": "kernels.exporters",
    "kernel_catalog": "kernels.exporters",
    "load_bindings_manifest": "runtime.bindings",
    "open_bound_bundle": "runtime.bindings",
    "BindingsManifest": "runtime.bindings",
    "Binding": "runtime.bindings",
    "BINDINGS_SCHEMA_VERSION": "runtime.bindings",
    # verify gates
    "compare_tokens": "verify.compare",
    "compare_embeddings": "verify.compare",
    "perf_gate": "verify.compare",
    "PERF_DEFAULTS": "verify.perf",
    "reference_check": "verify.reference",
    "lockstep_logits": "verify.logits",
    "GateHooks": "verify.gates",
    "TokensGate": "verify.gates",
    "EmbeddingsGate": "verify.gates",
    "ReferenceGate": "verify.gates",
    "LogitsGate": "verify.gates",
    "PerfGate": "verify.gates",
    "PerfOptions": "verify.gates",
    "BenchArms": "verify.gates",
    "GateResult": "verify.verdicts",
    "TokensDetails": "verify.details",
    "EmbeddingsDetails": "verify.details",
    "ReferenceDetails": "verify.details",
    "LogitsDetails": "verify.details",
    "PerfDetails": "verify.details",
    # the edit-export-verify loop
    "WatchConfig": "verify.watch",
    "watch_kernel": "verify.watch",
    "WatchRound": "verify.watch",
    "benchmark_command": "verify.watch",
    # profile
    "profile_pipeline": "profile.profiler",
    "check_bundle_request": "profile.profiler",
    "load_profile": "profile.profiler",
    "CANDIDATE_BINDING": "profile.profiler",
    "ProfileReport": "profile.report",
    "ProfileCandidate": "profile.report",
    "PartialProfile": "profile.report",
    # files
    "atomic_write": "common.fileio",
    "check_fields": "common.fileio",
    "check_overwrite": "common.fileio",
    "check_path_text": "common.fileio",
    "check_std_streams": "common.fileio",
    "library_sha256": "kernels.dso",
    "set_cache_note_sink": "common.cache",
    "read_json": "common.fileio",
    "write_json": "common.fileio",
    "stdout_failed": "common.fileio",
    # demo models and model families
    "demo_names": "families.demo",
    "family_kind": "families",
    "model_kind": "families",
    "bundle_kind": "families",
}

# the public names (the keys of _EXPORTS; tests/test_public_api.py checks they agree)
__all__ = [
    "BINDINGS_SCHEMA_VERSION",
    "CANDIDATE_BINDING",
    "LAYOUTS",
    "NO_PROGRESS",
    "PERF_DEFAULTS",
    "GateHooks",
    "TokensGate",
    "EmbeddingsGate",
    "ReferenceGate",
    "LogitsGate",
    "PerfGate",
    "PerfOptions",
    "BenchArms",
    "PRECISIONS",
    "SHIPPED_EXPORTERS",
    "WEIGHTS",
    "Binding",
    "BindingsManifest",
    "BuildArgs",
    "BundleManifest",
    "CancelToken",
    "Cancelled",
    "DecoderPipeline",
    "EncoderPipeline",
    "Node",
    "Progress",
    "Receipt",
    "RecipeRow",
    "RegionError",
    "SlotRecord",
    "Snapshot",
    "Tensor",
    "UserError",
    "WatchConfig",
    "abi_lines",
    "atomic_write",
    "benchmark_command",
    "build_bundle",
    "build_kernel",
    "capture",
    "check_fields",
    "check_overwrite",
    "check_path_text",
    "check_std_streams",
    "compare_embeddings",
    "compare_tokens",
    "bundle_kind",
    "demo_names",
    "describe_device",
    "device_facts",
    "exporter_kit",
    "family_kind",
    "find_recipe",
    "kernel_catalog",
    "library_sha256",
    "load_bindings_manifest",
    "load_receipt",
    "load_snapshot",
    "lockstep_logits",
    "model_kind",
    "module_tree",
    "node_matches",
    "node_row",
    "open_bound_bundle",
    "open_bundle",
    "open_pipeline",
    "perf_gate",
    "profile_pipeline",
    "check_bundle_request",
    "load_profile",
    "ProfileReport",
    "ProfileCandidate",
    "PartialProfile",
    "read_json",
    "recipe_rows",
    "reference_check",
    "resolve",
    "run_exporter",
    "select_recipe",
    "select_region",
    "set_cache_note_sink",
    "shipped_exporter",
    "stdout_failed",
    "tool_versions",
    "watch_kernel",
    "GateResult",
    "TokensDetails",
    "EmbeddingsDetails",
    "ReferenceDetails",
    "LogitsDetails",
    "PerfDetails",
    "WatchRound",
    "write_exporter",
    "write_json",
]


def __getattr__(name: str) -> Any:
    sub = _EXPORTS.get(name)
    if sub is None:
        raise AttributeError(f"module 'mcore' has no attribute {name!r}")
    # not cached here: each lookup reads the submodule's current attribute, so `from mcore import X`
    # inside a function sees exactly what `from mcore.<sub> import X` would (monkeypatched test doubles included)
    return getattr(importlib.import_module(f".{sub}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # the names as type checkers and IDEs see them; never run
    from .bundle.build import build_bundle
    from .bundle.container import open_bundle
    from .bundle.manifest import BundleManifest
    from .common.cache import set_cache_note_sink
    from .common.errors import Cancelled, RegionError, UserError
    from .common.fileio import (
        atomic_write,
        check_fields,
        check_overwrite,
        check_path_text,
        check_std_streams,
        read_json,
        stdout_failed,
        write_json,
    )
    from .common.progress import NO_PROGRESS, CancelToken, Progress
    from .families import bundle_kind, family_kind, model_kind
    from .families.demo import demo_names
    from .graph.capture import capture, resolve, tool_versions
    from .graph.display import abi_lines, module_tree, node_matches, node_row
    from .graph.snapshot import Node, RecipeRow, Snapshot, Tensor, load_snapshot
    from .kernels.dso import library_sha256
    from .kernels.exporters import SHIPPED_EXPORTERS, kernel_catalog, run_exporter, shipped_exporter
    from .kernels.shipped import build_kernel
    from .kernels.stubgen import write_exporter
    from .model.buildargs import LAYOUTS, PRECISIONS, WEIGHTS, BuildArgs
    from .profile.device import describe_device, device_facts
    from .profile.profiler import CANDIDATE_BINDING, check_bundle_request, load_profile, profile_pipeline
    from .profile.report import PartialProfile, ProfileCandidate, ProfileReport
    from .runtime.api import open_pipeline
    from .runtime.bindings import (
        BINDINGS_SCHEMA_VERSION,
        Binding,
        BindingsManifest,
        load_bindings_manifest,
        open_bound_bundle,
    )
    from .runtime.pipeline import DecoderPipeline, EncoderPipeline
    from .selection.receipt import Receipt, SlotRecord
    from .selection.recipes import find_recipe, recipe_rows, select_recipe
    from .selection.region import load_receipt, select_region
    from .verify.compare import compare_embeddings, compare_tokens, perf_gate
    from .verify.details import EmbeddingsDetails, LogitsDetails, PerfDetails, ReferenceDetails, TokensDetails
    from .verify.gates import (
        BenchArms,
        EmbeddingsGate,
        GateHooks,
        LogitsGate,
        PerfGate,
        PerfOptions,
        ReferenceGate,
        TokensGate,
    )
    from .verify.logits import lockstep_logits
    from .verify.perf import PERF_DEFAULTS
    from .verify.reference import reference_check
    from .verify.verdicts import GateResult
    from .verify.watch import WatchConfig, WatchRound, benchmark_command, watch_kernel
