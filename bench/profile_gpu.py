"""Issue 26, deliverable 1: the compiled engine's profile of the Qwen3-8B-sized config, native and with
the CuTe DSL decode attention bound in all 36 layers, and their diff.

    python3 bench/profile_gpu.py WORK_DIR [--contexts 1024,32768] [--capacity 40960] [--steps 5] [--top 8]
                                 [--parts native,cute] [--archive OUT/profiles.tgz]

In one run on the GPU (bf16, batch 1, random weights, KV capacity 40960):
  1. builds the native bundle and the slot bundle with `qwen.decode_attention_region@2 all-instances`
     and the split schedule's workspace (36 slots, one binding), and exports the shipped CuTe DSL
     kernel from layer 0's receipt in the background (as bench/attention_gpu.py builds and binds it);
  2. profiles the native decode step with `mcore profile --engine compiled`'s code at each context (one
     compile with Inductor's provenance serves every context: the step reads its length from a device
     tensor), printing the top regions, the kernels, the time between kernels and the attributed
     total against the step's device time;
  3. the same with the CuTe kernel bound in every layer, then `mcore profile diff` of the two per context.
Writes WORK_DIR/{native,cute}-<context>.json (profiles that `mcore profile diff` reads; with
--archive also as one .tgz, for a device that returns few files) and prints a summary table last. Needs the CuTe DSL for part `cute` (the two-call stash; see docs/gpu-results.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_8b_config import QWEN3_8B, write_config_folder  # noqa: E402

if TYPE_CHECKING:
    from mcore import ProfileReport

RECIPE = "qwen.decode_attention_region@2"
# the split schedule's workspace, as the exporter prints it for its default 32 splits (bench/attention_gpu.py)
WORKSPACE = QWEN3_8B["num_attention_heads"] * 32 * (128 + 2) * 4


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build(out: Path, capacity: int, parts: set[str], dev: str) -> tuple[Path, Path, subprocess.Popen | None]:
    """The native bundle, the slot bundle, and the CuTe export running in the background (or None).
    On the CPU (a smoke run of this script's own steps) the demo model stands in for the 8B config."""
    from mcore import BuildArgs, build_bundle
    from mcore.families.demo import materialize

    if dev == "cpu":
        args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=capacity)
    else:
        cfg = write_config_folder(out / "qwen3-8b-config")
        shutil.copy(materialize("qwen3-tiny") / "tokenizer.json", cfg)
        args = BuildArgs(model=str(cfg), weights="random", precision="bf16", max_cache_length=capacity)
    t = time.perf_counter()
    build_bundle(args, out / "native.bundle", device=dev, overwrite=True)  # a rerun in WORK_DIR rebuilds
    export = None
    if "cute" in parts:
        slot = build_bundle(
            args,
            out / "attn.bundle",
            recipe=(RECIPE, "all-instances"),
            device="cuda",
            workspace_bytes=WORKSPACE,
            overwrite=True,
        )
        entry = {"id": RECIPE, "abi_sha256": slot.receipts[0].abi_sha256, "library": "./attn.so", "function": "run"}
        (out / "attn-bindings.json").write_text(json.dumps({"schema_version": 1, "bindings": [entry]}))
        cmd = [sys.executable, "-m", "mcore", "kernel", "export", "cutedsl-decode-attention"]
        cmd += ["--selection", str(slot.receipt_paths[0]), "-o", str(out / "attn.so"), "--force"]
        export = subprocess.Popen(cmd, stdout=open(out / "export.log", "w"), stderr=subprocess.STDOUT)
    log(f"bundles built in {time.perf_counter() - t:.0f} s")
    return out / "native.bundle", out / "attn.bundle", export


def profile_all(
    label: str, bundle: Path, bindings: Path | None, contexts: list[int], ns, out: Path
) -> dict[int, ProfileReport]:
    """Profiles of one bundle's compiled decode step at each context, written and printed."""
    import torch

    from mcore import DecoderPipeline, write_json
    from mcore.profile.profiler import profile_pipeline, top_lines

    t = time.perf_counter()
    binds = str(bindings) if bindings else None
    pipe = DecoderPipeline(str(bundle), kernel_bindings=binds, device=ns.device, engine="torch")
    log(f"{label}: pipeline loaded in {time.perf_counter() - t:.0f} s")
    reports = {}
    for n in contexts:
        t = time.perf_counter()
        report = profile_pipeline(pipe, "decode", n, ns.steps, engine="compiled")
        log(f"{label} at {n}: profiled in {time.perf_counter() - t:.0f} s")
        write_json(out / f"{label}-{n}.json", report.to_dict())
        print(f"== {label}, context {n}")
        print("\n".join(top_lines(report, ns.top)), flush=True)
        reports[n] = report
    del pipe
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return reports


def summary(runs: dict[str, dict[int, ProfileReport]]) -> None:
    print("== summary (decode step, compiled engine)")
    print(
        f"{'profile':<8} {'context':>7} {'step ms':>9} {'attributed':>11} {'kernels ms':>11} {'between ms':>11} "
        f"{'calls':>6}  timing"
    )
    for label, reports in runs.items():
        for n, p in reports.items():
            b = p.between_kernels
            print(
                f"{label:<8} {n:>7} {p.step_seconds * 1e3:9.3f} {p.attributed_seconds / p.step_seconds:11.1%} "
                f"{p.kernel_seconds * 1e3:11.3f} {b.seconds * 1e3:11.3f} {len(p.kernels):6}  "
                f"{p.timing[:60]}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--contexts", default="1024,32768")
    ap.add_argument("--capacity", type=int, default=40960)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--parts", default="native,cute")
    ap.add_argument("--archive", type=Path, default=None, help="also write the profiles and logs here as one .tgz")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke run on the demo model
    ns = ap.parse_args(argv)
    contexts = [int(c) for c in ns.contexts.split(",")]
    parts = set(ns.parts.split(","))
    if max(contexts) >= ns.capacity or not parts <= {"native", "cute"}:
        ap.error("contexts must be below --capacity; --parts: native and/or cute")
    import torch

    if ns.device == "cuda" and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    ns.out.mkdir(parents=True, exist_ok=True)
    native, slot, export = build(ns.out, ns.capacity, parts, ns.device)
    runs = {"native": profile_all("native", native, None, contexts, ns, ns.out)}
    if export is not None:
        if export.wait() != 0:
            log("CuTe export failed: " + (ns.out / "export.log").read_text()[-800:])
        else:
            runs["cute"] = profile_all("cute", slot, ns.out / "attn-bindings.json", contexts, ns, ns.out)
            from mcore.profile.profiler import diff_lines

            for n in contexts:
                print(f"== diff native -> CuTe attention in all 36 layers, context {n}")
                print("\n".join(diff_lines(runs["native"][n], runs["cute"][n], ("native", "cute"))), flush=True)
    summary(runs)
    if ns.archive:
        with tarfile.open(ns.archive, "w:gz") as tar:
            for f in sorted(ns.out.glob("*.json")) + sorted(ns.out.glob("*.log")):
                tar.add(f, arcname=f.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
