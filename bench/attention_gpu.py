"""Issues 13, 28 and 31: the CuTe DSL decode-attention kernel on an 8B-sized config (--model: Qwen3-8B by
default, or Llama-3.1-8B; bench/model_configs.py), beside the native engine's attention and FlashInfer's.

    python3 bench/attention_gpu.py OUT_DIR [--model qwen3-8b|llama3.1-8b] [--contexts 1024,8192,32768] [--capacity 40960]
        [--parts kernel,timeline,pipelines] [--bind INDEX|fastest|balanced] [--flashinfer ARCHIVE] [--budget SECONDS]
        [--rounds N]   # kernel part: each kernel timed N times in turn, the median kept (rounds in the JSON)
    python3 bench/attention_gpu.py --flashinfer-warm [--flashinfer ARCHIVE]   # only JIT-build FlashInfer's modules

In one run on the GPU (bf16, batch 1, random weights, KV capacity 40960):
  1. builds the slot bundles with the family's attention recipe and `all-instances` (Qwen3: 36 slots, one
     binding; one without and one with a workspace) and the native bundle (pipelines only), and
     exports the kernel from layer 0's receipts with the shipped exporter, once for each of VARIANTS
     (tuning knobs of the exporter);
  2. kernel time per call, CuTe DSOs vs the native engine's attention (mcore.ops.flash_decode, what the
     compiled engine runs for mcore::decode_attention) and FlashInfer's decode (bench/flashinfer_attention.py;
     rows skipped with the reason when it is not importable): a call a layer (at least 32), each over its own cache
     (nothing from L2), in one CUDA graph; K+V bytes of the active length / time, as a share of the
     measured copy rate and of the theoretical peak; the output against the float64 reference, and
     two calls compared bit for bit;
  2b. (--parts timeline) the same graphs replayed under torch.profiler, kernel by kernel: each kernel's
     residence, how each starts and ends against its predecessor, a call's period (bench/kernel_timeline.py;
     with --parts timeline alone, --bind names the CuTe variants exported);
  3. the pipelines (compiled engine) in one process: native, and the slot bound to each of VARIANTS[--bind]
     in turn (--bind 1,3: the default split and the TMA ring side by side, native loaded once and timed
     again beside each; 'fastest': fastest at the longest context; 'balanced': the best worst ratio to
     native over the contexts): logits in lockstep after a prompt, then at each context the same random caches in both, one
     step's logits compared and the decode step timed alternately (a user's loop: step, argmax, one read);
     skipped when fewer than PIPELINES_S seconds of --budget are left;
  4. the perf verdict on those step times with `mcore verify perf`'s rule (mcore/verify/interval.py: the
     rounds as pairs, their t-interval against the threshold: PROMOTE, REJECT or INCONCLUSIVE), in process
     — labelled so; the fresh-process gate runs on the small model.
Prints the full table, then a short one (per context: native, the shipped default, the best CuTe,
FlashInfer) last; writes OUT_DIR/attention.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashinfer_attention  # noqa: E402
import kernel_timeline  # noqa: E402
from flash_decode_sweep import capture_graph, time_graph  # noqa: E402
from model_configs import MODELS, attention_recipe, config_of, head_dim, write_model_folder  # noqa: E402

from mcore import BuildArgs, DecoderPipeline, build_bundle, shipped_exporter  # noqa: E402
from mcore.ops.attention import decode_attention_reference  # noqa: E402
from mcore.profile.device import device_facts  # noqa: E402
from mcore.verify.interval import ratio_interval  # noqa: E402
from mcore.verify.perf import PERF_DEFAULTS  # noqa: E402

MODEL = "qwen3-8b"  # --model: a name in bench/model_configs.py
CONFIG = config_of(MODEL)
RECIPE = attention_recipe(CONFIG)
PROMPT = "Explain grouped-query attention, KV caching, and decode latency."
RESULTS: dict = {}
DEV = "cuda"  # a CPU smoke run (tests nothing about speed) sets this to "cpu"
START = time.monotonic()
CAPACITY = 40960  # --capacity
PIPELINES_S = 200  # what the pipelines part needs: two 36-layer compiled pipelines and the step timing
# FlashInfer's tensor-core decode row (--flashinfer-tensor-cores): off by default, its JIT build (the
# prefill kernels, 10 files) took 20 minutes of nvcc on a 2-core machine, about 4 minutes on the GPU box
TENSOR_CORES = False


def emit(out: Path, key: str, value) -> None:
    RESULTS[key] = value
    (out / "attention.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"[{key}] {json.dumps(value, default=str)[:400]}", flush=True)


# kernel variants for the table: name -> exporter environment (tuning knobs of the shipped exporter).
# Measured slower everywhere and dropped here (docs/gpu-results.md): two heads a block, the scalar
# walk, loads ahead with 12 warps (seventh session); keys staged through shared memory by cp.async,
# 2-4 steps ahead (eighth session: 0.36-0.72x native, removed from the exporter); in a cluster: loads
# ahead, 12 warps, 16 blocks of 4 warps; split: 16 ways of 12 warps, 32 of 8, 64 of 4 (ninth
# session); split 16 ways of 4 or 8 warps, 32 of 4 with a plain launch (ninth session, at 5e35c93:
# 16 x 4 fastest at 1k only, 6.5 us; the rest within 3% of 32 x 4 or slower).
# Tenth session (issue 31), slower everywhere and removed from the exporter: the split count from
# the device length (0.83-0.95x native), the merge in each row's last block (0.46-0.82x; with 33
# splits too), the TMA ring (0.62-0.74x; 0.32x with the last-block merge). PDL early stays, opt-in.
# Fifteenth session: the ring again with one bulk copy a tile (kept, opt-in: 0.85x / 0.93x / 1.01x at
# 1k / 8k / 32k with the merge on the walk's shared memory, 0.81x / 0.91x / 0.99x without); 3 stages
# (0.79x / 0.85x / 0.96x), 16 splits of 8 warps (0.74x / 0.87x / 0.99x) and the register walk below
# 12k keys inside the ring's kernel (0.75x / 0.86x / 0.99x: the ring's shared memory slows it) lost.
VARIANTS = {
    "CuTe cluster 8 (no workspace, default)": {},
    # with a workspace: split over blocks (no cluster); ptxas for sm_90a: the walk 162 registers a
    # thread (218 loading ahead; 166 in the twenty-fourth session), so 3 blocks (2 loading ahead) of 4 warps an SM
    "CuTe split 32 x 4 warps (workspace, default)": {},
    # twenty-second session: the default deals tiles round the blocks and launches both kernels early;
    # the schedule shipped before (contiguous shares a warp, the merge launched after the walk's reads)
    "CuTe split 32 x 4, shares, PDL after the walk (shipped before)": {
        "CUTEDSL_ATTENTION_INTERLEAVE": "0",
        "CUTEDSL_ATTENTION_PDL": "1",
    },
    "CuTe split 32 x 4, shares, PDL early": {"CUTEDSL_ATTENTION_INTERLEAVE": "0"},
    "CuTe split 32 x 4, tiles dealt, PDL after the walk": {"CUTEDSL_ATTENTION_PDL": "1"},
    # issue 31 (fifteenth session): the keys through a shared-memory ring, one bulk copy a K or V tile
    # (PDL after the walk: early was 0.6 us slower at 1k on an H100)
    "CuTe split 32 x 4, TMA tiles, 2 stages": {"CUTEDSL_ATTENTION_TMA": "1", "CUTEDSL_ATTENTION_PDL": "1"},
    # twenty-eighth session: on the H200 the default read 85% of the copy rate at 32k (95% on the H100):
    # more blocks in flight for its faster memory (each needs the workspace for its splits, below)
    "CuTe split 48 x 4 warps": {"CUTEDSL_ATTENTION_SPLITS": "48"},
    "CuTe split 64 x 4 warps": {"CUTEDSL_ATTENTION_SPLITS": "64"},
    # thirtieth session, for the H200 likewise: each warp's next keys in flight while it works on these
    # (slower on the H100 at 32 splits), and twice the warps a block
    "CuTe split 64 x 4, loads ahead": {"CUTEDSL_ATTENTION_SPLITS": "64", "CUTEDSL_ATTENTION_PREFETCH": "1"},
    "CuTe split 32 x 8 warps": {"CUTEDSL_ATTENTION_WARPS": "8"},
    # thirty-second session: on an H100 the 64-split variants above lost at every length (10.6 / 20.7 /
    # 55.9 us): loads ahead with the shipped split count and with 48, for the H200's first run (on an
    # H100: 6.8 / 16.3 / 48.2 us with 32, the shipped one's to 0.1 us; 8.8 / 17.7 / 49.5 with 48)
    "CuTe split 32 x 4, loads ahead": {"CUTEDSL_ATTENTION_PREFETCH": "1"},
    "CuTe split 48 x 4, loads ahead": {"CUTEDSL_ATTENTION_SPLITS": "48", "CUTEDSL_ATTENTION_PREFETCH": "1"},
}
SHIPPED_SPLIT = "CuTe split 32 x 4 warps (workspace, default)"  # what --bind binds unless told
BIND = list(VARIANTS).index(SHIPPED_SPLIT)  # --bind: the variant the slot pipeline binds
# the workspace of the split variants' receipt, as the exporter's split_workspace_bytes for the most
# splits a variant asks for (the default's 32 run as 32 in it): per query head and split an fp32
# context row, max and sum
SPLITS = max(int(env.get("CUTEDSL_ATTENTION_SPLITS", "32")) for env in VARIANTS.values())
WORKSPACE = CONFIG["num_attention_heads"] * SPLITS * (head_dim(CONFIG) + 2) * 4


def use_model(name: str) -> None:
    """--model: the config, its family's attention recipe and the split workspace."""
    global MODEL, CONFIG, RECIPE, WORKSPACE
    MODEL, CONFIG = name, config_of(name)
    RECIPE = attention_recipe(CONFIG)
    WORKSPACE = CONFIG["num_attention_heads"] * SPLITS * (head_dim(CONFIG) + 2) * 4


