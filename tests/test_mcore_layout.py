"""mcore is laid out by stage (README, Layout): every module sits in a stage package, each package
imports only the packages its row allows, and the public face (`mcore.__all__`) is the one it was
before the packages existed. Imports are read with ast: an import inside a function counts like one at
the top; only imports under `if TYPE_CHECKING:` (never run) are exempt."""

from __future__ import annotations

import ast
from pathlib import Path

import mcore

ROOT = Path(__file__).resolve().parents[1]
MCORE = ROOT / "mcore"

# package -> the packages it may import (itself always). In the order of the flow: a package imports
# only packages before it, except the module-level exceptions below. The README's Layout table says
# the same in words; change both together.
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "model": {"common"},
    "ops": {"common"},
    "families": {"common", "model", "ops"},
    "graph": {"common"},
    "selection": {"common", "model", "families", "graph"},
    "bundle": {"common", "model", "families", "graph", "selection"},
    "kernels": {"common", "model", "graph", "selection"},
    "engines": {"common", "model", "ops", "families", "graph", "selection", "bundle"},
    "runtime": {"common", "model", "ops", "families", "graph", "selection", "bundle", "kernels", "engines"},
    "verify": {"common", "model", "families", "graph", "selection", "bundle", "kernels", "engines", "runtime"},
    "profile": {"common", "model", "ops", "families", "graph", "selection", "bundle", "engines", "runtime"},
}
ALLOWED["cli"] = set(ALLOWED)  # the command line may call every stage

# module -> what it may import beyond its package's row, and why
EXCEPTIONS: dict[str, set[str]] = {
    # the cache root is the folder demo models are materialized under; families.demo defines it
    "mcore.common.cache": {"mcore.families.demo"},
    # abi_lines shows a receipt's call ABI next to the graph it was selected from
    "mcore.graph.display": {"mcore.selection.receipt"},
    # capture is the model -> graph step: it builds a family's model, annotates recipe instances and
    # sizes the weights it will need (bundle.contents' device_memory / state_bytes)
    "mcore.graph.capture": {
        "mcore.model.buildargs",
        "mcore.families",
        "mcore.families.base",
        "mcore.families.graph_args",
        "mcore.families.source",
        "mcore.selection.recipes",
        "mcore.bundle.contents",
    },
    # the role helper process compiles a pipeline's roles and needs its decode buffers
    "mcore.engines.role_helper": {"mcore.runtime.pipeline"},
}

# the modules that may stay at the top: the public face and `python -m mcore`
TOP_LEVEL = {"mcore", "mcore.__main__"}

