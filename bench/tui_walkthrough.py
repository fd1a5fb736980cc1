#!/usr/bin/env python3
"""Writes docs/edit-export-verify.md: the edit-export-verify loop as text captures of the workbench
at 80x24 (Textual's pilot; each capture is the screen as a terminal shows it, colours aside), then
the same loop from the CLI. Runs on CPU in a few minutes, with a CPU exporter (a TVM-FFI C++ copy
kernel scaled by a constant the "editor" changes) so that it runs anywhere; with a generated CuTe
DSL stub on a GPU the loop is the same.

    python3 bench/tui_walkthrough.py docs/edit-export-verify.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("WORKBENCH_DEVICE_LINE", "0")  # no device probe: the captures stay the same

RID = "qwen.decode_logits_copy@1"
EXPORTER = '''"""A kernel exporter: out = in * SCALE, compiled for the CPU through TVM-FFI."""
import argparse, pathlib, shutil, tempfile
import tvm_ffi.cpp

SCALE = "1.0f"
SOURCE = """@SOURCE@"""
p = argparse.ArgumentParser()
p.add_argument("--selection"); p.add_argument("--output"); p.add_argument("--snapshot")
ns = p.parse_args()
d = pathlib.Path(tempfile.mkdtemp())
(d / "k.cc").write_text(SOURCE.replace("SCALE_VALUE", SCALE))
lib = tvm_ffi.cpp.build("scaled_copy", cpp_files=[str(d / "k.cc")], build_directory=str(d / "b"))
shutil.copyfile(lib, ns.output)
print("compiled scaled_copy with SCALE=" + SCALE)
print("dso=" + ns.output)
'''.replace("@SOURCE@", (REPO / "kernels" / "scaled_copy.cc").read_text(encoding="utf-8"))


def screen_text(app) -> str:
    """The screen as text, one line a row (what a terminal shows, without the colours)."""
    rows = ["".join(seg.text for seg in list(strip)).rstrip() for strip in app.screen._compositor.render_strips()]
    return "\n".join(rows)


def build(work: Path) -> tuple[Path, Path, Path]:
    from mcore.bundle.build import build_bundle
    from mcore.model.buildargs import BuildArgs

    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=256, decoder_engine_layout="split")
    native = build_bundle(args, work / "qwen3-native.bundle")
    slot = build_bundle(args, work / "qwen3-slot-ready.bundle", recipe=(RID, "decoder.logits_zero_bias"))
    assert slot.receipt_path is not None
    return native.bundle_path, slot.bundle_path, slot.receipt_path


async def tui_captures(work: Path, native: Path, slot: Path, receipt: Path) -> list[tuple[str, str]]:
    from mcore import load_receipt
    from workbench.app import WorkbenchApp, WorkbenchState
    from workbench.results import BundleBuilt
    from workbench.state import Applied

    exporter = work / "export_scaled_copy.py"
    exporter.write_text(EXPORTER)
    editor = work / "editor.sh"  # stands in for the author's editor: one change a save
    editor.write_text(
        '#!/bin/sh\nif grep -q \'"1.0f"\' "$1"; then sed -i \'s/"1.0f"/"2.0f"/\' "$1"; '
        'else sed -i \'s/"2.0f"/"1.0f"/\' "$1"; fi\n'
    )
    editor.chmod(0o755)
    os.environ["EDITOR"] = str(editor)
    st = WorkbenchState(workdir=work, device="cpu")

    def built(bundle: Path) -> Applied[BundleBuilt]:  # what the Build screen leaves in the state
        return Applied("build_bundle", {}, BundleBuilt(bundle=bundle.name, fingerprints={}, kernel_slots=()))

    st.bundles = {"native": built(native), "slot": built(slot)}
    st.receipt, st.receipt_path = load_receipt(receipt), receipt.name
    st.stub_path, st.stub_text = exporter.name, exporter.read_text()
    st.library, st.manifest = None, None
    st.watch_settings = {"perf": False, "max_new_tokens": 8}
    app = WorkbenchApp(state=st, start_screen="kernel")
    shots: list[tuple[str, str]] = []

    async def until(pilot, cond, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            screen = screen_text(app)
            if "✗" in screen:  # an error toast: the walkthrough cannot go on, say what the screen says
                raise SystemExit(f"the workbench reported an error:\n{screen}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out; the screen:\n{screen}")
            await pilot.pause(0.2)
        await pilot.pause(0.3)

    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.5)
        shots.append(("The Kernel screen with the exporter (here the stub) and both bundles", screen_text(app)))
        await pilot.press("v")
        await pilot.pause(0.3)
        shots.append(("`v`: one trust prompt, since every round runs the script and loads its DSO", screen_text(app)))
        await pilot.press("y")
        await until(pilot, lambda: len(st.watch_rounds) == 1)
        shots.append(("Round 1 runs at once: exported, bound to a new pipeline, logits in lockstep", screen_text(app)))
        await pilot.press("o")  # the editor changes SCALE to 2.0f and saves
        await until(pilot, lambda: len(st.watch_rounds) == 2)
        shots.append(
            ("`o` opens $EDITOR; the save (SCALE 2.0f) is round 2, rejected with its max_abs", screen_text(app))
        )
        await pilot.press("o")  # and back to 1.0f
        await until(pilot, lambda: len(st.watch_rounds) == 3)
        shots.append(("Fixed and saved again: round 3 passes; the history keeps every round", screen_text(app)))
        await pilot.press("x")
        await until(pilot, lambda: app.busy is None)
        shots.append(("`x` stops the watch", screen_text(app)))
    return shots


def cli_capture(work: Path, native: Path, slot: Path, receipt: Path) -> str:
    exporter = work / "export_cli.py"
    exporter.write_text(EXPORTER)
    cmd = [
        sys.executable, "-m", "mcore", "kernel", "watch", exporter.name, "--selection", receipt.name,
        "--bundle", slot.name, "--native", native.name, "--device", "cpu", "--rounds", "1",
        "--pairs", "2", "--warmup", "1", "--bench-runs", "3", "--out-dir", "cli-rounds",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    r.stderr = r.stderr.replace(str(work) + "/", "")  # the notices name the DSO by its full path
    return f"$ mcore {' '.join(cmd[3:])}\n{r.stderr}{r.stdout}(exit {r.returncode})"


def write_doc(path: Path, shots: list[tuple[str, str]], cli: str) -> None:
    out = [
        "# The edit-export-verify loop, at 80x24",
        "",
        "Text captures of the workbench (Textual's pilot at 80x24; colours aside, what a terminal shows),",
        "made by `python3 bench/tui_walkthrough.py docs/edit-export-verify.md` on a CPU machine. The",
        "exporter is a TVM-FFI C++ copy kernel scaled by a constant (so the captures run anywhere); a",
        "generated CuTe DSL stub (`s` on the Kernel screen) on a GPU goes through the same loop. The",
        "captures' watch runs the correctness gate only (a CPU's perf numbers are noise); the CLI run at",
        "the end shows a round with the perf gate.",
        "",
    ]
    for i, (title, text) in enumerate(shots, 1):
        out += [f"## {i}. {title}", "", "```text", text, "```", ""]
    out += [
        "## The same loop from the CLI",
        "",
        "One line a round on stdout (`--rounds 1` here; without it the watch waits for the next save",
        "until Ctrl-C); the exporter's output and the notices go to stderr. The perf gate measures this",
        "shared 2-core CPU as it is, and two pairs rarely decide (INCONCLUSIVE, exit 3): read a perf",
        "verdict from a GPU run, where the default `--metric auto` takes the device time.",
        "",
        "```text",
        cli,
        "```",
        "",
    ]
    path.write_text("\n".join(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", type=Path, help="the markdown file to write (docs/edit-export-verify.md)")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="walkthrough-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        native, slot, receipt = build(work)
        shots = asyncio.run(tui_captures(work, native, slot, receipt))
        cli = cli_capture(work, native, slot, receipt)
    write_doc(ns.output, shots, cli)
    print(f"wrote {ns.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