def uses_workspace(name: str) -> bool:
    return "(no workspace" not in name and name.startswith("CuTe split")


# --export-only writes this index beside the DSOs: {index: {name, abi_sha256, library_sha256}}
PREBUILT = "prebuilt.json"


def abi_of(receipt: Path) -> str:
    return json.loads(receipt.read_text())["abi_sha256"]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def why_not_prebuilt(entry: dict | None, src: Path, name: str, receipt: Path) -> str:
    """Why folder's DSO `src` is not this variant's for `receipt` ("" when it is)."""
    if entry is None or not src.is_file():
        return "none in the folder"
    if entry["name"] != name:
        return "another variant's"
    abi = abi_of(receipt)
    if entry["abi_sha256"] != abi:
        return f"exported for ABI {entry['abi_sha256'][:12]}, this receipt's is {abi[:12]}"
    if sha256_of(src) != entry["library_sha256"]:
        return "its bytes changed since the export"
    return ""


def use_prebuilt(entry: dict | None, folder: Path, name: str, receipt: Path, dso: Path) -> bool:
    """Copy folder's DSO for this variant to `dso` if it was exported as `name` for `receipt`'s ABI;
    else say why not (the caller exports it)."""
    src = folder / f"{dso.stem}.so"
    why = why_not_prebuilt(entry, src, name, receipt)
    if why:
        print(f"[build] {name}: prebuilt DSO not used ({why}); exporting", flush=True)
        return False
    shutil.copyfile(src, dso)
    print(f"[build] {name}: prebuilt {src} (ABI {abi_of(receipt)[:12]})", flush=True)
    return True


