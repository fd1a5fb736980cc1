"""The edit-export-verify loop on CPU (issue 30): `mcore kernel watch` and mcore.watch_kernel with an
exporter that compiles a CPU TVM-FFI DSO for the tutorial's logits-copy receipt. A file change is
a rewrite of the exporter; `rounds` stops the loop. Each round binds a new DSO to new pipelines:
the first round's library and a pipeline bound to it are untouched by later rounds."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from pathlib import Path

import pytest

from mcore.common.errors import Cancelled
from mcore.common.progress import CancelToken, Progress
from mcore.verify.watch import WatchConfig, benchmark_command, watch_kernel
from workbench.results import BundleBuilt
from workbench.state import Applied, LastPrompt

from . import scaled_copy
from .conftest import assert_user_error

RID = "qwen.decode_logits_copy@1"
PROMPT = "hello world"

# An exporter of tests/scaled_copy.py's kernel: scale 1.0f is exact (the region copies), 2.0f is wrong.
EXPORTER = r'''
import argparse, pathlib, shutil, tempfile
import tvm_ffi.cpp

SCALE = "@SCALE@"
SOURCE = """@SOURCE@"""
p = argparse.ArgumentParser()
p.add_argument("--selection"); p.add_argument("--output"); p.add_argument("--snapshot")
ns = p.parse_args()
d = pathlib.Path(tempfile.mkdtemp())
(d / "k.cc").write_text(SOURCE.replace("SCALE_VALUE", SCALE))
lib = tvm_ffi.cpp.build("scaled_copy", cpp_files=[str(d / "k.cc")], build_directory=str(d / "b"))
shutil.copyfile(lib, ns.output)
print("dso=" + ns.output)
'''


def write_exporter(path: Path, scale: str) -> Path:
    path.write_text(EXPORTER.replace("@SOURCE@", scaled_copy.SOURCE).replace("@SCALE@", scale))
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from mcore.bundle.build import build_bundle
    from mcore.model.buildargs import BuildArgs

    d = tmp_path_factory.mktemp("watch")
    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64)
    native = build_bundle(args, d / "native.bundle")
    slot = build_bundle(args, d / "slot.bundle", recipe=(RID, "decoder.logits_zero_bias"))
    return d, native.bundle_path, slot.bundle_path, slot.receipt_path


def config(bundles, exporter: Path, out: Path, **kw) -> WatchConfig:
    _, native, slot, receipt = bundles
    return WatchConfig(str(exporter), receipt, native, slot, out, PROMPT, max_new_tokens=4, device="cpu", **kw)


def test_rounds_follow_the_edits_each_on_a_new_dso_and_new_pipelines(bundles, tmp_path):
    from mcore.runtime.pipeline import DecoderPipeline

    _, native, slot, _ = bundles
    exporter = write_exporter(tmp_path / "export_scaled.py", "1.0f")
    held: dict = {}

    def on_round(r) -> None:  # the author saves the next version once a round is shown
        if r.index == 1:  # a pipeline bound to round 1's DSO, kept across the later rounds
            held["pipe"] = DecoderPipeline(str(slot), kernel_bindings=str(r.manifest), device="cpu")
            held["digest"] = hashlib.sha256(r.library.read_bytes()).hexdigest()
            write_exporter(exporter, "2.0f")
        elif r.index == 2:
            exporter.write_text("this is not Python (\n")

    rounds = watch_kernel(config(bundles, exporter, tmp_path / "rounds", perf=False), rounds=3, on_round=on_round)
    assert [r.verdict for r in rounds] == ["PASS", "REJECT", "ERROR"]
    first, second, third = rounds
    assert first.max_abs == 0.0 and first.correctness == "PASS"  # an exact copy: bit-identical logits
    assert second.max_abs > 0 and second.correctness == "FAIL" and "FAIL: logits" in second.note
    assert "exporter export_scaled.py failed" in third.note and third.library is None
    assert [r.library.name for r in rounds[:2]] == ["round-1.so", "round-2.so"]
    assert hashlib.sha256(first.library.read_bytes()).hexdigest() == held["digest"]
    # the pipeline made in round 1 still runs round 1's kernel: nothing rebound it
    ref = DecoderPipeline(str(native), device="cpu").generate(PROMPT, 4, stop_at_eos=False).tokens
    assert held["pipe"].generate(PROMPT, 4, stop_at_eos=False).tokens == ref
    assert all(r.seconds > 0 and re.fullmatch(r"\d\d:\d\d:\d\d", r.clock) for r in rounds)


def test_an_unchanged_save_starts_no_round_and_cancel_stops_the_wait(bundles, tmp_path):
    exporter = write_exporter(tmp_path / "export_scaled.py", "1.0f")
    token = CancelToken()
    seen = []

    def on_round(r) -> None:
        seen.append(r.verdict)
        exporter.write_text(exporter.read_text())  # saved, but the same content

        def later() -> None:
            time.sleep(1.0)
            token.cancel()

        threading.Thread(target=later, daemon=True).start()

    with pytest.raises(Cancelled):
        watch_kernel(
            config(bundles, exporter, tmp_path / "rounds", perf=False),
            progress=Progress(None, token),
            on_round=on_round,
            poll_s=0.1,
        )
    assert seen == ["PASS"]


def test_cli_prints_one_line_per_round_with_the_perf_gate(bundles, tmp_path, mcore):
    _, native, slot, receipt = bundles
    exporter = write_exporter(tmp_path / "export_scaled.py", "1.0f")
    out = tmp_path / "rounds"

    def edit_after_round_one() -> None:  # the file changes while round 1 runs: round 2 follows it
        deadline = time.monotonic() + 600
        while not (out / "round-1.bindings.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        write_exporter(exporter, "2.0f")

    threading.Thread(target=edit_after_round_one, daemon=True).start()
    r = mcore(
        "kernel", "watch", exporter, "--selection", receipt, "--bundle", slot, "--native", native,
        "--prompt", PROMPT, "--max-new-tokens", "4", "--device", "cpu", "--out-dir", out, "--rounds", "2",
        "--pairs", "2", "--warmup", "0", "--bench-warmup", "0", "--bench-runs", "1", "--poll", "0.1",
    )  # fmt: skip
    lines = r.out.strip().splitlines()
    assert len(lines) == 2, r
    one = re.match(r"round 1 \d\d:\d\d:\d\d max_abs=0 ratio=(\S+) verdict=(\S+) \(", lines[0])
    assert one, lines[0]
    ratio, verdict = float(one[1]), one[2]
    # on a shared CPU the ratio is noise; the verdict is the perf gate's over it, never a guess
    assert ratio > 0 and verdict in ("PROMOTE", "REJECT", "INCONCLUSIVE")
    assert f"{verdict}: external/native" in lines[0]  # the perf gate's own verdict line
    assert re.match(r"round 2 \S+ max_abs=[0-9.e+-]+ ratio=- verdict=REJECT .*FAIL: logits", lines[1]), lines[1]
    assert float(re.search(r"max_abs=(\S+)", lines[1])[1]) > 0
    assert r.code == 1  # the last round was rejected
    assert "watching" in r.err and "runs native code" in r.err


def test_the_perf_arms_run_where_the_watch_runs(tmp_path):
    """`--device cpu` on a GPU box: the gate's fresh processes run on the CPU too (they ran on
    CUDA, where a CPU-built kernel cannot load, and every round's gate failed); the parsed
    command is what `mcore run` receives."""
    import shlex

    cmd = benchmark_command("decoder", tmp_path / "s.bundle", "b.json", "a b", 4, 0, 3, "cpu", "torch")
    argv = shlex.split(cmd.split(" ", 1)[1] if cmd.startswith("PYTHONPATH=") else cmd)
    i = argv.index("run")
    assert argv[i + 1] == str(tmp_path / "s.bundle") and argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--engine") + 1] == "torch" and argv[argv.index("--kernel-bindings") + 1] == "b.json"
    default = shlex.split(benchmark_command("encoder", tmp_path / "e.bundle", None, "x", None, 0, 3).split(" ", 1)[-1])
    assert "embed" in default and "--device" not in default and "--engine" not in default


def test_bad_input_is_one_line_before_anything_runs(bundles, tmp_path, mcore):
    _, native, slot, receipt = bundles
    exporter = write_exporter(tmp_path / "export_scaled.py", "1.0f")
    base = ["kernel", "watch", exporter, "--selection", receipt, "--native", native]
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("keep")
    assert_user_error(mcore(*base, "--bundle", slot, "--out-dir", tmp_path / "used"), "is not empty")
    assert_user_error(mcore(*base, "--bundle", native, "--out-dir", tmp_path / "o1"), "no kernel slot of binding")
    assert_user_error(mcore(*base, "--bundle", slot, "--rounds", "0"), "--rounds 0 must be at least 1")
    assert_user_error(mcore(*base, "--bundle", slot, "--min-ratio", "nan", "--out-dir", tmp_path / "o2"), "--min-ratio")
    # the perf gate's flags beside --no-perf would change nothing
    r = mcore(*base, "--bundle", slot, "--no-perf", "--pairs", "5", "--min-ratio", "1.1", "--out-dir", tmp_path / "o3")
    assert_user_error(r, "--pairs, --min-ratio tune the perf gate, and --no-perf turns it off")
    # a device this machine lacks (no GPU, or not that many) used to export and fail in every round
    for device, says in (("tpu", "--device 'tpu' is not a device"), ("cuda:99", "--device cuda:99: ")):
        assert_user_error(mcore(*base, "--bundle", slot, "--device", device, "--out-dir", tmp_path / "o3"), says)
    missing = ["kernel", "watch", tmp_path / "nope.py", "--selection", receipt, "--native", native, "--bundle", slot]
    assert_user_error(mcore(*missing), "nope.py: no such file")
    assert (tmp_path / "used" / "x").read_text() == "keep"
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_swapped_bundles_and_a_stub_without_snapshot_are_refused_before_round_one(bundles, tmp_path, mcore):
    # each used to export round 1 (writing its DSO) and only then fail, with advice watch cannot take
    from mcore.kernels.stubgen import write_exporter as write_stub
    from mcore.selection.region import select_region

    from .graphs import dag_snapshot

    _, native, slot, receipt = bundles
    exporter = write_exporter(tmp_path / "export_scaled.py", "1.0f")
    out = tmp_path / "rounds"
    swapped = ["kernel", "watch", exporter, "--selection", receipt, "--native", slot, "--bundle", slot]
    r = mcore(*swapped, "--out-dir", out, "--rounds", "1")
    assert_user_error(r, f"{slot} has kernel slots (1: ", "the native bundle must be one without slots")
    snap = dag_snapshot(4, [(0, 2), (1, 2), (2, 3)])
    (tmp_path / "g.json").write_text(json.dumps(snap))
    (tmp_path / "s.json").write_text(json.dumps(select_region(snap, ["node:2"], "k@1").to_dict()))
    write_stub(tmp_path / "s.json", tmp_path / "g.json", tmp_path / "my_add.py")
    stub = ["kernel", "watch", tmp_path / "my_add.py", "--selection", receipt, "--native", native, "--bundle", slot]
    assert_user_error(mcore(*stub, "--out-dir", out, "--rounds", "1"), "my_add.py is a stub", "pass --snapshot")
    assert not out.exists() or not any(out.iterdir())


# ------------------------------------------------------------------ the loop in the workbench


@pytest.fixture
def kernel_screen_state(bundles, tmp_path):
    """A workbench state with the receipt, both bundles and the exporter (as the stub) in place."""
    from workbench.app import WorkbenchState

    d, native, slot, receipt = bundles
    exporter = write_exporter(tmp_path / "export_scaled.py", "1.0f")
    st = WorkbenchState(workdir=tmp_path, device="cpu")

    def built(bundle) -> Applied[BundleBuilt]:
        return Applied("build_bundle", {}, BundleBuilt(bundle=str(bundle), fingerprints={}, kernel_slots=()))

    st.bundles = {"native": built(native), "slot": built(slot)}
    from mcore import load_receipt

    st.receipt, st.receipt_path = load_receipt(receipt), str(receipt)
    st.stub_path, st.stub_text = str(exporter), exporter.read_text()
    st.last_prompt = LastPrompt(PROMPT, 4)
    st.watch_settings = {"perf": False, "max_new_tokens": 4}  # the perf gate's rounds: the CLI test above
    return st, exporter


@pytest.mark.asyncio
async def test_kernel_screen_edits_in_the_editor_and_watches_every_save(kernel_screen_state, tmp_path, monkeypatch):
    from textual.widgets import DataTable

    from workbench.app import WorkbenchApp
    from workbench.screens.dialogs import TrustModal

    st, exporter = kernel_screen_state
    editor = tmp_path / "editor.sh"  # an "editor" that makes the author's change: scale by 2
    editor.write_text("#!/bin/sh\nsed -i 's/\"1.0f\"/\"2.0f\"/' \"$1\"\n")
    editor.chmod(0o755)
    monkeypatch.setenv("EDITOR", str(editor))
    monkeypatch.delenv("VISUAL", raising=False)
    app = WorkbenchApp(state=st, start_screen="kernel")

    async def until(cond, timeout=600) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            await pilot.pause(0.1)

    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("v")
        await pilot.pause(0.1)
        assert isinstance(app.screen, TrustModal)  # it runs the script and loads what it exports
        await pilot.press("y")
        await until(lambda: len(st.watch_rounds) == 1)
        assert app.busy == "kernel_watch" and st.watch_rounds[0].verdict == "PASS"
        assert st.watch_rounds[0].max_abs == 0.0
        await pilot.press("o")  # the editor saves the change: the running watch takes it
        await pilot.pause(0.1)
        assert '"2.0f"' in exporter.read_text() and '"2.0f"' in st.stub_text  # the stub view shows the edit
        await until(lambda: len(st.watch_rounds) == 2)
        second = st.watch_rounds[1]
        assert second.verdict == "REJECT" and second.max_abs is not None and second.max_abs > 0
        table = app.screen.query_one("#watch-history", DataTable)
        assert table.display and table.row_count == 2
        assert [str(table.get_row_at(i)[4]) for i in range(2)] == ["PASS", "REJECT"]
        assert "round 2: REJECT" in app.message[0]
        await pilot.press("x")  # stops while it waits for the next save
        await until(lambda: app.busy is None, timeout=30)
        assert app.last_outcome.kind == "cancelled" and len(st.watch_rounds) == 2
        assert sorted(p.name for p in (tmp_path / "watch").iterdir()) == [
            "round-1.bindings.json",
            "round-1.so",
            "round-2.bindings.json",
            "round-2.so",
        ]


@pytest.mark.asyncio
async def test_kernel_screen_says_what_the_watch_and_the_editor_need(tmp_path, monkeypatch):
    from workbench.app import WorkbenchApp, WorkbenchState

    from .tui_helpers import text_of

    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    app = WorkbenchApp(state=WorkbenchState(workdir=tmp_path), start_screen="kernel")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("v")
        await pilot.pause(0.1)
        assert "the watch needs an exporter (s generates the stub), a receipt (F3)" in text_of(app, "#error")
        await pilot.press("escape", "o")
        await pilot.pause(0.1)
        assert "no exporter to edit yet" in text_of(app, "#error")
        app.state.stub_path = str(write_exporter(tmp_path / "export_x.py", "1.0f"))
        await pilot.press("escape", "o")
        await pilot.pause(0.1)
        assert "set $EDITOR (or $VISUAL)" in text_of(app, "#error")


def test_a_gpu_kernel_watched_on_the_cpu_is_exported_and_left_unjudged(tmp_path, mcore):
    """The shipped CuTe DSL exporter on a CPU run: each round compiles the kernel (its own checks
    run) and says EXPORTED with why the gates cannot run, instead of an ERROR from the kernel's first
    call on CPU tensors; the exit code is `verify`'s cannot-tell 3."""
    from mcore.bundle.build import build_bundle
    from mcore.model.buildargs import BuildArgs

    args = BuildArgs(model="demo:qwen3-tiny-hd64", precision="bf16", max_cache_length=64)
    native = build_bundle(args, tmp_path / "native.bundle").bundle_path
    slot = build_bundle(
        args, tmp_path / "slot.bundle", recipe=("qwen.decode_attention_region@2", "decoder.layers.0.decode_attention")
    )
    out = tmp_path / "rounds"
    r = mcore(
        "kernel", "watch", "cutedsl-decode-attention", "--selection", slot.receipt_path, "--bundle",
        slot.bundle_path, "--native", native, "--device", "cpu", "--out-dir", out, "--rounds", "1",
    )  # fmt: skip
    line = r.out.strip()
    assert re.match(r"round 1 \S+ max_abs=- ratio=- verdict=EXPORTED ", line), r
    # sm_90a on a machine without a GPU, "the visible GPU" on one; the advice names where to watch it
    assert re.search(
        r"exported for (sm_90a; .* runs on cpu \(no CUDA GPU here\): watch it on a GPU machine"
        r"|the visible GPU; .* runs on cpu, though this machine has one: watch it on device cuda)",
        line,
    ), line
    assert (out / "round-1.so").is_file() and (out / "round-1.bindings.json").is_file()
    assert r.code == 3 and "arch=" in r.err
