"""mcore's public API (mcore/__init__.py): the workbench imports only the names in mcore.__all__,
each resolves lazily to its submodule's object, `import mcore` stays cheap (no torch), and mcore
never imports the workbench."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import mcore

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path):
    """(line, module) for every import statement in a file; `from .x import` inside mcore is relative."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_workbench_imports_only_the_public_api():
    files = sorted((ROOT / "workbench").rglob("*.py"))
    assert files
    bad = [
        f"{f.relative_to(ROOT)}:{line}: {mod}" for f in files for line, mod in _imports(f) if mod.startswith("mcore.")
    ]
    assert not bad, "workbench must import from `mcore` only (add the name to mcore.__all__):\n" + "\n".join(bad)


def test_workbench_names_are_public():
    """`from mcore import NAME` in the workbench names only what mcore.__all__ lists."""
    public = set(mcore.__all__)
    bad = []
    for f in sorted((ROOT / "workbench").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "mcore":
                bad += [
                    f"{f.relative_to(ROOT)}:{node.lineno}: {a.name}"
                    for a in node.names
                    if a.name not in public and a.name != "__version__"
                ]
    assert not bad, "\n".join(bad)


def test_mcore_never_imports_workbench():
    bad = [
        f"{f.relative_to(ROOT)}:{line}: {mod}"
        for f in sorted((ROOT / "mcore").rglob("*.py"))
        for line, mod in _imports(f)
        if mod == "workbench" or mod.startswith("workbench.")
    ]
    assert not bad, "\n".join(bad)


def test_all_matches_the_export_table():
    assert sorted(mcore.__all__) == sorted(mcore._EXPORTS)
    assert len(set(mcore.__all__)) == len(mcore.__all__)


@pytest.mark.parametrize("name", sorted(mcore._EXPORTS))
def test_every_public_name_is_its_submodules_object(name):
    sub = importlib.import_module(f"mcore.{mcore._EXPORTS[name]}")
    assert getattr(mcore, name) is getattr(sub, name)
    ns: dict = {}
    exec(f"from mcore import {name}", ns)
    assert ns[name] is getattr(sub, name)


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        mcore.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from mcore import no_such_name", {})


def test_dir_lists_the_public_names():
    listed = dir(mcore)
    assert set(mcore.__all__) <= set(listed)
    assert "__version__" in listed


def test_import_mcore_is_cheap():
    """A fresh `import mcore` loads no torch (and nothing from the workbench); touching a light
    name still loads no torch."""
    code = (
        "import sys, mcore\n"
        "assert 'torch' not in sys.modules, 'import mcore imported torch'\n"
        "assert not any(m == 'workbench' or m.startswith('workbench.') for m in sys.modules)\n"
        "from mcore import UserError, Progress, NO_PROGRESS, open_bundle, write_json\n"
        "assert 'torch' not in sys.modules, 'a light name imported torch'\n"
        "print(mcore.__version__)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == mcore.__version__


@pytest.fixture(scope="module")
def demo_bundles(tmp_path_factory):
    from mcore import BuildArgs, build_bundle

    d = tmp_path_factory.mktemp("api")
    dec = build_bundle(BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64), d / "q.bundle")
    enc = build_bundle(BuildArgs(model="demo:distilbert-tiny", precision="fp32"), d / "e.bundle")
    return dec.bundle_path, enc.bundle_path


def test_open_pipeline_picks_the_class_from_the_family_kind(demo_bundles):
    from mcore import DecoderPipeline, EncoderPipeline, open_bundle, open_pipeline

    dec, enc = demo_bundles
    p = open_pipeline(str(dec), device="cpu")
    assert type(p) is DecoderPipeline and p.KIND == "decoder"
    b = open_bundle(enc)
    p = open_pipeline(b, device="cpu")  # an opened bundle is used as is
    assert type(p) is EncoderPipeline and p.bundle is b


def test_the_graph_ir_knows_no_model_family():
    """mcore/graph is the IR (snapshots, display); capture, which needs families and recipes, sits
    above it in mcore/graph/capture.py. Importing the IR must not pull in a family."""
    import subprocess
    import sys

    code = (
        "import sys, mcore.graph.snapshot, mcore.graph.display, mcore.graph.categories; "
        "print(sorted(m for m in sys.modules if m.startswith(('mcore.families', 'mcore.selection.recipes'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