def export_only(out: Path, capacity: int, only: set[int] | None) -> None:
    """The slot bundles built and VARIANTS exported on this machine (no GPU needed: the exporter
    targets sm_90a), with PREBUILT naming each DSO's receipt ABI, for a GPU call's --prebuilt."""
    _, slots, dsos = build(out, capacity, native=False, only=only)
    index = {}
    for i, name in enumerate(VARIANTS):
        if name in dsos:
            abi = slots["workspace" if uses_workspace(name) else "plain"][1]
            index[str(i)] = {"name": name, "abi_sha256": abi, "library_sha256": sha256_of(dsos[name])}
    (out / PREBUILT).write_text(json.dumps(index, indent=1))
    print(f"[export-only] {len(index)} of {len(only or VARIANTS)} variants exported to {out} ({PREBUILT})", flush=True)


def export_variants(
    out: Path, receipt: Path, ws_receipt: Path, only: set[int] | None = None, prebuilt: Path | None = None
) -> tuple[dict[str, Path], dict[str, float]]:
    """Each of VARIANTS exported from `receipt` (`ws_receipt`: those with a workspace) as
    out/attn-<index>.so, side by side (each export is a single-threaded CPU-bound compile; the H200
    box has 16 cores; `only`: those indices): {name: DSO} in VARIANTS order for those that exported,
    {name: seconds}. `prebuilt`: a folder from --export-only, whose DSOs are used where they were
    exported for the same receipt ABI (a GPU call then needs no CuTe DSL for them)."""
    dsos: dict[str, Path] = {}
    export_s: dict[str, float] = {}
    script = shipped_exporter("cutedsl-decode-attention")
    ready = json.loads((prebuilt / PREBUILT).read_text()) if prebuilt else {}

    def export(item: tuple[int, tuple[str, dict[str, str]]]) -> None:
        i, (name, env) = item
        t = time.perf_counter()
        dso = out / f"attn-{i}.so"
        sel = ws_receipt if uses_workspace(name) else receipt
        if prebuilt and use_prebuilt(ready.get(str(i)), prebuilt, name, sel, dso):
            dsos[name], export_s[name] = dso, 0.0
            return
        cmd = [sys.executable, str(script), "--selection", str(sel), "--output", str(dso)]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
        export_s[name] = time.perf_counter() - t
        if r.returncode == 0:
            dsos[name] = dso
        else:  # the other variants' numbers still count
            print(f"[build] {name}: export failed: {r.stderr.strip()[-400:]}", flush=True)

    with ThreadPoolExecutor(max_workers=min(len(VARIANTS), os.cpu_count() or 4)) as pool:
        list(pool.map(export, [(i, item) for i, item in enumerate(VARIANTS.items()) if only is None or i in only]))
    return {name: dsos[name] for name in VARIANTS if name in dsos}, export_s


def build(
    out: Path,
    capacity: int,
    native: bool,
    only: set[int] | None = None,
    given_native: Path | None = None,
    prebuilt: Path | None = None,
) -> tuple[Path, dict[str, tuple[Path, str]], dict[str, Path]]:
    """The native bundle (`given_native` when another run built it, e.g. bench/engine_gpu.py's, whose
    compiled code its cache holds), {"plain" | "workspace": (slot bundle, its ABI hash)}, the exported
    DSOs (`only`: of those VARIANTS indices; `prebuilt`: see export_variants)."""
    cfg = write_model_folder(out / f"{MODEL}-config", MODEL)
    args = BuildArgs(model=str(cfg), weights="random", precision="bf16", max_cache_length=capacity)
    t = time.perf_counter()
    native_path = given_native or out / "native.bundle"
    if native and given_native is None:
        build_bundle(args, native_path, device=DEV, overwrite=True)  # a rerun rebuilds
    slot = build_bundle(args, out / "attn.bundle", recipe=(RECIPE, "all-instances"), device=DEV, overwrite=True)
    ws = build_bundle(
        args,
        out / "attn-ws.bundle",
        recipe=(RECIPE, "all-instances"),
        device=DEV,
        workspace_bytes=WORKSPACE,
        overwrite=True,
    )
    build_s = time.perf_counter() - t
    dsos, export_s = export_variants(out, slot.receipt_paths[0], ws.receipt_paths[0], only, prebuilt)
    emit(out, "build", {"slots": len(slot.receipts), "build_s": build_s, "export_s": export_s})
    slots = {
        "plain": (out / "attn.bundle", slot.receipts[0].abi_sha256),
        "workspace": (out / "attn-ws.bundle", ws.receipts[0].abi_sha256),
    }
    return native_path, slots, dsos


