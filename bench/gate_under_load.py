"""Does the perf gate keep its word on a loaded 2-core machine? (issue 26, deliverable 2)

Builds demo:qwen3-tiny (fp32, CPU) native and slot-ready bundles and the identity-copy and slow-copy
kernels, starts its own load (`--load N` processes spinning on the CPU, as another job would, on top
of whatever else runs), then gates native vs identity-copy `--gates` times in a row and native vs
slow-copy `--gates` times with `mcore verify perf --pairs auto` (its default metric: on CPU each run's
fastest decode step) and prints every verdict. What must hold:

  identity-copy never flips between PROMOTE and REJECT (INCONCLUSIVE is allowed: on CPU its slot costs
                about 1% of a step, next to the 0.98 line)
  slow-copy     REJECTed every time (on CPU its step takes about twice as long)

    python3 bench/gate_under_load.py [OUT] [--gates 5] [--load 1] [--max-pairs 6] [--metric auto]
                                     [--tokens 64] [--runs 10] [--kernels identity-copy,slow-copy]

Prints the load average, each gate's verdict with its pairs and interval, and a last line saying
whether both held (exit 0) or not (exit 1). Every gate's full output is kept in OUT.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_ARGS = ["demo:qwen3-tiny", "--precision", "fp32", "--max-cache-length", "256", "--decoder-engine-layout", "split"]
BINDING = "qwen.decode_logits_copy@1"


def mcore(*args: str, log: Path) -> None:
    """One `mcore` command from this checkout; its output goes to `log`; a failure stops the bench."""
    with open(log, "a") as f:
        rc = subprocess.call([sys.executable, "-m", "mcore", *args], stdout=f, stderr=subprocess.STDOUT, env=ENV)
    if rc != 0:
        sys.exit(f"gate_under_load: `mcore {' '.join(args)}` failed ({rc}); see {log}")


def prepare(out: Path, kernels: list[str]) -> None:
    """The bundles, the kernels and a bindings manifest per kernel (what an earlier run left is reused)."""
    log = out / "build.log"
    if not (out / "native.bundle").exists():
        mcore("build", *BUILD_ARGS, "-o", str(out / "native.bundle"), log=log)
    if not (out / "slot.bundle").exists():
        mcore(
            "build",
            *BUILD_ARGS,
            "--recipe",
            BINDING,
            "decoder.logits_zero_bias",
            "-o",
            str(out / "slot.bundle"),
            log=log,
        )
    import json

    abi = json.loads((out / "slot.selection.json").read_text())["abi_sha256"]
    for k in kernels:
        (out / k).mkdir(exist_ok=True)
        mcore("kernel", "build", k, "-o", str(out / k / "kernel.so"), "--cuda", "off", "--force", log=log)
        entry = {"id": BINDING, "abi_sha256": abi, "library": "./kernel.so", "function": "run"}
        (out / k / "bindings.json").write_text(json.dumps({"schema_version": 1, "bindings": [entry]}) + "\n")


def bench_cmd(bundle: Path, bindings: Path | None, a: argparse.Namespace) -> str:
    cmd = [sys.executable, "-m", "mcore", "run", str(bundle), "--device", "cpu", "--prompt", "x y z"]
    cmd += ["--max-new-tokens", str(a.tokens), "--greedy", "--ignore-eos", "--warmup", "3", "--benchmark", str(a.runs)]
    if bindings is not None:
        cmd += ["--kernel-bindings", str(bindings)]
    return " ".join(shlex.quote(c) for c in cmd)


def gate(native: str, external: str, a: argparse.Namespace, log: Path) -> tuple[int, str, list[str]]:
    """`mcore verify perf` as a user runs it: (exit code, verdict line, pair ratios)."""
    argv = [sys.executable, "-m", "mcore", "verify", "perf", "--native", native, "--external", external]
    argv += ["--pairs", "auto", "--max-pairs", str(a.max_pairs), "--warmup", "0", "--metric", a.metric]
    p = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    log.write_text(p.stdout + p.stderr)
    lines = p.stdout.strip().splitlines()
    ratios = [m.group(1) for m in (re.search(r"ratio=([0-9.]+)", l) for l in lines if l.startswith("pair ")) if m]
    return p.returncode, (lines[-1] if lines else p.stderr.strip()), ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default="artifacts/gate-under-load")
    ap.add_argument("--gates", type=int, default=5, help="gates in a row per kernel (default 5)")
    ap.add_argument("--load", type=int, default=1, help="busy processes this bench starts (default 1)")
    ap.add_argument("--max-pairs", type=int, default=6, help="--pairs auto bound per gate (default 6)")
    ap.add_argument("--metric", default="auto", help="the gate's --metric (default auto: min-step on CPU)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per benchmark run (default 64)")
    ap.add_argument("--runs", type=int, default=10, help="benchmark runs per process (default 10)")
    ap.add_argument("--kernels", default="identity-copy,slow-copy")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    kernels = a.kernels.split(",")
    prepare(out, kernels)
    native = bench_cmd(out / "native.bundle", None, a)
    arms = {k: bench_cmd(out / "slot.bundle", out / k / "bindings.json", a) for k in kernels}
    for cmd in [native, *arms.values()]:  # one unmeasured run each: files cached, libraries loaded once
        subprocess.run(cmd, shell=True, capture_output=True, env=ENV)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    verdicts: dict[str, list[str]] = {k: [] for k in kernels}
    try:
        print(
            f"load: {a.load} busy process(es) started; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        for k in kernels:
            for i in range(a.gates):
                t0 = time.monotonic()
                rc, line, ratios = gate(native, arms[k], a, out / f"gate-{k}-{i + 1}.txt")
                word = line.split(":", 1)[0]
                verdicts[k].append(word)
                print(
                    f"{k} gate {i + 1}/{a.gates}: exit {rc}, {time.monotonic() - t0:.0f} s, pair ratios {' '.join(ratios)}"
                )
                print(f"  {line}", flush=True)
    finally:
        for p in load:
            p.kill()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    ok = True
    if "identity-copy" in verdicts:
        v = verdicts["identity-copy"]
        flips = "PROMOTE" in v and "REJECT" in v
        ok &= not flips and "FAIL" not in v
        print(f"identity-copy verdicts: {' '.join(v)} -> {'FLIPPED' if flips else 'never flips PROMOTE/REJECT'}")
    if "slow-copy" in verdicts:
        v = verdicts["slow-copy"]
        ok &= all(w == "REJECT" for w in v)
        print(f"slow-copy verdicts: {' '.join(v)} -> REJECTed {v.count('REJECT')}/{len(v)}")
    print(f"gate_under_load: {'both held' if ok else 'NOT held'}")
    return 0 if ok else 1


ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

if __name__ == "__main__":
    sys.exit(main())
