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
  lockstep_logits; the one gate implementation the CLI and the workbench share (mcore/gates.py):
  TokensGate, EmbeddingsGate, ReferenceGate, LogitsGate, PerfGate (PerfOptions, BenchArms), GateHooks
- the edit-export-verify loop: watch_kernel, WatchConfig, benchmark_command (a perf gate arm's command)
- profile: profile_pipeline, load_profile, CANDIDATE_BINDING; device facts: device_facts, describe_device
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
    "UserError": "errors",
    "Cancelled": "errors",
    # progress and cancellation
    "Progress": "progress",
    "CancelToken": "progress",
    "NO_PROGRESS": "progress",
    # graph capture and snapshots
    "capture": "graph_capture",
    "resolve": "graph_capture",
    "tool_versions": "graph_capture",
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
    "select_region": "selection",
    "load_receipt": "selection",
    "RegionError": "errors",
    "Receipt": "receipt",
    "SlotRecord": "receipt",
    # recipes
    "find_recipe": "recipes",
    "recipe_rows": "recipes",
    "select_recipe": "recipes",
    # build
    "BuildArgs": "buildargs",
    "LAYOUTS": "buildargs",
    "PRECISIONS": "buildargs",
    "WEIGHTS": "buildargs",
    "build_bundle": "build",
    "open_bundle": "bundle",
    "BundleManifest": "bundle_manifest",
    # pipelines
    "open_pipeline": "api",
    "DecoderPipeline": "pipeline",
    "EncoderPipeline": "pipeline",
    # kernels and bindings
    "build_kernel": "kernels",
    "write_exporter": "stubgen",
    "exporter_kit": "exporter_kit",
    "run_exporter": "exporters",
    "device_facts": "device",
    "describe_device": "device",
    "shipped_exporter": "exporters",
    "SHIPPED_EXPORTERS": "exporters",
    "kernel_catalog": "exporters",
    "load_bindings_manifest": "bindings",
    "BindingsManifest": "bindings",
    "Binding": "bindings",
    "BINDINGS_SCHEMA_VERSION": "bindings",
    # verify gates
    "compare_tokens": "verify",
    "compare_embeddings": "verify",
    "perf_gate": "verify",
    "PERF_DEFAULTS": "verify_perf",
    "reference_check": "verify_reference",
    "lockstep_logits": "verify_logits",
    "GateHooks": "gates",
    "TokensGate": "gates",
    "EmbeddingsGate": "gates",
    "ReferenceGate": "gates",
    "LogitsGate": "gates",
    "PerfGate": "gates",
    "PerfOptions": "gates",
    "BenchArms": "gates",
    # the edit-export-verify loop
    "WatchConfig": "watch",
    "watch_kernel": "watch",
    "benchmark_command": "watch",
    # profile
    "profile_pipeline": "profile",
    "load_profile": "profile",
    "CANDIDATE_BINDING": "profile",
    # files
    "atomic_write": "fileio",
    "check_fields": "fileio",
    "check_overwrite": "fileio",
    "check_path_text": "fileio",
    "check_std_streams": "fileio",
    "library_sha256": "dso",
    "set_cache_note_sink": "cache",
    "read_json": "fileio",
    "write_json": "fileio",
    "stdout_failed": "fileio",
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
    "open_bundle",
    "open_pipeline",
    "perf_gate",
    "profile_pipeline",
    "load_profile",
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
    from .api import open_pipeline
    from .bindings import BINDINGS_SCHEMA_VERSION, Binding, BindingsManifest, load_bindings_manifest
    from .build import build_bundle
    from .buildargs import LAYOUTS, PRECISIONS, WEIGHTS, BuildArgs
    from .bundle import open_bundle
    from .bundle_manifest import BundleManifest
    from .cache import set_cache_note_sink
    from .device import describe_device, device_facts
    from .dso import library_sha256
    from .errors import Cancelled, RegionError, UserError
    from .exporters import SHIPPED_EXPORTERS, kernel_catalog, run_exporter, shipped_exporter
    from .families import bundle_kind, family_kind, model_kind
    from .families.demo import demo_names
    from .fileio import (
        atomic_write,
        check_fields,
        check_overwrite,
        check_path_text,
        check_std_streams,
        read_json,
        stdout_failed,
        write_json,
    )
    from .gates import (
        BenchArms,
        EmbeddingsGate,
        GateHooks,
        LogitsGate,
        PerfGate,
        PerfOptions,
        ReferenceGate,
        TokensGate,
    )
    from .graph.display import abi_lines, module_tree, node_matches, node_row
    from .graph.snapshot import Node, RecipeRow, Snapshot, Tensor, load_snapshot
    from .graph_capture import capture, resolve, tool_versions
    from .kernels import build_kernel
    from .pipeline import DecoderPipeline, EncoderPipeline
    from .profile import CANDIDATE_BINDING, load_profile, profile_pipeline
    from .progress import NO_PROGRESS, CancelToken, Progress
    from .receipt import Receipt, SlotRecord
    from .recipes import find_recipe, recipe_rows, select_recipe
    from .selection import load_receipt, select_region
    from .stubgen import write_exporter
    from .verify import compare_embeddings, compare_tokens, perf_gate
    from .verify_logits import lockstep_logits
    from .verify_perf import PERF_DEFAULTS
    from .verify_reference import reference_check
    from .watch import WatchConfig, benchmark_command, watch_kernel