class Setup:
    """What every kernel row of one context shares: the query, the layers' caches and outputs, the
    length, the reference of layer 0, the byte count and the native time."""

    def __init__(self, capacity: int):
        h, kv, d = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"], head_dim(CONFIG)
        # a call a layer, at least 32 calls a graph (the 2-layer demo too), so the graph's own launch
        # does not weigh on a call's time
        self.layers = max(CONFIG["num_hidden_layers"], 32)
        facts = device_facts(torch.device("cuda"))
        self.copy, self.peak = facts["copy_bytes_per_s"], facts.get("theoretical_bytes_per_s")
        g = torch.Generator(device="cuda").manual_seed(13)
        self.caches = [
            tuple(torch.randn(1, kv, capacity, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            for _ in range(self.layers)
        ]
        self.q = (torch.randn(1, h, 1, d, device="cuda", generator=g) * d**-0.5).to(torch.bfloat16)
        self.lens = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.outs = [torch.empty_like(self.q) for _ in range(self.layers)]
        # one workspace a slot, uninitialised as mcore's slot allocates it
        self.scratch = [torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda") for _ in range(self.layers)]
        self.kv, self.d, self.group = kv, d, h // kv

    def at(self, n: int) -> None:
        from mcore.ops import flash_decode as fd

        self.n = n
        self.lens.fill_(n)
        self.nbytes = 2 * n * self.kv * self.d * 2
        k0, v0 = self.caches[0]
        self.ref = decode_attention_reference(self.q.cpu(), k0.cpu(), v0.cpu(), self.lens.cpu())
        self.native_ms = self.timer(lambda i: fd_call(self, i))()
        self.native_max_abs = float(
            (fd.decode_attention(self.q, k0, v0, self.lens).double().cpu() - self.ref).abs().max()
        )

    def timer(self, call: Callable[[int], Any]) -> Callable[[], float]:
        """ms a call: all layers' calls in one CUDA graph."""
        return lambda: time_graph(lambda: [call(i) for i in range(self.layers)]) / self.layers

    def measure(self, call: Callable[[int], Any], result: Callable[[], torch.Tensor]) -> dict:
        """`call(i)` runs layer i (timed: all 36 in one CUDA graph); `result()` runs layer 0 and
        returns its output (checked against the reference, twice for determinism)."""
        first = result().clone()
        again = result().clone()
        ms = self.timer(call)()
        bw = self.nbytes / (ms * 1e-3)
        return {
            "us": ms * 1e3,
            "TBps": bw / 1e12,
            "of_copy": bw / self.copy,
            "of_peak": bw / self.peak if self.peak else None,
            "native_over_this": self.native_ms / ms,
            "max_abs_vs_fp64": float((first.double().cpu() - self.ref).abs().max()),
            "deterministic": bool(torch.equal(first, again)),
        }


def cute_call(s: Setup, run0: Callable[..., None], workspace: bool) -> Callable[[int], None]:
    """Layer i's call of a CuTe DSO's run, as the slot calls it."""

    def call(i: int) -> None:
        k, v = s.caches[i]
        if workspace:  # the slot passes its workspace between the inputs and the output
            run0(s.q, k, v, s.lens, s.scratch[i], s.outs[i])
        else:
            run0(s.q, k, v, s.lens, s.outs[i])

    return call


def cute_row(s: Setup, run0: Callable[..., None], workspace: bool) -> dict:
    call = cute_call(s, run0, workspace)

    def result() -> torch.Tensor:
        s.outs[0].fill_(float("nan"))
        call(0)
        return s.outs[0]

    row = s.measure(call, result)
    row["timer"] = s.timer(call)
    return row


def retime(s: Setup, row: dict, names: list[str], rounds: int) -> None:
    """--rounds: native and each of `names` timed again in turn, `rounds` times in all; each "us" becomes
    the median of its rounds (the rounds kept as "us_rounds"), shares and ratios follow it."""
    native = [s.native_ms]
    times = {name: [row[name]["us"] / 1e3] for name in names}
    for _ in range(rounds - 1):
        native.append(s.timer(lambda i: fd_call(s, i))())
        for name in names:
            times[name].append(row[name]["timer"]())
    s.native_ms = statistics.median(native)
    row["native_us"], row["native_us_rounds"] = s.native_ms * 1e3, [x * 1e3 for x in native]
    row["native_TBps"] = s.nbytes / (s.native_ms * 1e-3) / 1e12
    for name in names:
        ms = statistics.median(times[name])
        bw = s.nbytes / (ms * 1e-3)
        row[name].update(
            us=ms * 1e3,
            us_rounds=[x * 1e3 for x in times[name]],
            TBps=bw / 1e12,
            of_copy=bw / s.copy,
            of_peak=bw / s.peak if s.peak else None,
            native_over_this=s.native_ms / ms,
        )


def fd_call(s: Setup, i: int) -> None:
    from mcore.ops import flash_decode as fd

    k, v = s.caches[i]
    fd.decode_attention(s.q, k, v, s.lens)


def flashinfer_rows(s: Setup, fi: Any, capacity: int, rows: dict[str, dict], save: Callable[[], None]) -> None:
    """FlashInfer's rows at context s.n into `rows` (bench/flashinfer_attention.py), `save()` after
    each (a row that stalls leaves the ones before it on disk); a row that fails says why."""

    def attempt(name: str, make: Callable[[], tuple[Callable[[int], Any], Callable[[], torch.Tensor]]]) -> None:
        print(f"[flashinfer {s.n}] {name} ...", flush=True)  # the last one printed is where a stall is
        try:
            rows[name] = s.measure(*make())
        except Exception as e:  # noqa: BLE001 - the other rows still count
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"[flashinfer] {name}: {rows[name]['error']}", flush=True)
        save()

    def paged(tensor_cores: bool):
        p = flashinfer_attention.PagedDecode(fi, s.kv, capacity, s.d, s.group, tensor_cores)
        p.plan(s.n)

        def call(i: int) -> None:
            p(s.q, *s.caches[i], s.outs[i])

        def result() -> torch.Tensor:
            s.outs[0].fill_(float("nan"))
            call(0)
            return s.outs[0]

        return call, result

    def single():
        run = flashinfer_attention.single_decode(fi)
        own = [(k[0, :, : s.n].contiguous(), v[0, :, : s.n].contiguous()) for k, v in s.caches]
        return (lambda i: run(s.q, *own[i])), (lambda: run(s.q, *own[0]))

    attempt("FlashInfer paged decode (fa2, pages of 16, host plan per context)", lambda: paged(False))
    attempt("FlashInfer single decode (own contiguous cache of n keys)", single)
    if TENSOR_CORES:  # its JIT module is FlashInfer's prefill kernels: 10 files, 20 core-minutes of nvcc
        attempt("FlashInfer paged decode, tensor cores (fa2, host plan per context)", lambda: paged(True))


def load_runs(dsos: dict[str, Path]) -> dict[str, Any]:
    """{name: the DSO's run function} for those that load; one that does not (a DSO exported on
    another machine may miss a library here) is named with the loader's reason and left out."""
    import tvm_ffi

    runs = {}
    for name, p in dsos.items():
        if not p.exists():
            continue
        try:
            runs[name] = tvm_ffi.load_module(str(p))["run"]
        except Exception as e:  # noqa: BLE001 - the other variants' numbers still count
            print(f"[load] {name}: {p} did not load: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return runs


def kernel_times(out: Path, dsos: dict[str, Path], contexts: list[int], capacity: int, rounds: int = 1) -> list[dict]:
    runs = load_runs(dsos)
    s = Setup(capacity)
    rows = []
    for n in contexts:
        s.at(n)
        row: dict[str, Any] = {
            "context": n,
            "native_us": s.native_ms * 1e3,
            "native_TBps": s.nbytes / (s.native_ms * 1e-3) / 1e12,
            "native_max_abs_vs_fp64": s.native_max_abs,
        }
        for name, run0 in runs.items():
            row[name] = cute_row(s, run0, uses_workspace(name))
        retime(s, row, list(runs), rounds)
        for name in runs:
            row[name].pop("timer")
        rows.append(row)
        emit(out, f"kernel_{n}", row)
    emit(
        out,
        "kernel",
        {
            "copy_TBps": s.copy / 1e12,
            "peak_TBps": (s.peak or 0) / 1e12,
            "calls": s.layers,
            "dsos": list(runs),
            "rows": rows,
        },
    )
    return rows


def timelines(out: Path, dsos: dict[str, Path], contexts: list[int], capacity: int) -> None:
    """--parts timeline: native's and each CuTe DSO's graph of a call a layer replayed under the profiler at
    each context, kernel by kernel (bench/kernel_timeline.py)."""
    runs = load_runs(dsos)
    s = Setup(capacity)
    for n in contexts:
        s.at(n)
        fns: dict[str, Callable[[int], None]] = {"native (Triton split-KV)": lambda i: fd_call(s, i)}
        for name, run0 in runs.items():
            fns[name] = cute_call(s, run0, uses_workspace(name))
        row = {}
        for name, call in fns.items():
            graph = capture_graph(lambda call=call: [call(i) for i in range(s.layers)])
            events = kernel_timeline.profile_graph(graph)
            row[name] = kernel_timeline.summarize(events)
            print("\n".join(kernel_timeline.table(f"{n} {name}", row[name])), flush=True)
        emit(out, f"timeline_{n}", row)


def flashinfer_child(out: Path, a: argparse.Namespace, timeout: float) -> None:
    """FlashInfer's rows, measured in a child process (a fault or a hang there cannot spoil this
    process's CUDA context), merged into the kernel table."""
    cmd = [sys.executable, __file__, str(out), "--flashinfer-rows", "--contexts", a.contexts, "--model", a.model]
    cmd += ["--capacity", str(a.capacity)] + (["--flashinfer", a.flashinfer] if a.flashinfer else [])
    cmd += ["--flashinfer-tensor-cores"] if a.flashinfer_tensor_cores else []
    found = out / "flashinfer.json"
    found.unlink(missing_ok=True)
    late = ""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        print(r.stdout[-3000:] + r.stderr[-2000:], flush=True)
        why = f"exit {r.returncode}: {r.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired as e:
        # what it printed before it was killed says which row stalled (bytes on POSIX, even with text=True)
        partial = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        print("".join(partial)[-4000:], flush=True)
        why = late = f"the child process ran past {timeout:.0f} s"
    if not found.is_file():  # it writes the file after each row: what it finished still counts
        emit(out, "flashinfer", f"rows not measured ({why})")
        return
    got = json.loads(found.read_text())
    emit(out, "flashinfer", got["note"] + (f"; stopped: {late}" if late else ""))
    k = RESULTS.get("kernel")
    if k and got["rows"]:
        for row in k["rows"]:
            row.update(got["rows"].get(str(row["context"]), {}))
        names = [name for row in got["rows"].values() for name in row]  # every context's, in order
        k["dsos"] += [name for name in dict.fromkeys(names) if name not in k["dsos"]]
        emit(out, "kernel", k)


def flashinfer_main(out: Path, contexts: list[int], capacity: int, archive: str | None) -> None:
    """--flashinfer-rows (the child): FlashInfer's rows at each context into OUT/flashinfer.json."""
    fi, note = flashinfer_attention.load(archive)
    rows: dict[str, dict] = {}

    def save() -> None:
        (out / "flashinfer.json").write_text(json.dumps({"note": note, "rows": rows}, default=str))

    if fi is not None:
        s = Setup(capacity)
        for n in contexts:
            s.at(n)
            rows[str(n)] = {}
            flashinfer_rows(s, fi, capacity, rows[str(n)], save)
            print(f"[flashinfer {n}] {json.dumps(rows[str(n)], default=str)[:600]}", flush=True)
    else:
        note = f"rows skipped: {note}"
    save()


def good(x: dict) -> bool:
    return "us" in x and x["deterministic"] and x["max_abs_vs_fp64"] < 1e-2


def fastest(rows: list[dict]) -> int:
    """The VARIANTS index fastest at the longest context measured, among those correct and deterministic."""
    last = rows[-1]
    ok = [(last[name]["us"], i) for i, name in enumerate(VARIANTS) if name in last and good(last[name])]
    return min(ok)[1] if ok else BIND


def balanced(rows: list[dict]) -> int:
    """The VARIANTS index whose worst ratio to native over the contexts is best (correct and
    deterministic at every context): what the whole decode step needs at every context."""
    ok = []
    for i, name in enumerate(VARIANTS):
        xs = [r.get(name) for r in rows]
        if all(x is not None and good(x) for x in xs):
            ok.append((min(x["native_over_this"] for x in xs), i))
    return max(ok)[1] if ok else BIND


def bind(out: Path, slots: dict[str, tuple[Path, str]], index: int) -> tuple[Path, Path]:
    """The slot bundle VARIANTS[index] binds to and a bindings manifest naming its DSO."""
    bundle, abi = slots["workspace" if uses_workspace(list(VARIANTS)[index]) else "plain"]
    manifest = out / f"attn-bindings-{index}.json"
    entry = {"id": RECIPE, "abi_sha256": abi, "library": f"./attn-{index}.so", "function": "run"}
    manifest.write_text(json.dumps({"schema_version": 1, "bindings": [entry]}))
    return bundle, manifest


def cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(x.double().reshape(-1), y.double().reshape(-1), dim=0))


def pipelines(out: Path, native: Path, bound: list[tuple[str, Path, Path]], contexts: list[int], steps: int) -> None:
    """Native vs each (variant, slot bundle, bindings manifest) in `bound`, one after another in this
    process (native loaded once, timed again beside each): lockstep logits, then the step at each context."""
    t = time.perf_counter()
    nat = DecoderPipeline(str(native), device=DEV)
    done: list[dict] = []
    emit(out, "load", {"native_s": time.perf_counter() - t, "engine": nat.engine_name})
    for variant, slot, manifest in bound:
        t = time.perf_counter()
        ext = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device=DEV)
        entry = {"variant": variant, "load_s": time.perf_counter() - t, "engine": ext.engine_name}
        entry.update(compare(nat, ext, contexts, steps))
        done.append(entry)
        emit(out, "pipelines", done)
        del ext
        if DEV == "cuda":
            torch.cuda.empty_cache()


def compare(nat: Any, ext: Any, contexts: list[int], steps: int) -> dict:
    """{"lockstep": logits after the prompt step by step, "steps": the step timed at each context}."""

    ids = nat.encode(PROMPT)
    tokens = nat.generate(PROMPT, 16, greedy=True, stop_at_eos=False).tokens
    a, b = nat.step_logits(ids, tokens[:-1]), ext.step_logits(ids, tokens[:-1])
    lock = [
        {
            "step": k,
            "max_abs": float((x - y).abs().max()),
            "cosine": cosine(x, y),
            "same_pick": bool(x.argmax() == y.argmax()),
        }
        for k, (x, y) in enumerate(zip(a, b, strict=True))
    ]

    def stepper(p):
        caches = [p.caches[c] for c in p.cache_names]
        dec = p.runners["decode"]
        tok = [ids[-1]]  # a token of this vocabulary

        def step():
            p.step_ids.fill_(tok[0])
            (logits,) = dec(p.step_ids, p.cache_length, *caches)
            tok[0] = int(torch.argmax(logits).item())
            return logits

        return caches, step, tok

    (nc, nstep, ntok), (ec, estep, etok) = stepper(nat), stepper(ext)
    rows = []
    for n in contexts:
        for caches, seed in ((nc, n), (ec, n)):  # the same random cache contents in both
            g = torch.Generator(device=DEV).manual_seed(seed)
            for c in caches:
                c.normal_(generator=g)
        nat.cache_length.fill_(n)
        ext.cache_length.fill_(n)
        ntok[0] = etok[0] = ids[-1]  # the same input token (the loops below feed each its own pick)
        la, lb = nstep().float(), estep().float()
        one = {
            "max_abs": float((la - lb).abs().max()),
            "cosine": cosine(la, lb),
            "same_pick": bool(la.argmax() == lb.argmax()),
        }
        times = {"native": [], "external": []}
        for r in range(6):  # alternate which pipeline goes first
            order = (("native", nstep), ("external", estep)) if r % 2 == 0 else (("external", estep), ("native", nstep))
            for name, fn in order:
                for _ in range(3):
                    fn()
                ms = []
                for _ in range(steps):
                    if DEV == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    ms.append((time.perf_counter() - t0) * 1e3)
                times[name].append(statistics.median(ms))
        nat_ms, ext_ms = statistics.median(times["native"]), statistics.median(times["external"])
        ratio = nat_ms / ext_ms  # external throughput / native throughput
        # the gate's rule (mcore/verify/interval.py): each round a pair, their t-interval against the threshold
        pairs = [a / b for a, b in zip(times["native"], times["external"], strict=True)]
        ci = ratio_interval(pairs, PERF_DEFAULTS.confidence)
        row = {
            "context": n,
            "native_ms": nat_ms,
            "external_ms": ext_ms,
            "ratio": ratio,
            "interval": [ci.low, ci.high],
            "verdict": ci.verdict(PERF_DEFAULTS.min_ratio),
            "rounds": times,
            "logits": one,
        }
        rows.append(row)
        print(f"[step_{n}] {json.dumps(row, default=str)[:400]}", flush=True)
    return {"lockstep": lock, "steps": rows}


def kernel_table(k: dict) -> list[str]:
    lines = [
        f"kernel, per call ({k.get('calls', CONFIG['num_hidden_layers'])} calls in one CUDA graph); copy {k['copy_TBps']:.2f} TB/s, peak {k['peak_TBps']:.2f} TB/s",
        "| context | kernel | us | TB/s | of copy | of peak | native us / this | max_abs vs fp64 | deterministic |",
    ]
    for r in k["rows"]:
        lines.append(
            f"| {r['context']} | native (Triton split-KV) | {r['native_us']:.1f} | {r['native_TBps']:.2f} | | | 1.00 | "
            f"{r['native_max_abs_vs_fp64']:.2e} | |"
        )
        for name in k["dsos"]:
            x = r.get(name, {"error": "not run"})
            if "us" not in x:
                lines.append(f"| {r['context']} | {name} | {x['error'][:90]} | | | | | | |")
                continue
            lines.append(
                f"| {r['context']} | {name} | {x['us']:.1f} | {x['TBps']:.2f} | {x['of_copy']:.0%} | {(x['of_peak'] or 0):.0%} | "
                f"{x['native_over_this']:.2f} | {x['max_abs_vs_fp64']:.2e} | {x['deterministic']} |"
            )
    return lines


def short_table(k: dict) -> list[str]:
    """Per context: native, the shipped default, the best correct CuTe variant and the best FlashInfer row."""
    lines = ["", "== short: us per call (native us / this, share of copy)"]
    lines.append("| context | native | CuTe shipped split | best CuTe (which) | best FlashInfer (which) |")

    def cell(x: dict | None) -> str:
        return f"{x['us']:.1f} ({x['native_over_this']:.2f}x, {x['of_copy']:.0%})" if x else "-"

    def best(r: dict, prefix: str) -> tuple[dict | None, str]:
        xs = [(r[n]["us"], n) for n in k["dsos"] if n.startswith(prefix) and n in r and good(r[n])]
        return (r[min(xs)[1]], min(xs)[1]) if xs else (None, "")

    for r in k["rows"]:
        (cute, cname), (fi, fname) = best(r, "CuTe"), best(r, "FlashInfer")
        lines.append(
            f"| {r['context']} | {r['native_us']:.1f} | {cell(r.get(SHIPPED_SPLIT))} | {cell(cute)} {cname} | "
            f"{cell(fi)} {fname} |"
        )
    return lines


def table() -> str:
    lines = [
        "",
        f"== CuTe DSL decode attention vs the native engine ({MODEL}-sized, {RECIPE}, bf16, capacity {CAPACITY})",
    ]
    k = RESULTS.get("kernel")
    if "flashinfer" in RESULTS:
        lines.append(f"FlashInfer: {RESULTS['flashinfer']}")
    if k:
        lines += kernel_table(k)
    layers = CONFIG["num_hidden_layers"]
    for entry in RESULTS.get("pipelines", []):
        lk = entry["lockstep"]
        lines.append(f"bound in all {layers} layers: {entry['variant']}")
        lines.append(
            f"lockstep after the prompt, {len(lk)} steps: worst max_abs {max(s['max_abs'] for s in lk):.4g}, "
            f"lowest cosine {min(s['cosine'] for s in lk):.6f}, same greedy pick {sum(s['same_pick'] for s in lk)}/{len(lk)}"
        )
        lines.append(
            "decode step (user loop, median of 6 alternating rounds); verdict by verify perf's rule, in process"
        )
        lines.append(
            f"| context | native ms | all {layers} bound ms | ratio | interval | verdict | logits max_abs | cosine |"
        )
        for r in entry["steps"]:
            low, high = r["interval"]
            lines.append(
                f"| {r['context']} | {r['native_ms']:.2f} | {r['external_ms']:.2f} | {r['ratio']:.3f} | "
                f"[{low:.4f}, {high:.4f}] | {r['verdict']} | {r['logits']['max_abs']:.4g} | {r['logits']['cosine']:.6f} |"
            )
    if k:
        lines += short_table(k)
    return "\n".join(lines)


def flashinfer_warm(archive: str | None) -> int:
    """--flashinfer-warm: JIT-build FlashInfer's modules for these rows on a small problem (run in
    the background while something else uses the GPU, so the timed run finds them cached)."""
    fi, note = flashinfer_attention.load(archive)
    print(f"[flashinfer-warm] {note}", flush=True)
    if fi is None:
        return 1
    t = time.perf_counter()
    kv, d = CONFIG["num_key_value_heads"], head_dim(CONFIG)
    group, cap = CONFIG["num_attention_heads"] // kv, 256
    q = torch.randn(1, kv * group, 1, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(1, kv, cap, d, device="cuda").to(torch.bfloat16) for _ in range(2))
    out = torch.empty_like(q)
    for tensor_cores in (False, True) if TENSOR_CORES else (False,):
        p = flashinfer_attention.PagedDecode(fi, kv, cap, d, group, tensor_cores)
        p.plan(100)
        p(q, k, v, out)
        if not tensor_cores:
            flashinfer_attention.single_decode(fi)(q, k[0, :, :100].contiguous(), v[0, :, :100].contiguous())
        torch.cuda.synchronize()
        print(f"[flashinfer-warm] {'tensor cores' if tensor_cores else 'paged and single'} ready", flush=True)
    torch.cuda.synchronize()
    print(f"[flashinfer-warm] built and ran in {time.perf_counter() - t:.0f} s", flush=True)
    return 0


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--model", default=MODEL, choices=sorted(MODELS), help="bench/model_configs.py")
    ap.add_argument("--native", default=None, help="a native bundle of the same model and capacity to use as is")
    ap.add_argument("--contexts", default="1024,8192,32768")
    ap.add_argument("--capacity", type=int, default=40960)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--rounds", type=int, default=1, help="kernel part: each kernel timed this many times in turn, the median kept"
    )
    ap.add_argument(
        "--parts",
        default="kernel,pipelines",
        help="kernel: the kernels alone; timeline: their device timeline under the profiler; pipelines: the whole step",
    )
    ap.add_argument(
        "--bind",
        default=str(BIND),
        help="which of VARIANTS the slot pipelines bind, each compared with native in turn: indices "
        "(1,3; default: the shipped split schedule), 'fastest' (at the longest context) or 'balanced' "
        "(the best worst ratio to native)",
    )
    ap.add_argument(
        "--flashinfer", default=None, help="archive from bench/flashinfer_carry.py (else: import flashinfer)"
    )
    ap.add_argument(
        "--variants",
        dest="variants_arg",
        default=None,
        help="which of VARIANTS the kernel and timeline parts export and time (indices, comma-separated; default: all)",
    )
    ap.add_argument(
        "--export-only",
        action="store_true",
        help="build the slot bundles on the CPU and export the variants into OUT_DIR (no GPU needed), then exit",
    )
    ap.add_argument(
        "--prebuilt",
        default=None,
        help="a folder from --export-only: its DSOs are used where exported for this run's receipt ABI",
    )
    ap.add_argument("--flashinfer-warm", action="store_true", help="only JIT-build FlashInfer's modules, then exit")
    ap.add_argument("--no-flashinfer", action="store_true", help="no FlashInfer rows")
    ap.add_argument(
        "--flashinfer-tensor-cores", action="store_true", help="also FlashInfer's tensor-core row (slow JIT)"
    )
    ap.add_argument("--flashinfer-rows", action="store_true", help=argparse.SUPPRESS)  # internal: the child
    ap.add_argument(
        "--budget", type=float, default=math.inf, help="seconds this run may take: pipelines skipped if short"
    )
    a = ap.parse_args()
    picks = a.bind.split(",")
    if a.bind not in ("fastest", "balanced") and not all(x.isdigit() and int(x) < len(VARIANTS) for x in picks):
        ap.error(f"--bind must be indices below {len(VARIANTS)} (comma-separated), 'fastest' or 'balanced'")
    a.indices = [] if a.bind in ("fastest", "balanced") else [int(x) for x in picks]
    a.variants = None
    if a.variants_arg is not None:
        names = a.variants_arg.split(",")
        if not all(x.isdigit() and int(x) < len(VARIANTS) for x in names):
            ap.error(f"--variants must be indices below {len(VARIANTS)} (comma-separated)")
        a.variants = {int(x) for x in names} | set(a.indices)  # the bound ones are exported too
    if a.out is None and not a.flashinfer_warm:
        ap.error("OUT_DIR is required")
    return a


