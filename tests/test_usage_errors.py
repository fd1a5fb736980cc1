"""The third exploratory pass: mistakes a user makes at the command line (a folder for an output, the
wrong kind of file, a stub exported without its snapshot), each one line and exit 2 before any work,
nothing written; and the exporter's `dso=` line naming the file the user asked for."""

from __future__ import annotations

import json

import pytest

from mcore.selection.region import select_region

from .conftest import DISTIL_ARGS, QWEN_ARGS, assert_user_error
from .graphs import dag_snapshot


def _write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A snapshot with an add (node:2) and its receipt in work/, the cwd at tmp_path."""
    snap = dag_snapshot(4, [(0, 2), (1, 2), (2, 3)])
    w = tmp_path / "work"
    w.mkdir()
    _write(w / "g.graph.json", snap)
    _write(w / "add.selection.json", select_region(snap, ["node:2"], "k@1").to_dict())
    monkeypatch.chdir(tmp_path)
    return w


# ---------------------------------------------------------------- an output path that names a folder


@pytest.mark.parametrize(
    "argv",
    [
        ("build", *QWEN_ARGS, "-o", "out/"),
        ("build", *QWEN_ARGS, "--recipe", "qwen.decode_logits_copy@1", "decoder.logits_zero_bias", "-o", "out/"),
        ("graph", "inspect", "--engine-role", "decode", "--snapshot", "out/", *QWEN_ARGS),
        ("graph", "select", "work/g.graph.json", "--nodes", "node:2", "--binding-id", "k@1", "-o", "out/"),
        ("kernel", "build", "identity-copy", "-o", "out/"),
    ],
    ids=["build", "build-recipe", "graph-inspect", "graph-select", "kernel-build"],
)
def test_an_output_ending_in_a_slash_is_refused_and_nothing_is_written(work, mcore, argv):
    # Path("out/") is "out": the file would be written where the user meant a folder
    before = sorted(p.name for p in work.parent.iterdir())
    assert_user_error(mcore(*argv), "out/: ends in '/', which names a folder; give a file path for the output")
    assert sorted(p.name for p in work.parent.iterdir()) == before


def test_run_output_ending_in_a_slash_is_refused_before_the_bundle_loads(work, mcore):
    # checked before the (long) bundle load: the bundle named here does not even exist
    r = mcore("run", "work/none.bundle", "--prompt", "hi", "--output", "out/")
    assert_user_error(r, "out/: ends in '/'")


def test_a_folder_output_that_exists_is_still_named_a_folder(work, mcore):
    (work.parent / "out").mkdir()
    assert_user_error(mcore("kernel", "build", "identity-copy", "-o", "out/"), "out/: ends in '/'")


# ---------------------------------------------------------------- the wrong kind of file


def test_a_receipt_given_as_a_snapshot_is_named_by_its_kind(work, mcore):
    r = mcore("graph", "list", "work/add.selection.json")
    assert_user_error(r, "work/add.selection.json: kind is 'mcore.selection_receipt', not a graph snapshot")


def test_a_snapshot_given_as_a_receipt_is_named_by_its_kind(work, mcore):
    r = mcore("build", *QWEN_ARGS, "--graph-patch", "work/g.graph.json", "-o", "work/x.bundle")
    assert_user_error(r, "work/g.graph.json: kind is 'mcore.graph_snapshot'")
    assert not (work / "x.bundle").exists()


def test_a_binary_file_given_as_json_says_it_is_not_text(work, mcore):
    (work / "lib.so").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe" * 50)
    assert_user_error(mcore("graph", "list", "work/lib.so"), "work/lib.so: is not a text file, so not a graph snapshot")
    r = mcore("kernel", "stub", "work/lib.so", "--snapshot", "work/g.graph.json", "-o", "k.py")
    assert_user_error(r, "work/lib.so: is not a text file, so not a")


# ---------------------------------------------------------------- exporters


def test_a_stub_exported_without_its_snapshot_is_one_line_before_it_runs(work, mcore):
    stub = ("kernel", "stub", "work/add.selection.json", "--snapshot", "work/g.graph.json", "-o", "my_add.py")
    assert mcore(*stub).code == 0
    r = mcore("kernel", "export", "my_add.py", "--selection", "work/add.selection.json", "-o", "work/my.so")
    assert_user_error(r, "exporter my_add.py is a stub: it checks the graph snapshot too; pass --snapshot SNAPSHOT")
    assert r.out == "" and not list(work.glob("*my.so*"))  # the exporter never started


EXPORTER = """
import argparse, pathlib, shutil
p = argparse.ArgumentParser()
p.add_argument("--selection"); p.add_argument("--output"); p.add_argument("--snapshot")
ns = p.parse_args()
shutil.copyfile(sys_so, ns.output)
print("dso=" + str(pathlib.Path(ns.output).resolve()))
"""


def test_export_reports_the_dso_at_the_path_asked_for(work, mcore, tmp_path):
    # the exporter writes a temporary file that is renamed into place: its `dso=` names the final path
    assert mcore("kernel", "build", "identity-copy", "-o", "work/k.so", "--cuda", "off").code == 0
    script = EXPORTER.replace("sys_so", repr(str(work / "k.so")))
    (tmp_path / "export_k.py").write_text(script)
    r = mcore("kernel", "export", "export_k.py", "--selection", "work/add.selection.json", "-o", "work/out.so")
    assert r.code == 0, r
    dso = [line for line in r.out.splitlines() if line.startswith("dso=")]
    assert dso == [f"dso={(work / 'out.so').resolve()}"], r.out
    assert (work / "out.so").read_bytes() == (work / "k.so").read_bytes()
    assert sorted(p.name for p in work.iterdir()) == ["add.selection.json", "g.graph.json", "k.so", "out.so"]


# ---------------------------------------------------------------- engine roles


def test_the_tutorials_decode_role_captures_distilberts_one_role(tmp_path, mcore):
    r = mcore("graph", "inspect", "--engine-role", "decode", "--snapshot", tmp_path / "d.graph.json", *DISTIL_ARGS)
    assert r.code == 0, r
    assert "engine_role=encoder " in r.out
    assert "note: distilbert has one engine role, 'encoder'; captured it for 'decode'" in r.err
    assert json.loads((tmp_path / "d.graph.json").read_text())["metadata"]["engine_role"] == "encoder"
    # the same graph as `--engine-role encoder` gives, so receipts from either are interchangeable
    r2 = mcore("graph", "inspect", "--engine-role", "encoder", "--snapshot", tmp_path / "e.graph.json", *DISTIL_ARGS)
    assert r2.code == 0 and "note:" not in r2.err
    fp = [json.loads((tmp_path / f).read_text())["fingerprint"] for f in ("d.graph.json", "e.graph.json")]
    assert fp[0] == fp[1]


@pytest.mark.parametrize(
    "args,role,names",
    [(DISTIL_ARGS, "prefill", "use one of: encoder"), (QWEN_ARGS, "encoder", "use one of: prefill, decode")],
)
def test_other_unknown_roles_are_still_refused(tmp_path, mcore, args, role, names):
    r = mcore("graph", "inspect", "--engine-role", role, "--snapshot", tmp_path / "x.graph.json", *args)
    assert_user_error(r, f"engine role {role!r} does not exist", names)
    assert not (tmp_path / "x.graph.json").exists()


@pytest.mark.parametrize(
    ("names", "shown"),
    [([], ""), (["a"], "a"), (["a", "b", "c"], "a, b, c"), (["a", "b", "c", "d"], "a, b, c, …")],
)
def test_a_message_names_the_first_three_and_says_when_there_are_more(names, shown):
    from mcore.common.errors import first_few

    assert first_few(names) == shown


# ---------------------------------------------------------------- an empty path (an unset shell variable)


@pytest.mark.parametrize(
    "argv,flag",
    [
        (("build", *QWEN_ARGS, "--graph-patch", "", "-o", "out.bundle"), "--graph-patch"),
        (("run", "work/none.bundle", "--prompt", "hi", "--output", ""), "--output"),
        (("run", "work/none.bundle", "--prompt", "hi", "--kernel-bindings", ""), "--kernel-bindings"),
        (("inspect", ""), "bundle"),
        (("verify", "tokens", "work/a.jsonl", ""), "external"),
        (("graph", "select", "work/g.graph.json", "--nodes", "node:2", "--binding-id", "k@1", "-o", ""), "-o/--output"),
        (
            ("kernel", "export", "x.py", "--selection", "work/add.selection.json", "--snapshot", "", "-o", "k.so"),
            "--snapshot",
        ),
    ],
    ids=[
        "build-graph-patch",
        "run-output",
        "run-bindings",
        "inspect",
        "verify-tokens",
        "graph-select",
        "kernel-export",
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_folder_or_a_flag_not_given(work, mcore, argv, flag):
    # `--graph-patch ""` built a native bundle as if no patch were asked for; `--output ""` printed the
    # text instead of writing records; an empty input read as "." ("is a directory")
    before = sorted(p.name for p in work.parent.iterdir())
    assert_user_error(mcore(*argv), f"argument {flag}: the path is empty")
    assert sorted(p.name for p in work.parent.iterdir()) == before


def test_an_empty_path_given_to_the_readers_names_what_is_missing():
    # the workbench's fields and Python callers reach these without argparse in front
    from mcore import UserError
    from mcore.bundle.container import open_bundle
    from mcore.common.fileio import read_json

    with pytest.raises(UserError, match=r"^the kernel bindings manifest path is empty; name the kernel bindings"):
        read_json("", "kernel bindings manifest")
    with pytest.raises(UserError, match=r"^the bundle path is empty"):
        open_bundle("")


def test_a_recipe_the_family_does_not_publish_is_refused_before_any_capture(work, mcore):
    # the family's recipes are known from config.json: no role needs capturing to say so
    r = mcore("build", *QWEN_ARGS, "--recipe", "qwen.nope@1", "x", "-o", "out.bundle")
    assert_user_error(
        r, "recipe 'qwen.nope@1' is not published for this model (recipes: qwen.decode_attention_region@2"
    )
    assert "[" not in r.err  # no progress line: nothing captured
    r = mcore(
        "build", *DISTIL_ARGS, "--recipe", "qwen.decode_logits_copy@1", "decoder.logits_zero_bias", "-o", "o.bundle"
    )
    assert_user_error(r, "(recipes: distilbert.attention_residual_add@1)")
    assert not (work.parent / "out.bundle").exists() and not (work.parent / "o.bundle").exists()