# mcore.__all__ before the layout (on main before the move): users see the same names
PUBLIC_NAMES = [
    "BINDINGS_SCHEMA_VERSION", "Binding", "BindingsManifest", "BuildArgs", "BundleManifest", "CANDIDATE_BINDING",
    "CancelToken", "Cancelled", "DecoderPipeline", "EncoderPipeline", "LAYOUTS", "NO_PROGRESS", "Node",
    "PERF_DEFAULTS", "PRECISIONS", "Progress", "Receipt", "RecipeRow", "RegionError", "SHIPPED_EXPORTERS",
    "SlotRecord", "Snapshot", "Tensor", "UserError", "WEIGHTS", "WatchConfig", "abi_lines", "atomic_write",
    "benchmark_command", "build_bundle", "build_kernel", "bundle_kind", "capture", "check_fields", "check_overwrite",
    "check_path_text", "check_std_streams", "compare_embeddings", "compare_tokens", "demo_names", "describe_device",
    "device_facts", "family_kind", "find_recipe", "kernel_catalog", "library_sha256", "load_bindings_manifest",
    "load_profile", "load_receipt", "load_snapshot", "lockstep_logits", "model_kind", "module_tree", "node_matches",
    "node_row", "open_bundle", "open_pipeline", "perf_gate", "profile_pipeline", "read_json", "recipe_rows",
    "reference_check", "resolve", "run_exporter", "select_recipe", "select_region", "set_cache_note_sink",
    "shipped_exporter", "stdout_failed", "tool_versions", "watch_kernel", "write_exporter", "write_json",
]  # fmt: skip
# added on purpose beside the move (issue 29): the one gate implementation (verify/gates.py) and the exporter
# kit that generated stubs import (kernels/exporter_kit.py)
PUBLIC_NAMES += ["BenchArms", "EmbeddingsGate", "GateHooks", "LogitsGate", "PerfGate", "PerfOptions"]
# added with the check that a bindings manifest's own faults come before a bundle's hash (thirty-seventh session)
PUBLIC_NAMES += ["open_bound_bundle"]
PUBLIC_NAMES += ["ReferenceGate", "TokensGate", "exporter_kit"]
# what the kernel watch hands its caller each round (the workbench keeps them typed)
PUBLIC_NAMES += ["WatchRound"]
# what the gates return, their numbers typed per gate (mcore/verify/details.py)
PUBLIC_NAMES += ["GateResult", "TokensDetails", "EmbeddingsDetails", "ReferenceDetails", "LogitsDetails", "PerfDetails"]
# what profile_pipeline and load_profile return, typed (mcore/profile/report.py)
PUBLIC_NAMES += ["ProfileReport", "ProfileCandidate", "PartialProfile"]
# a profile's values checked against an opened bundle before its pipeline loads (the CLI and the workbench)
PUBLIC_NAMES += ["check_bundle_request"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _run_time_imports(tree: ast.AST):
    """Every import statement that can run (at the top or inside a function), not under TYPE_CHECKING."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _run_time_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _run_time_imports(node)


def _targets(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The mcore modules (or mcore itself, for a name of its own) an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "mcore"]
    if node.level:
        package = _module_name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != "mcore":
        return []
    # `from pkg import sub` loads the module pkg.sub; `from mod import name` loads mod
    return [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]


def _mcore_imports():
    for path in sorted(MCORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _run_time_imports(tree):
            for target in _targets(path, node):
                yield path, node.lineno, _module_name(path), target, node


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_sits_in_a_stage_package():
    loose = [_module_name(p) for p in MCORE.glob("*.py") if _module_name(p) not in TOP_LEVEL]
    assert not loose, f"put these in a stage package (README, Layout) or name them in TOP_LEVEL: {loose}"
    packages = {p.parent.name for p in MCORE.glob("*/__init__.py")}
    assert packages == set(ALLOWED), f"every package needs a row in ALLOWED (and the README): {packages ^ set(ALLOWED)}"


def test_packages_import_only_what_their_row_allows():
    bad = []
    for path, line, module, target, node in _mcore_imports():
        if module in TOP_LEVEL:
            continue  # mcore/__init__ resolves the public names lazily; __main__ starts the CLI
        here, there = _package(module), _package(target)
        if target == "mcore":
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if names == ["__version__"]:
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line}: imports {names} from mcore itself (only __version__ may be)")
            continue
        if there == here or there in ALLOWED[here] or target in EXCEPTIONS.get(module, set()):
            continue
        bad.append(f"{path.relative_to(ROOT)}:{line}: {module} ({here}) imports {target} ({there})")
    assert not bad, "imports outside the allowed rows (README, Layout):\n" + "\n".join(bad)


def test_the_rules_see_lazy_imports_and_skip_type_checking_ones(tmp_path):
    """The parser the rules rest on: an import inside a function counts, one under TYPE_CHECKING does not."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "from ..common.errors import UserError\n"
        "if TYPE_CHECKING:\n"
        "    from ..runtime.pipeline import Pipeline\n"
        "def f():\n"
        "    from ..verify import gates\n"
        "    from .. import __version__\n"
    )
    path = MCORE / "kernels" / "example.py"  # not written: the parser needs only where it would sit
    found = [t for node in _run_time_imports(ast.parse(src)) for t in _targets(path, node)]
    assert found == ["mcore.common.errors", "mcore.verify.gates", "mcore"]


def test_the_exceptions_are_still_needed():
    """An exception nothing uses any more is removed, so the rules stay as tight as the code."""
    used = {(module, target) for _, _, module, target, _ in _mcore_imports()}
    stale = [f"{m} -> {t}" for m, ts in EXCEPTIONS.items() for t in ts if (m, t) not in used]
    assert not stale, f"remove these from EXCEPTIONS (and the README): {stale}"


def test_mcore_never_imports_the_workbench():
    bad = []
    for path in sorted(MCORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}" for m in mods if m.split(".")[0] == "workbench"]
    assert not bad, bad


def test_the_public_face_is_unchanged():
    assert sorted(mcore.__all__) == sorted(PUBLIC_NAMES)
    assert set(mcore._EXPORTS) == set(PUBLIC_NAMES)
    for sub in set(mcore._EXPORTS.values()):
        assert _is_module(f"mcore.{sub}"), f"_EXPORTS names mcore.{sub}, which does not exist"