def main() -> None:
    global TENSOR_CORES, CAPACITY, DEV
    a = parse()
    CAPACITY = a.capacity
    use_model(a.model)
    TENSOR_CORES = a.flashinfer_tensor_cores
    if a.flashinfer_warm:
        sys.exit(flashinfer_warm(a.flashinfer))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    contexts = [int(x) for x in a.contexts.split(",")]
    if a.flashinfer_rows:
        flashinfer_main(out, contexts, a.capacity, a.flashinfer)
        return
    parts = a.parts.split(",")
    only = a.variants if "kernel" in parts or not a.indices else set(a.indices)  # pipelines alone: the bound ones
    if a.export_only:
        DEV = "cpu"  # the receipts' ABI does not depend on the device (the GPU run checks it)
        export_only(out, a.capacity, a.variants)
        return
    given = Path(a.native) if a.native else None
    prebuilt = Path(a.prebuilt) if a.prebuilt else None
    if prebuilt and not (prebuilt / PREBUILT).is_file():
        sys.exit(f"attention_gpu.py: --prebuilt {prebuilt}: no {PREBUILT} there; make one with --export-only")
    native, slots, dsos = build(out, a.capacity, "pipelines" in parts, only, given, prebuilt)
    bound = {"variants": a.indices or [BIND]}

    def kernel_part() -> None:
        rows = kernel_times(out, dsos, contexts, a.capacity, a.rounds)
        if not a.no_flashinfer:
            flashinfer_child(out, a, timeout=max(60.0, min(300.0, a.budget - (time.monotonic() - START) - 30)))
        if a.bind in ("fastest", "balanced"):  # the pipelines bind the variant the kernel table chose
            bound["variants"] = [fastest(rows) if a.bind == "fastest" else balanced(rows)]
            emit(out, "bind", {"variant": list(VARIANTS)[bound["variants"][0]], "rule": a.bind})

    def pipelines_part() -> None:
        left = a.budget - (time.monotonic() - START)
        if left < PIPELINES_S:
            emit(
                out, "pipelines", f"skipped: {left:.0f} s of the {a.budget:.0f} s budget left, they need {PIPELINES_S}"
            )
            return
        chosen = [(list(VARIANTS)[i], *bind(out, slots, i)) for i in bound["variants"]]
        pipelines(out, native, chosen, contexts, a.steps)

    def timeline_part() -> None:
        timelines(out, dsos, contexts, a.capacity)

    for name, part in (("kernel", kernel_part), ("timeline", timeline_part), ("pipelines", pipelines_part)):
        if name not in parts:
            continue
        try:
            part()
        except Exception:  # noqa: BLE001 - report and go on: the other part's numbers still count
            print(f"[{name}] FAILED\n{traceback.format_exc()}", flush=True)
        torch.cuda.empty_cache()
    print(table(), flush=True)


if __name__ == "__main__":
    main()
